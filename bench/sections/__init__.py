"""The benchmark's sections, in the order `make bench` runs them.  Each is a
module of this package with

    TITLE: str                   its heading in RESULTS.md
    run(context) -> dict         measures (context: bench.context.Context); JSON-able
    report(data) -> list[str]    Markdown lines of what run returned

Adding a section: a module here, and its name in NAMES."""
from __future__ import annotations

import importlib

NAMES = ("workloads", "wgrad", "training", "experts", "sonic", "bias", "fp16", "cases", "fp8",
         "fp8_experts", "w4_experts", "vllm_fp8", "fp8_training", "fp8_moe_training",
         "fp8_convergence", "model", "expert_parallel", "proxy", "host")
SECTIONS = {name: importlib.import_module(f"{__name__}.{name}") for name in NAMES}
