"""Expert parallelism over two GPUs (examples/expert_parallel.py, run with two
processes through torch.distributed.run): forward and gradients equal the
single-GPU layer's."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "expert_parallel.py"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_expert_parallel_matches_one_gpu():
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          str(EXAMPLE)], capture_output=True, text=True, timeout=300)
    lines = [line for line in out.stdout.splitlines() if line.startswith("rank ")]
    assert out.returncode == 0 and len(lines) == 2, out.stdout + out.stderr
    assert all(": ok " in line for line in lines), lines
