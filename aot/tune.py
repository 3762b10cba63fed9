"""`python -m aot tune`: measure candidate configs on this GPU, write aot/tuning/sm90.json.

Runs on a GPU machine with torch and triton.  Each candidate is compiled
exactly as `aot build` compiles it (compile_variant) and launched through
Triton's own launcher on the same persistent grid the runtime uses, on MoE
problems (ragged M) whose rows per group span the buckets below.  The winner
of each bucket becomes a config with that bucket's `max_rows`; `make build`
then compiles those configs for every sm90 `tma` family.

The problems and the timer are gg_runtime.testing's, so the wheel must come
first on the path, before the source folder gg_runtime/ (which has no
extensions), and the current directory must not be the repository root
(Python puts it first): after `make bench-site`,

    cd build && PYTHONPATH=bench-site:.. python -m aot tune
"""
from __future__ import annotations

import json
from dataclasses import asdict

from . import expr
from .compile import compile_variant
from .families import FAMILIES
from .variants import TUNING_DIR, Config, Variant

# Rows per group that bound each bucket (0 = no bound) and a problem for it:
# (tokens, experts, N, K) as in typical MoE layers.
BUCKETS = (
    (32, (256, 64, 1024, 4096)),  # decode: a few tokens per expert, memory-bound
    (384, (32768, 128, 1536, 2048)),
    (0, (16384, 16, 4096, 4096)),
)
CANDIDATES = (
    Config(64, 64, 64, 4, 4), Config(64, 64, 128, 4, 4), Config(64, 128, 128, 4, 3),
    Config(64, 128, 64, 4, 4), Config(64, 128, 64, 4, 3), Config(64, 256, 64, 8, 3),
    Config(64, 256, 64, 4, 4), Config(64, 256, 64, 4, 3),
    # Two programs per SM (<= ~113 KiB of shared memory each): one's epilogue
    # overlaps the other's main loop.
    Config(128, 128, 64, 4, 2), Config(64, 256, 64, 4, 2), Config(64, 128, 64, 4, 2),
    Config(128, 128, 64, 8, 4), Config(128, 128, 64, 8, 3), Config(128, 128, 64, 4, 3),
    Config(128, 128, 64, 8, 2), Config(128, 256, 64, 8, 3), Config(128, 256, 64, 8, 2),
    Config(128, 128, 128, 8, 2), Config(256, 128, 64, 8, 3),
    # The warp-specialised kernel (families with a ws_kernel, 16-bit inputs).
    Config(128, 256, 64, 8, 4, ws=True), Config(128, 128, 64, 8, 5, ws=True),
    Config(64, 256, 64, 4, 5, ws=True), Config(64, 128, 64, 4, 6, ws=True),
)
FAMILY = FAMILIES["ragged_m"]
# The forward's product: the tokens times the nn.Linear weight viewed transposed.
FORWARD = FAMILY.ordered({"a_major": "row", "b_major": "column", "c_major": "row"})


def _testing():
    """gg_runtime.testing (inputs, timer), imported here: it needs torch, which
    `aot build`'s environment has not."""
    import gg_runtime.testing
    return gg_runtime.testing


def _programs(compiled, props, tiles):
    """One resident wave at most, as csrc/run.cc launches: SMs x blocks per SM."""
    compiled._init_handles()
    threads = 32 * compiled.metadata.num_warps
    by_shared = props.shared_memory_per_multiprocessor // max(compiled.metadata.shared, 1)
    by_regs = 65536 // max(compiled.n_regs * threads, 1)
    return min(tiles, props.multi_processor_count * max(1, min(by_shared, by_regs)))


def _time_config(config, problem, dtype_name, props, testing):
    import torch
    tokens, experts, n, k = problem
    variant = Variant(FAMILY.name, 90, dtype_name, FORWARD, "tma", config)
    compiled = compile_variant(variant).kernel
    counts = testing.skewed_counts(tokens, experts)
    a, b, offs = testing.moe_inputs(counts, n, k, getattr(torch, dtype_name))
    c = torch.empty(tokens, n, device="cuda", dtype=a.dtype)
    args = dict(a_ptr=a, b_ptr=b, c_ptr=c, offs_ptr=offs, T=tokens, N=n, K=k, G=experts,
                lda=a.stride(0), b_group_stride=b.stride(0), ldb=b.stride(2), ldc=c.stride(0))
    sizes = {name: v for name, v in args.items() if isinstance(v, int)}
    block = {"BM": config.BM, "BN": config.BN, "BK": config.BK}
    tiles = expr.evaluate(FAMILY.tiles, {**sizes, **block})
    run = compiled[(_programs(compiled, props, tiles), 1, 1)]
    # Triton's launcher takes every argument in declaration order, constexprs too (it skips them).
    constexprs = variant.constexprs()
    kernel = FAMILY.ws_kernel if config.ws else FAMILY.kernel
    ordered = [args[p.name] for p in FAMILY.params]
    ordered += [constexprs[name] for name in kernel.arg_names if name in constexprs]
    ms = testing.time_ms(lambda: run(*ordered))
    return 2 * tokens * n * k / ms / 1e9


def tune(dtype_name: str = "bfloat16", echo=print) -> dict:
    import torch
    import triton

    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    props = torch.cuda.get_device_properties(0)
    if (props.major, props.minor) != (9, 0):
        raise RuntimeError(f"tuning writes sm90.json and needs a 9.0 GPU, not {props.name}")
    testing = _testing()
    winners, report = [], {}
    for max_rows, problem in BUCKETS:
        scores = {}
        for config in CANDIDATES:
            try:
                scores[config] = _time_config(config, problem, dtype_name, props, testing)
            except Exception as exc:  # a config that does not fit is skipped, and said
                echo(f"  {config.tag}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
                continue
            echo(f"  rows<={max_rows or 'inf'} {problem}: {config.tag} "
                 f"{scores[config]:.0f} TFLOP/s")
        if not scores:
            raise RuntimeError(f"no candidate config ran for rows<={max_rows}")
        best = max(scores, key=scores.get)
        winners.append(Config(**{**asdict(best), "max_rows": max_rows}))
        report[str(max_rows)] = {c.tag: round(s, 1) for c, s in scores.items()}
        echo(f"bucket rows<={max_rows or 'inf'}: {best.tag}")
    entries = [asdict(w) for w in _merge_repeats(winners)]
    # For the GEMM families that take aot/variants.py's defaults (not those with
    # configs of their own; where a `ws` config cannot run, its tiles run
    # without warp specialisation: aot/variants.py).
    table = {name: {"tma": entries} for name, family in FAMILIES.items() if not family.configs}
    table["measured"] = {"device": props.name, "dtype": dtype_name, "tflops": report}
    return table


def _merge_repeats(winners: list) -> list:
    """A config that wins neighbouring buckets is one entry with the larger bound."""
    merged = []
    for config in winners:
        if merged and merged[-1].tag == config.tag:
            merged[-1] = config
        else:
            merged.append(config)
    return merged


def write_table(table: dict) -> str:
    TUNING_DIR.mkdir(exist_ok=True)
    path = TUNING_DIR / "sm90.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    return str(path)
