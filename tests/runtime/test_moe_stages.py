"""The MoE stages gg_runtime.moe.route and combine on CPU: their checks, and
combine's autograd in float64 with its operators stood in for by references
(route and combine as their contracts say, moe_reference.py), against
torch's autograd through the reference.  The kernels themselves are checked
on the GPU (test_gpu_moe_stages.py)."""
from types import SimpleNamespace

import pytest
import torch

import gg_runtime.moe.stages
from gg_runtime.moe import Routing, combine, route
from moe_reference import combine_ref, route_by_sort


@pytest.fixture
def reference_ops(monkeypatch):
    ops = SimpleNamespace(route=SimpleNamespace(default=route_by_sort),
                          combine=SimpleNamespace(default=combine_ref))
    monkeypatch.setattr(gg_runtime.moe.stages, "OPS", ops)


def routed(tokens, k, experts, extra_rows=0):
    """Ids with duplicates and dropped slots (-1 and >= experts), their
    routing, rows [slots + extra_rows, 24] and weights, float64."""
    ids = torch.randint(-1, experts + 2, (tokens, k))
    routing = route(ids, experts)
    rows = torch.randn(tokens * k + extra_rows, 24, dtype=torch.float64)
    weights = torch.rand(tokens, k, dtype=torch.float64)
    return ids, routing, rows, weights


@pytest.mark.usefixtures("reference_ops")
@pytest.mark.parametrize("tokens, k, experts, extra_rows", [
    (7, 2, 4, 0), (33, 4, 8, 5), (1, 1, 1, 0), (0, 3, 4, 0), (12, 3, 0, 0)])
def test_combine_gradients_match_the_reference(tokens, k, experts, extra_rows):
    ids, routing, rows, weights = routed(tokens, k, experts, extra_rows)
    rows.requires_grad_()
    weights.requires_grad_()
    out = combine(rows, routing, weights)
    grad = torch.randn_like(out)
    out.backward(grad)
    mine = rows.grad, weights.grad
    rows.grad = weights.grad = None
    # The reference: each slot's row picked through the inverse permutation.
    kept = (ids >= 0) & (ids < experts)
    index = routing.inverse.clamp(max=max(rows.shape[0] - 1, 0))
    picked = rows[index].view(tokens, k, rows.shape[1])
    want = (torch.where(kept, weights, 0)[..., None] * picked).sum(1)
    torch.testing.assert_close(out, want.detach())
    want.backward(grad)
    torch.testing.assert_close(mine[0], rows.grad)
    torch.testing.assert_close(mine[1], weights.grad)


@pytest.mark.usefixtures("reference_ops")
def test_route_sorts_slots_by_expert_dropped_last():
    ids = torch.tensor([[2, 0], [5, 2], [-1, 1]])
    order, offs, inverse = route(ids, 3)
    assert order.tolist() == [1, 5, 0, 3, 2, 4]
    assert offs.tolist() == [1, 2, 4]
    assert order[inverse].tolist() == list(range(6))


def test_route_names_its_bad_arguments():
    with pytest.raises(TypeError, match="topk_ids"):
        route([[0, 1]], 2)
    with pytest.raises(TypeError, match="num_experts"):
        route(torch.zeros(2, 2, dtype=torch.long), 2.0)
    with pytest.raises(TypeError, match="topk_ids must be int32 or int64"):
        route(torch.zeros(2, 2), 2)
    with pytest.raises(ValueError, match="topk_ids must be 2-D"):
        route(torch.zeros(4, dtype=torch.long), 2)


def test_combine_names_its_bad_arguments():
    routing = Routing(torch.arange(4), torch.tensor([4], dtype=torch.int32), torch.arange(4))
    rows, weights = torch.randn(4, 8), torch.rand(2, 2)
    with pytest.raises(TypeError, match="routing must be a Routing"):
        combine(rows, tuple(routing), weights)
    with pytest.raises(TypeError, match="rows"):
        combine(None, routing, weights)
    with pytest.raises(ValueError, match="topk_weights must be"):
        combine(rows, routing, torch.rand(3, 2))
    with pytest.raises(TypeError, match="topk_weights must be a floating"):
        combine(rows, routing, torch.ones(2, 2, dtype=torch.long))
