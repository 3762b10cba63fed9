"""Run one workload's gg_runtime call a few times, for a profiler to attach to
(where the wheel is installed, e.g. PYTHONPATH=build/bench-site after make bench).

    ncu --kernel-name regex:ragged_m --launch-skip 2 --launch-count 1 \\
        python lab/profile_workload.py qwen3_down_128e_32k
"""
import json
import sys
from pathlib import Path

import torch

import gg_runtime
from gg_runtime.testing import moe_inputs

WORKLOADS = Path(__file__).resolve().parents[1] / "bench" / "workloads.json"
name = sys.argv[1]
w = next(w for w in json.loads(WORKLOADS.read_text())["workloads"]
         if w["name"] == name)
a, b, offs = moe_inputs(w["m"], w["N"], w["K"], getattr(torch, w["dtype"]))
for _ in range(4):
    gg_runtime.grouped_mm(a, b, offs)
torch.cuda.synchronize()
