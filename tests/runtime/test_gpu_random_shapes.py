"""grouped_mm on seeded random problems: each of its four cases (ragged M, K
and N, batched), bfloat16, float16 and float32 inputs, out_dtype None or
float32, each operand row- or column-major and dense or strided, sizes that
are multiples of no tile (and, half the time, of no 16 bytes: the `basic`
kernels), empty groups, 1 to 1,200 groups, and groups of up to ~1,500 rows
(the warp-specialised kernels' bucket).  Each group's part of the output is
checked on its own against a float64 reference (a wrong small group cannot
hide in a large one's norm); outputs start as NaN, so unwritten parts show.
A failure names its seed and problem; `-k "seed_17"` runs it again."""
import random

import pytest
import torch

import gg_runtime
from gg_runtime.testing import (group_parts, last_variant, operand, random_group_sizes, rel_error,
                                tf32_allowed, tolerance)

from conftest import gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
SEEDS = 64
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CASES = ("ragged_m", "ragged_k", "ragged_n", "batched")


def extent(rng: random.Random, aligned: bool, largest: int) -> int:
    """A size in 1..largest: a multiple of 8 (16 bytes at 16 bits) or any."""
    size = rng.randint(1, largest)
    return max(8, size // 8 * 8) if aligned else size


def draw(seed: int) -> dict:
    rng = random.Random(seed)
    dtype = rng.choice(DTYPES)
    aligned = rng.random() < 0.5
    return {"case": rng.choice(CASES), "dtype": dtype,
            "out_dtype": torch.float32 if dtype != torch.float32 and rng.random() < 0.3 else None,
            "sizes": random_group_sizes(rng), "m": extent(rng, aligned, 600),
            "n": extent(rng, aligned, 600), "k": extent(rng, aligned, 900),
            "a_row_major": rng.random() < 0.5, "b_row_major": rng.random() < 0.5,
            "strided": rng.random() < 0.3}


def inputs(p: dict):
    """(a, b, offs) of the drawn problem: the ragged dimension is sum(sizes);
    batched takes up to 8 of the groups, m rows each."""
    sizes, m, n, k = p["sizes"], p["m"], p["n"], p["k"]
    groups, total = len(sizes), sum(sizes)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    shapes = {"ragged_m": ((total, k), (groups, k, n)), "ragged_k": ((m, total), (total, n)),
              "ragged_n": ((groups, m, k), (k, total)),
              "batched": ((min(groups, 8), m, k), (min(groups, 8), k, n))}[p["case"]]
    a = operand(shapes[0], p["a_row_major"], p["strided"], p["dtype"])
    b = operand(shapes[1], p["b_row_major"], p["strided"], p["dtype"])
    return a, b, (None if p["case"] == "batched" else offs)


@pytest.mark.parametrize("seed", range(SEEDS), ids=[f"seed_{s}" for s in range(SEEDS)])
def test_random_problem(seed):
    p = draw(seed)
    a, b, offs = inputs(p)
    with tf32_allowed(False):  # float32: tf32x3, float32's own error
        out = gg_runtime.grouped_mm(a, b, offs, out_dtype=p["out_dtype"])
    torch.cuda.synchronize()
    sizes = p["sizes"]
    problem = {**p, "sizes": f"{len(sizes)} groups, {sum(sizes)} in all, largest {max(sizes)}"}
    where = f"{problem} ran {last_variant()}"
    assert out.dtype == (p["out_dtype"] or p["dtype"]), where
    allowed = 2 * tolerance(p["dtype"], p["out_dtype"])
    for group, got, want in group_parts(a, b, offs, out):
        if got.numel():
            assert rel_error(got, want) < allowed, f"group {group} of {where}"
