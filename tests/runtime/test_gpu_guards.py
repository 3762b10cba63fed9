"""The guard regions of gg_runtime.testing.guarded (which the `poison` fixture
sets for every GPU test that takes it): a write just past an output's end or
just before its start fails the check; an operator's own writes do not."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import guarded, offsets_from_counts, randn

from conftest import gpu

pytestmark = gpu


def small_product():
    a = randn(100, 32, dtype=torch.bfloat16)
    b = randn(3, 32, 48, dtype=torch.bfloat16)
    return a, b, offsets_from_counts([30, 0, 70])


def stray_write(out: torch.Tensor, element: int):
    """Writes out's storage at `element` counted from out's first (-1: the
    one before it, out.numel(): the one after its last)."""
    torch.as_strided(out, (1,), (1,), out.storage_offset() + element).fill_(1.0)


@pytest.mark.parametrize("element", [-1, "end"])
def test_a_write_outside_an_output_fails_the_check(element):
    expected = r"\(100, 48\) torch.bfloat16: 2 guard bytes"
    with pytest.raises(AssertionError, match=expected), guarded():
        out = gg_runtime.grouped_mm(*small_product())
        stray_write(out, out.numel() if element == "end" else element)


def test_operators_leave_the_guards_alone():
    with guarded():
        out = gg_runtime.grouped_mm(*small_product())
        stray_write(out, out.numel() - 1)  # its own last element
        x = randn(300, 64, dtype=torch.bfloat16)
        weights, ids = torch.rand(300, 16, device="cuda").topk(4, dim=-1)
        w13 = randn(16, 2 * 48, 64, dtype=torch.bfloat16, scale=0.1)
        w2 = randn(16, 64, 48, dtype=torch.bfloat16, scale=0.1)
        gg_runtime.moe_experts(x, ids, weights, w13, w2)

