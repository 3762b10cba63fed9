"""gg_runtime.moe.route and combine on the GPU: against torch's stable sort
and the float32 combine (moe_reference.py), with dropped and duplicate ids,
no tokens and many; combine's gradients against torch's autograd through the
reference; both captured in one CUDA graph and replayed with new ids."""
import pytest
import torch

from gg_runtime.moe import combine, route
from moe_reference import combine_ref, route_by_sort
from conftest import gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
SHAPES = [(1, 1, 1), (37, 2, 8), (300, 8, 128), (2000, 4, 256), (0, 4, 8), (64, 6, 1000)]


def routing_case(tokens, k, experts, dtype=torch.bfloat16, hidden=96):
    """Ids in and out of [0, E) with duplicates, rows [T*k, H] and weights."""
    ids = torch.randint(-1, experts + 2, (tokens, k), device="cuda")
    rows = torch.randn(tokens * k, hidden, device="cuda", dtype=dtype)
    weights = torch.rand(tokens, k, device="cuda")
    return ids, rows, weights


@pytest.mark.parametrize("tokens, k, experts", SHAPES)
def test_route_matches_a_stable_sort(tokens, k, experts):
    ids, _, _ = routing_case(tokens, k, experts)
    for name, got, want in zip(("order", "offs", "inverse"), route(ids.int(), experts),
                               route_by_sort(ids, experts)):
        assert got.dtype == want.dtype and torch.equal(got, want), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens, k, experts", SHAPES)
def test_combine_and_its_gradients(tokens, k, experts, dtype):
    ids, rows, weights = routing_case(tokens, k, experts, dtype)
    routing = route(ids, experts)
    rows.requires_grad_()
    weights.requires_grad_()
    out = combine(rows, routing, weights)
    grad = torch.randn_like(out)
    out.backward(grad)
    reference_rows = rows.detach().double().requires_grad_()
    reference_weights = weights.detach().double().requires_grad_()
    want = combine_ref(reference_rows, routing.inverse.view(tokens, k), reference_weights,
                       routing.offs)
    want.backward(grad.double())
    tolerance = 1e-2
    for got, expected in ((out, want), (rows.grad, reference_rows.grad),
                          (weights.grad, reference_weights.grad)):
        assert got.dtype in (dtype, torch.float32)
        torch.testing.assert_close(got.double(), expected.detach(), rtol=tolerance,
                                   atol=tolerance)


def test_combine_refuses_float32_rows():
    ids, rows, weights = routing_case(8, 2, 4, torch.float32)
    with pytest.raises(TypeError, match="rows must be float16 or bfloat16"):
        combine(rows, route(ids, 4), weights)


def test_route_and_combine_replayed_from_a_graph_with_new_ids():
    tokens, k, experts = 300, 8, 64
    ids, rows, weights = routing_case(tokens, k, experts)
    combine(rows, route(ids, experts), weights)  # loads the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = combine(rows, route(ids, experts), weights)
    for _ in range(2):
        ids.copy_(torch.randint(-1, experts + 2, (tokens, k), device="cuda"))
        graph.replay()
        routing = route_by_sort(ids, experts)
        want = combine_ref(rows, routing[2].view(tokens, k), weights, routing[1])
        torch.testing.assert_close(out.float(), want, rtol=1e-2, atol=1e-2)
