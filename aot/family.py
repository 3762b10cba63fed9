"""The vocabulary of a kernel family description (aot/families/<name>.py).

A family is one Triton kernel and everything the build, the runtime and the
tests need to know about it: its runtime parameters in ABI order, each with a
type and a role; its axes, the named choices its variants differ by (each a
Choice: how an operand is stored, the gate/up arrangement, ...; aot/axes.py), and the
kernel's constexprs for each combination of their values; which variants have
a TMA flavour; how many tiles a call has (the grid) and how many rows a group
typically has (the tuned-table bucket key); conditions its configs may
require of a call (a kernel's correctness rule).  `make build` generates the
runtime's C++ tables and the operators' typed axes (an enum per Choice) from
these descriptions; csrc/ packs arguments by name and checks TMA's alignment
rules from the roles, and names no family.
"""
from __future__ import annotations

import ast
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from . import expr
from .axes import Choice, Where
from .kernels.ws import EPILOGUE_COLS

# '*T': pointer to the variant's input dtype, '*O': to its output dtype.
# Other pointer types are fixed (a bfloat16 bias beside an fp8 output, fp8
# weights beside 16-bit tokens, bytes of packed 4-bit weights and their scales).
TYPES = ("*T", "*O", "*fp8e4nv", "*u8", "*bf16", "*fp32", "*i32", "*i64", "i32", "i64")

# What the runtime does with a parameter of each role.
ROLES = {
    "operand": "pointer to an input the kernel reads (TMA: 16-byte aligned base)",
    "output": "pointer to the output the kernel writes (TMA: 16-byte aligned base)",
    "offsets": "pointer to int32 cumulative group end offsets, read on the GPU",
    "scale": "pointer to float32 scale factors the kernel reads",
    "bias": "pointer to values the epilogue adds, read only where the flag after it is 1",
    "flag": "0 or 1",
    "choice": "one of a Choice's values, as its code (the C++ enum's value; Choice.code)",
    "extent": "a size; must fit the parameter's type",
    "row_length": "a size (elements a row) that the TMA flavour reads in 16-byte copies (TMA: a "
                  "multiple of 16 bytes)",
    "stride": "an element stride (TMA: a positive multiple of 16 bytes)",
    "count": "the number of groups",
    "group_table": "int64 words per group (group_fields), copied to the GPU by the runtime",
    "tile_prefix": "int64 inclusive prefix of the groups' tile counts, made by the runtime",
}


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    role: str
    tma_limit: int = 0  # the TMA flavour needs value <= tma_limit (0: no limit)
    # The `aligned` flavour compiles this value as a multiple of 16 (bytes for a
    # pointer, elements for an int): vectorised loads; the runtime checks it.
    aligned: bool = False
    # The role "choice": the Choice whose code the parameter carries, a value
    # chosen at run time (where an Axis would compile a variant for each).
    choice: Choice | None = None

    def __post_init__(self):
        if (self.role == "choice") != (self.choice is not None) or (
                self.choice is not None and self.type != "i32"):
            raise ValueError(f"parameter {self.name}: the role 'choice' goes with a Choice "
                             "and the type i32")
        if self.type not in TYPES:
            raise ValueError(f"parameter {self.name}: type {self.type!r} is not one of {TYPES}")
        if self.role not in ROLES:
            raise ValueError(f"parameter {self.name}: role {self.role!r} is not one of "
                             f"{sorted(ROLES)}")


NO_AXES_KEY = "plain"  # the axes part of a variant key where the family has no axes


def no_constexprs(values: dict) -> dict:
    return {}


def no_staging(values: dict) -> None:
    return None


@dataclass(frozen=True)
class Config:
    """Tile shape and schedule.  `max_rows` bounds the rows per group this config
    is chosen for (the runtime takes the smallest bound that fits; 0 = no bound).
    `ws`: the family's warp-specialised Gluon kernel (Family.ws_kernel): a
    loader warp feeds a num_stages-deep ring to BM / (16 x num_warps) MMA
    partitions of num_warps warps each (aot/kernels/ws.py).  `ctas`: a `ws`
    kernel's program is a cluster of that many CTAs (2: Triton >= 3.8), each
    holding BM / ctas of the tile's rows, B's block multicast to all.
    `pingpong`: a `ws` kernel's two MMA partitions of num_warps warps take
    turns at whole BM x BN tiles, one's epilogue running while the other's
    MMAs do (Family.ws_kernel takes PINGPONG).  `when`: the name of one of
    the family's conditions (Family.conditions) that a call must meet for the
    dispatch to pick this config, as a kernel's correctness rule ('' = none).
    `max_registers`: ptxas's cap on a thread's registers for this config's
    variants (Family.max_registers' for one config; 0: the family's).
    `producers`: a `ws` kernel's warpgroups that feed its MMA partitions (the
    loader; the fp8 decode kernel's token quantizer too), which its register
    budget counts (aot/kernels/ws.py max_registers)."""
    BM: int
    BN: int
    BK: int
    num_warps: int
    num_stages: int
    max_rows: int = 0
    ws: bool = False
    ctas: int = 1
    pingpong: bool = False
    when: str = ""
    max_registers: int = 0
    producers: int = 1

    @property
    def tag(self) -> str:
        ws = "_ws" if self.ws else ""
        cluster = f"_c{self.ctas}" if self.ctas > 1 else ""
        pingpong = "_pp" if self.pingpong else ""
        producers = f"_p{self.producers}" if self.producers != 1 else ""
        when = f"_{self.when}" if self.when else ""
        registers = f"_r{self.max_registers}" if self.max_registers else ""
        return (f"{self.BM}x{self.BN}x{self.BK}_w{self.num_warps}_s{self.num_stages}"
                f"{ws}{cluster}{pingpong}{producers}{when}{registers}")

    def shared_estimate(self, dtype, out, tma: bool, ring_scales: bool = False,
                        weights=None, weight_rows: int = 0) -> int:
        """Shared memory of the pipeline as Triton 3.6 allocates it (measured),
        what configs are fitted by: TMA pipelines keep num_stages A and B tiles,
        the output tile a TMA store stages (the `ws` kernel at most
        EPILOGUE_COLS columns of it at a time) and, for tf32x3, one more A tile
        (its split into high and low parts); sm80's cp.async pipelines keep
        num_stages - 1 tiles (sm90's non-TMA kernels up to twice that: far
        below its limit; the build refuses any variant over it), or, where
        more, the output tile (an epilogue converting the accumulator's
        layout through shared memory for a column-major output: 8 warps'
        128 x 128 float32 tiles do).  ring_scales:
        a `ws` kernel's ring also holds each stage's float32 scales of the
        tile's rows and columns (Family.ring_scales).  dtype, out and weights
        (the BN side's tiles' type where not dtype, Family.weights):
        aot/variants.py DTypes; weight_rows: that side's rows a stage where
        not BN (Family.weight_rows)."""
        rows = self.BM // self.ctas  # a CTA's
        tiles = (rows * dtype.bytes + (weight_rows or self.BN) * (weights or dtype).bytes) * self.BK
        if not tma:
            return max(max(self.num_stages - 1, 1) * tiles, rows * self.BN * out.bytes)
        split = rows * self.BK * dtype.bytes if dtype.precision == "tf32x3" else 0
        out_cols = min(self.BN, EPILOGUE_COLS) if self.ws else self.BN
        if self.ws and ring_scales:
            tiles += (rows + self.BN) * 4
        # A pingpong kernel's two partitions stage whole tiles of their own.
        staged = 2 * rows if self.pingpong else rows
        return self.num_stages * tiles + split + staged * out_cols * out.bytes


@dataclass(frozen=True)
class Family:
    """One kernel family.  Exactly one of `tiles` (a call's tile count, from the
    parameters) and `group_tiles` (one group's, from its group fields; the
    call's is their sum) is given, and likewise `rows` / `group_rows`: rows
    per group for the tuned-table bucket (group_rows: averaged over the groups
    that have tiles).  Expressions are in aot/expr.py's language."""
    name: str
    kernel: object  # a triton.jit function
    params: tuple  # Param, in the kernel's declaration order
    # The axes its variants differ by, in key order (the first the most
    # significant digit of the variant's code, family_args.h); () = one variant.
    axes: tuple = ()
    # The kernel's constexprs for a variant's axis values ({axis name: value}).
    constexprs: Callable[[dict], dict] = no_constexprs
    # The variants that get a `tma` flavour where the arch has TMA, and an
    # `aligned` one where it has no `tma`; None: none.
    tma: Where | None = None
    aligned: Where | None = None
    # Variants compiled only for archs with TMA, the only loads that read them
    # well (the runtime copies such operands elsewhere); None: none.
    tma_only: Where | None = None
    tiles: str = ""
    rows: str = ""
    group_fields: tuple = ()  # Param, in group-table word order
    group_tiles: str = ""
    group_rows: str = ""
    dtype_constexpr: bool = False  # the kernel takes DTYPE (its pointers are untyped)
    # Names of the input dtypes (aot/variants.py) compiled; () = all but the opt-in ones.
    dtypes: tuple = ()
    float32_output: bool = False  # 16-bit inputs may also write a float32 output ('*O')
    out_dtypes: tuple = ()  # output dtype names for every input; () = see float32_output
    archs: tuple = ()  # the archs (80, 90, ...) compiled; () = all of aot/variants.py's
    basic: bool = True  # compile the `basic` flavour (any alignment); False: inputs
    #                     must meet another flavour's rule, which the Python API checks
    # (arch, flavour) or (arch, flavour, Where) -> Configs, in place of
    # aot/variants.py's defaults for GEMMs (an entry whose Where holds first).
    configs: dict = field(default_factory=dict)
    # A Gluon kernel with `kernel`'s parameters, run by the `ws` configs of the
    # TMA flavour (16-bit and fp8 inputs); None: the family has none.
    ws_kernel: object = None
    # Its ws_kernel's ring holds each K block's float32 scales of the tile's
    # rows and columns beside the tiles (Config.shared_estimate counts them).
    ring_scales: bool = False
    # The element type (a DTypes name) a variant's ws kernel stages its
    # output tiles in, for its axis values ({axis name: value}), where wider
    # than its output's (Config.shared_estimate counts it); None: the output's.
    staged: Callable[[dict], str | None] = no_staging
    # The element type (a DTypes name) of the BN side's tiles (the weights),
    # where not the variant's input dtype (the decode kernels' fp8 weights
    # beside 16-bit tokens); "": the input's.
    weights: str = ""
    # The weights' rows a pipeline stage where they are not BN (0: BN); for
    # a kernel whose BN sizes something else (Config.shared_estimate).
    weight_rows: int = 0
    # The kernel uses no instruction sm80 lacks (no MMA, TMA or fp8): a later
    # arch's variant is ptxas's code for that arch from its sm80 twin's PTX,
    # not compiled again (aot/compile.py; make build's time).
    sm80_ptx: bool = False
    # ptxas's cap on a thread's registers (maxnreg) for `kernel`; 0: ptxas's
    # choice.  A memory-bound kernel that ptxas gives more registers than it
    # needs keeps fewer programs, so fewer loads, in flight on an SM.
    max_registers: int = 0
    # Integer constants the family's operator needs (a scratch size, a limit),
    # emitted into its generated C++ struct (family_args.h) under these names.
    constants: dict = field(default_factory=dict)
    # Named conditions on a call's parameters (aot/expr.py, nonzero = holds;
    # no tile sizes) that configs may require (Config.when): what a kernel
    # needs beyond the flavours' alignment rules.  Per-call families only.
    conditions: dict = field(default_factory=dict)
    # Constexprs of the configs that need a condition ({condition: {name:
    # value}}): a kernel compiled for the calls that meet it.
    when_constexprs: dict = field(default_factory=dict)

    def __post_init__(self):
        self._check_abi()
        self._check_axes()
        self._check_expressions()

    @property
    def axis_names(self) -> tuple:
        return tuple(axis.name for axis in self.axes)

    def axis_values(self) -> list:
        """Every combination of the axes' values, as tuples in axis order (the
        first axis varying slowest): one variant each per dtype, flavour and config."""
        return list(itertools.product(*(axis.values for axis in self.axes)))

    def named(self, values: tuple) -> dict:
        """{axis name: value} of axis values in axis order."""
        return dict(zip(self.axis_names, values))

    def ordered(self, named: dict) -> tuple:
        """Axis values in axis order from {axis name: value}, which names every axis."""
        if set(named) != set(self.axis_names):
            raise ValueError(f"family {self.name}: axes {sorted(named)} are not "
                             f"{list(self.axis_names)}")
        return tuple(named[name] for name in self.axis_names)

    def code(self, values: tuple) -> int:
        """The variant's index among axis_values(): the mixed-radix number the
        generated C++ computes from an Axes struct (family_args.h code())."""
        code = 0
        for axis, value in zip(self.axes, values):
            code = code * len(axis.choice.values) + axis.choice.values.index(value)
        return code

    def axes_key(self, values: tuple) -> str:
        """The axes' part of a variant key: the values joined by '-'."""
        return "-".join(values) if values else NO_AXES_KEY

    def own_configs(self, arch: int, flavour: str, values: tuple):
        """The family's configs for a variant, or None where it gives none."""
        named = self.named(values)
        for key, configs in self.configs.items():
            if key[:2] == (arch, flavour) and len(key) == 3 and key[2].holds(named):
                return configs
        return self.configs.get((arch, flavour))

    @property
    def has_group_table(self) -> bool:
        return bool(self.group_fields)

    @property
    def takes_clusters(self) -> bool:
        """Whether ws_kernel runs as a cluster of CTAs (it takes CTAS: Config.ctas)."""
        return self._ws_takes("CTAS")

    @property
    def takes_pingpong(self) -> bool:
        """Whether ws_kernel's MMA partitions can take turns at tiles (it takes
        PINGPONG: Config.pingpong)."""
        return self._ws_takes("PINGPONG")

    def _ws_takes(self, constexpr: str) -> bool:
        return self.ws_kernel is not None and any(
            p.name == constexpr for p in self.ws_kernel.params if p.is_constexpr)

    def runtime_params(self) -> list:
        """The kernel's non-constexpr parameters, in declaration order."""
        return [p.name for p in self.kernel.params if not p.is_constexpr]

    def signature(self, short_dtype: str, short_out: str) -> dict:
        return {p.name: p.type.replace("*T", f"*{short_dtype}").replace("*O", f"*{short_out}")
                for p in self.params}

    def _check_abi(self):
        """The description lists the kernel's parameters by name in order, so a
        swapped pair (two int64 strides, say) fails here, at build time."""
        described = [p.name for p in self.params]
        for kernel in filter(None, (self.kernel, self.ws_kernel)):
            declared = [p.name for p in kernel.params if not p.is_constexpr]
            if described != declared:
                raise ValueError(f"family {self.name}: parameters {described} do not match "
                                 f"{kernel.__name__}'s runtime parameters {declared} (names "
                                 "and order)")
        roles = [p.role for p in self.params]
        if self.has_group_table != ("group_table" in roles):
            raise ValueError(f"family {self.name}: group_fields and a group_table parameter "
                             "go together")

    def _check_axes(self):
        """Axis names are unique, conditions name their values, and each
        combination's constexprs are the kernel's (a misspelt one fails here)."""
        if len(set(self.axis_names)) != len(self.axes):
            raise ValueError(f"family {self.name}: axes {self.axis_names} repeat a name")
        wheres = [self.tma, self.aligned, self.tma_only] + [k[2] for k in self.configs
                                                            if len(k) == 3]
        for where in filter(None, wheres):
            if not isinstance(where, Where):
                raise ValueError(f"family {self.name}: {where!r} is no Where (a condition on "
                                 "axis values)")
            where.check(self.name, self.axes)
        declared = self._constexpr_names()
        for values in self.axis_values():
            unknown = set(self.constexprs(self.named(values))) - declared
            if unknown:
                raise ValueError(f"family {self.name}: constexprs {sorted(unknown)} of "
                                 f"{self.named(values)} are not the kernel's")

    def _constexpr_names(self) -> set:
        """The constexpr parameters of the family's kernels (Triton's and Gluon's)."""
        return {p.name for k in filter(None, (self.kernel, self.ws_kernel))
                for p in k.params if p.is_constexpr}

    def _check_expressions(self):
        per_call = bool(self.tiles) and bool(self.rows)
        per_group = bool(self.group_tiles) and bool(self.group_rows)
        if per_call == per_group or per_group != self.has_group_table:
            raise ValueError(f"family {self.name}: give tiles and rows, or (with a group table) "
                             "group_tiles and group_rows")
        names = [p.name for p in (self.group_fields if per_group else self.params)]
        for text in (self.tiles, self.rows, self.group_tiles, self.group_rows):
            if text:
                expr.to_cpp(text, names)  # raises ExprError naming the problem
        if self.conditions and per_group:
            raise ValueError(f"family {self.name}: conditions are on a call's parameters, "
                             "not a group table's")
        if len(self.conditions) > 32:  # the runtime's mask of those a call meets
            raise ValueError(f"family {self.name}: at most 32 conditions")
        for text in self.conditions.values():
            expr.to_cpp(text, [p.name for p in self.params])  # no BM, BN, BK: see above
            if expr.TILE_NAMES.keys() & {node.id for node in ast.walk(ast.parse(text))
                                         if isinstance(node, ast.Name)}:
                raise ValueError(f"family {self.name}: condition {text!r} names a tile size")
        for configs in self.configs.values():
            for config in configs:
                self.check_when(config)
        for when, values in self.when_constexprs.items():
            if when not in self.conditions or not set(values) <= self._constexpr_names():
                raise ValueError(f"family {self.name}: when_constexprs[{when!r}] = {values} "
                                 "needs a declared condition and the kernel's constexprs")

    def check_when(self, config: Config):
        """A ValueError unless config.when is '' or one of the family's conditions."""
        if config.when and config.when not in self.conditions:
            raise ValueError(f"family {self.name}: config {config.tag} needs condition "
                             f"{config.when!r}, which the family does not declare "
                             f"({sorted(self.conditions)})")
