"""gmm, megablocks' signature: values and gradients against float32 references,
with counts on the CPU (checked, copied) and on the GPU (no host sync)."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import (TOLERANCE, offsets_from_counts, randn, ref_grouped_mm,
                                ref_grouped_mm_grads, rel_error)

from conftest import gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
COUNTS = [17, 0, 130, 1, 52]


@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("count_dtype", [torch.int64, torch.int32])
def test_gmm_matches_grouped_mm(trans_b, device, count_dtype):
    k, n = 48, 40
    a = randn(sum(COUNTS), k, dtype=torch.bfloat16).requires_grad_()
    stored = randn(len(COUNTS), *((n, k) if trans_b else (k, n)), dtype=torch.bfloat16)
    stored.requires_grad_()
    out = gg_runtime.gmm(a, stored, torch.tensor(COUNTS, dtype=count_dtype, device=device),
                         trans_b=trans_b)
    b = stored.transpose(1, 2) if trans_b else stored
    offs = offsets_from_counts(COUNTS)
    assert rel_error(out, ref_grouped_mm(a, b, offs)) < TOLERANCE[torch.bfloat16]
    grad = randn(*out.shape, dtype=torch.bfloat16)
    out.backward(grad)
    grad_a, grad_b = ref_grouped_mm_grads(a, b, offs, grad)
    assert rel_error(a.grad, grad_a) < 2 * TOLERANCE[torch.bfloat16]
    assert stored.grad.stride() == stored.stride()
    assert rel_error(stored.grad, grad_b.transpose(1, 2) if trans_b else grad_b) < \
        2 * TOLERANCE[torch.bfloat16]


def test_gmm_checks_cpu_counts():
    a, b = randn(10, 16, dtype=torch.bfloat16), randn(2, 16, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="summing to a's 10 rows"):
        gg_runtime.gmm(a, b, torch.tensor([3, 4]))
    with pytest.raises(ValueError, match="counts >= 0"):
        gg_runtime.gmm(a, b, torch.tensor([12, -2]))
