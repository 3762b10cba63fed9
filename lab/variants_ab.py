"""Every compiled ragged_m variant the dispatch could pick for a problem, each
forced and timed against torch._grouped_mm, on the ragged workloads of
bench/workloads.json, with b as the transposed nn.Linear weight ('nt': the
forward) and as stored ('nn': the token gradient).  What to read before
changing aot/tuning/sm90.json's buckets.

    python lab/variants_ab.py [--filter SUBSTRING] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from gg_runtime import _C
from gg_runtime.testing import forced, last_variant, moe_inputs, ref_grouped_mm, rel_error, time_ms

WORKLOADS = Path(__file__).resolve().parents[1] / "bench" / "workloads.json"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# The ragged_m variants' axes for each b: the transposed nn.Linear weight, or as stored.
AXES = {"nt": {"a_major": "row", "b_major": "column", "c_major": "row"},
        "nn": {"a_major": "row", "b_major": "row", "c_major": "row"}}


def candidates(dtype: str, layout: str, arch: int, pattern: str) -> list:
    return [v["key"] for v in _C.variants()
            if v["family"] == "ragged_m" and v["arch"] == arch and v["flavour"] == "tma"
            and v["dtype"] == dtype and v["out_dtype"] == dtype and v["axes"] == AXES[layout]
            and pattern in v["key"]]


def bench(w, layout: str, arch: int, pattern: str) -> dict:
    dtype = DTYPES[w["dtype"]]
    a, b, offs = moe_inputs(w["m"], w["N"], w["K"], dtype)
    if layout == "nn":
        b = b.contiguous()
    ref = ref_grouped_mm(a, b, offs)
    torch_ms = time_ms(lambda: torch._grouped_mm(a, b, offs))
    row = {"name": w["name"], "layout": layout, "torch_ms": torch_ms, "variants": {}}
    for key in candidates(w["dtype"], layout, arch, pattern):
        with forced(variant=key):
            out = _C_grouped_mm(a, b, offs)
            assert last_variant() == key, (last_variant(), key)
            error = rel_error(out, ref)
            ms = time_ms(lambda: _C_grouped_mm(a, b, offs))
        row["variants"][key.rsplit(".", 1)[1]] = {"ms": ms, "vs_torch": torch_ms / ms,
                                                  "rel_error": error}
    return row


def _C_grouped_mm(a, b, offs):
    return torch.ops.gg_runtime.grouped_mm.default(a, b, offs, None, None, False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="only variant keys containing this")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    major, minor = torch.cuda.get_device_capability()
    arch = 10 * major + minor
    workloads = json.loads(WORKLOADS.read_text())["workloads"]
    rows = [bench(w, layout, arch, args.filter) for w in workloads if w["layout"] == "ragged"
            for layout in ("nt", "nn")]
    print(f"{torch.cuda.get_device_name()}: ms of torch._grouped_mm, then x = its time / each "
          "variant's")
    for r in rows:
        cells = "  ".join(f"{tag} {v['vs_torch']:.2f}x" for tag, v in r["variants"].items())
        print(f"{r['name']:<34} {r['layout']} {r['torch_ms']:8.3f}  {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
