"""Integer size expressions of a family description (grid size, bucket key),
evaluated in Python (`aot tune`) and translated to C++ for the runtime, so
that both sides run the one formula the description states.

The language is a small subset of Python over non-negative int64 values:
names (kernel parameters, group fields, and BM / BN / BK of the variant's
tile), integer literals, + - * //, cdiv(a, b), max(a, b), min(a, b),
comparisons, `and` / `or` and `x if cond else y`.
"""
from __future__ import annotations

import ast

TILE_NAMES = {"BM": "k.block_m", "BN": "k.block_n", "BK": "k.block_k"}
_FUNCTIONS = {"cdiv": "cdiv", "max": "std::max<int64_t>", "min": "std::min<int64_t>"}
_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/"}
_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_BOOL = {ast.And: "&&", ast.Or: "||"}


class ExprError(ValueError):
    """An expression outside the language above, or naming an unknown value."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def evaluate(expr: str, values: dict) -> int:
    """The expression's value for `values` (names -> ints)."""
    return int(eval(compile(ast.parse(expr, mode="eval"), expr, "eval"),
                    {"__builtins__": {}, "cdiv": _cdiv, "max": max, "min": min}, dict(values)))


def to_cpp(expr: str, names: list) -> str:
    """C++ for `expr`, reading name i of `names` as v[i] and BM / BN / BK from
    the KernelInfo `k`.  Raises ExprError for anything outside the language."""
    index = {name: i for i, name in enumerate(names)}

    def emit(node) -> str:
        if isinstance(node, ast.Expression):
            return emit(node.body)
        if isinstance(node, ast.Name):
            if node.id in index:
                return f"v[{index[node.id]}]"
            if node.id in TILE_NAMES:
                return f"int64_t{{{TILE_NAMES[node.id]}}}"
            raise ExprError(f"{expr!r}: unknown name {node.id!r} (known: {sorted(index)})")
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return f"int64_t{{{node.value}}}"
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return f"({emit(node.left)} {_BINARY[type(node.op)]} {emit(node.right)})"
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return f"({emit(node.left)} {_COMPARE[type(node.ops[0])]} {emit(node.comparators[0])})"
        if isinstance(node, ast.BoolOp) and type(node.op) in _BOOL:
            return "(" + f" {_BOOL[type(node.op)]} ".join(emit(v) for v in node.values) + ")"
        if isinstance(node, ast.IfExp):
            return f"({emit(node.test)} ? {emit(node.body)} : {emit(node.orelse)})"
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in _FUNCTIONS and len(node.args) == 2 and not node.keywords):
            return f"{_FUNCTIONS[node.func.id]}({emit(node.args[0])}, {emit(node.args[1])})"
        raise ExprError(f"{expr!r}: {ast.dump(node)[:60]} is outside the size-expression language")

    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"{expr!r}: {exc}") from exc
    return emit(tree)
