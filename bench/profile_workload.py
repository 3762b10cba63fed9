"""Run one workload's gg_runtime call a few times, for a profiler to attach to.

    ncu --kernel-name regex:ragged_m --launch-skip 2 --launch-count 1 \\
        python bench/profile_workload.py qwen3_down_128e_32k
"""
import json
import sys
from pathlib import Path

import torch

import gg_runtime

HERE = Path(__file__).resolve().parent
name = sys.argv[1]
w = next(w for w in json.loads((HERE / "workloads.json").read_text())["workloads"]
         if w["name"] == name)
dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16}[w["dtype"]]
counts, n, k = w["m"], w["N"], w["K"]
a = torch.randn(sum(counts), k, device="cuda").to(dtype)
b = (torch.randn(len(counts), n, k, device="cuda") * k ** -0.5).to(dtype).transpose(1, 2)
offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
for _ in range(4):
    gg_runtime.grouped_mm(a, b, offs)
torch.cuda.synchronize()
