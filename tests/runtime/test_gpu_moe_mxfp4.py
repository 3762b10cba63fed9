"""moe_experts with MXFP4 expert weights (W4A16) on the GPU against
gg_runtime.testing.mxfp4's float64 reference built from the same 4-bit
values and scales: H and I multiples of 32 but not of 64 or 128, E from 1
to 256, k from 1 to 8, T from 0 to 4096 (both kernels' tile sizes), more
than 1,000 groups, dropped ids, both gate_up layouts and activations,
biases, bytes or torch's 4-bit dtypes, a non-finite token, CUDA graphs;
outputs poisoned.

The weights' values are exact in bfloat16 (an e2m1 value times a power of
two), so the implementation's products differ from the reference's only in
their float32 sums; what remains is the bfloat16 roundings of h, of the down
projection's rows and of the output (TOLERANCE).  Taking the nibbles in the
other order, a scale for the wrong group or row, or another expert's
weights gives errors of order 1."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import last_variant, randn, rel_error
from gg_runtime.testing.mxfp4 import dequantize_mxfp4, moe_experts_mxfp4_ref, random_mxfp4

from conftest import HAS_GPU

pytestmark = [pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("poison")]

# The bfloat16 roundings of h, the rows and the output (2^-9 each, relative).
TOLERANCE = 6e-3
PER_TOKEN_FACTOR = 4
# (tokens, hidden, inter, experts, k): H and I multiples of 32, not of 64.
TAILS = (64, 288, 160, 8, 4)


def routing(tokens, experts, k, dropped=False):
    ids = torch.stack([torch.randperm(max(experts, k), device="cuda")[:k] % max(experts, 1)
                       for _ in range(tokens)]) if tokens else \
        torch.empty(0, k, dtype=torch.int64, device="cuda")
    if dropped and tokens:
        ids[::3, -1] = -1
        ids[1::7, 0] = experts  # past the last expert: dropped too
    weights = torch.rand(tokens, k, device="cuda")
    return ids, weights


def make_case(tokens, hidden, inter, experts, k, bias=False, dropped=False):
    w13, w13_scale = random_mxfp4(experts, 2 * inter, hidden)
    w2, w2_scale = random_mxfp4(experts, hidden, inter)
    ids, weights = routing(tokens, experts, k, dropped)
    case = {"x": randn(tokens, hidden, dtype=torch.bfloat16), "topk_ids": ids,
            "topk_weights": weights, "w13": w13, "w2": w2, "w13_scale": w13_scale,
            "w2_scale": w2_scale}
    if bias:
        case["b13"] = randn(experts, 2 * inter, dtype=torch.bfloat16)
        case["b2"] = randn(experts, hidden, dtype=torch.bfloat16)
    return case


def assert_close(out, ref, tolerance=TOLERANCE):
    assert out.dtype == torch.bfloat16 and out.shape == ref.shape
    assert rel_error(out, ref) < tolerance
    kept = ref.norm(dim=1) > 0
    if kept.any():
        per_token = (out.double() - ref).norm(dim=1)[kept] / ref.norm(dim=1)[kept]
        assert per_token.max().item() < PER_TOKEN_FACTOR * tolerance


def run(case, **options):
    return gg_runtime.moe_experts(**case, **options)


@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_layouts_activations_biases(gate_up, activation, bias):
    case = make_case(*TAILS, bias=bias, dropped=True)
    options = {"gate_up": gate_up, "activation": activation}
    assert_close(run(case, **options), moe_experts_mxfp4_ref(**case, **options))


@pytest.mark.parametrize("shape", [
    (1, 288, 160, 8, 4), (3, 96, 64, 32, 1), (7, 288, 160, 1, 1), (17, 160, 96, 256, 8),
    (200, 288, 160, 8, 2), (1000, 96, 32, 1024, 2), (4096, 288, 160, 8, 4)],
    ids=lambda s: "x".join(map(str, s)))
def test_shapes(shape):
    """Decode's 16-row tiles to 64-row ones; one expert; 1024 experts (more
    than 1,000 groups, many empty); I = 32, one scale group."""
    case = make_case(*shape, dropped=shape[0] > 1)
    assert_close(run(case), moe_experts_mxfp4_ref(**case))


def test_no_tokens_and_no_kept_slots():
    case = make_case(0, 288, 160, 8, 2)
    assert run(case).shape == (0, 288)
    case = make_case(5, 288, 160, 8, 2)
    case["topk_ids"].fill_(-1)
    assert torch.equal(run(case), torch.zeros(5, 288, dtype=torch.bfloat16, device="cuda"))


def test_same_as_bfloat16_weights():
    """The 16-bit layer on the dequantized weights (exact in bfloat16) runs
    the same math with its own kernels."""
    case = make_case(*TAILS, bias=True)
    dense = dict(case, w13=dequantize_mxfp4(case["w13"], case["w13_scale"]).bfloat16(),
                 w2=dequantize_mxfp4(case["w2"], case["w2_scale"]).bfloat16())
    del dense["w13_scale"], dense["w2_scale"]
    assert_close(run(case), gg_runtime.moe_experts(**dense).double(), 2 * TOLERANCE)


def test_bytes_and_checkpoint_layout():
    """uint8 values and scales, and gpt-oss's [E, N, K/32, 16] blocks through
    mxfp4_expert_weights, give the same bits as torch's 4-bit dtypes."""
    case = make_case(*TAILS)
    out = run(case)
    as_bytes = dict(case, **{n: case[n].view(torch.uint8)
                             for n in ("w13", "w2", "w13_scale", "w2_scale")})
    assert torch.equal(run(as_bytes), out)
    experts, n, half = case["w13"].shape
    w13, w13_scale = gg_runtime.mxfp4_expert_weights(
        case["w13"].view(torch.uint8).reshape(experts, n, half // 16, 16),
        case["w13_scale"].view(torch.uint8))
    assert torch.equal(run(dict(case, w13=w13, w13_scale=w13_scale)), out)


def test_nonfinite_token_stays_its_own():
    case = make_case(*TAILS)
    case["x"][5, 7] = float("inf")
    case["x"][9, 0] = float("nan")
    out = run(case)
    ref = moe_experts_mxfp4_ref(**case)
    others = torch.ones(TAILS[0], dtype=torch.bool, device="cuda")
    others[[5, 9]] = False
    assert_close(out[others], ref[others])


def test_weights_in_padded_storage():
    """Rows 16-byte multiples apart beyond their length."""
    case = make_case(*TAILS)
    experts, n, half = case["w13"].shape
    padded = torch.empty(experts, n, half + 16, dtype=torch.uint8, device="cuda")
    padded[..., :half] = case["w13"].view(torch.uint8)
    out = run(dict(case, w13=padded[..., :half]))
    assert torch.equal(out, run(case))


@pytest.mark.parametrize("tokens", [3, 256], ids=["decode", "prefill"])
def test_cuda_graph_replays_new_tokens_and_routing(tokens):
    case = make_case(tokens, 288, 160, 8, 2)
    run(case)  # loads the kernels outside the capture
    assert last_variant().startswith("combine.")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(case)
    for dropped in (False, True):
        ids, weights = routing(tokens, 8, 2, dropped)
        case["x"].copy_(randn(tokens, 288, dtype=torch.bfloat16))
        case["topk_ids"].copy_(ids)
        case["topk_weights"].copy_(weights)
        out.fill_(float("nan"))
        graph.replay()
        assert_close(out, moe_experts_mxfp4_ref(**case))
