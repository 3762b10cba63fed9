"""moe_experts with fp8 expert weights, and fused_experts (vLLM's entry to
it), on the GPU against gg_runtime.testing.moe_fp8's float64 reference, which
quantizes the activations as the implementation does: both kinds of scales,
H and I multiples of 16 but not of 128, E from 1 to 256, k from 1 to 8, T
from 0 to 4096, every token on one expert, duplicate and dropped ids, both
gate_up layouts and activations, biases, float16 tokens, strided and padded
storage, a non-finite token, CUDA graphs (k, one expert's tokens, the ids,
the non-finite token and the graphs on each up projection kernel's widths,
INTERS); outputs poisoned.  The decode path's tests are
test_gpu_moe_fp8_decode.py's; the cases both share, moe_fp8_cases.py's.

Two kinds of data.  Most tests draw x and w13 with exactly_quantized: fp8
holds them without loss and the tensor cores sum their products exactly, so
the up projection is the reference's to the bit and only the activation's
float32 rounding (which may move an element of h one e4m3 step) and the
bfloat16 roundings of the down projection and the output remain
(EXACT_TOLERANCE; an activation output quantized per token instead of per
128 columns, or the reverse, is several times that).  The random_data tests use normal data:
every quantization rounds (tokens quantized at the wrong granularity show
there), and the fast accumulation's rounding of the up projection puts some
of h's elements one e4m3 step from the reference's, an error that grows with
the accumulator's loss (RANDOM_TOLERANCE).
"""
import math

import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import forced, last_variant, rel_error
from gg_runtime.formats import FP8_WEIGHT_SCALINGS
from gg_runtime.testing.moe_fp8 import (KINDS, dequantized_experts, dequantized_layer,
                                        moe_experts_fp8_ref)

from conftest import device_arch, up_projection_runs_on
from moe_fp8_cases import (ACTIVATIONS, EXACT_TOLERANCE, GATE_UP, LARGE_GROUPS,
                           LARGE_GROUPS_HALVES, LARGE_GROUPS_TAILS, RANDOM_TOLERANCE, SHAPES,
                           SMALL_GROUPS, SMALL_GROUPS_HALVES, SMALL_GROUPS_WHOLE, TAILS,
                           assert_close, assert_matches_reference, check, every_inter, make_case,
                           routing, token_rows, up_kind)

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES)
def test_shapes(kind, shape):
    tokens, hidden, inter, experts, k = shape
    case = make_case(*shape, kind)
    scale_shapes = {
        "128x128": [(experts, math.ceil(2 * inter / 128), math.ceil(hidden / 128)),
                    (experts, math.ceil(hidden / 128), math.ceil(inter / 128))],
        "rowwise": [(experts, 2 * inter), (experts, hidden)]}[kind]
    assert [tuple(case[n].scales.shape) for n in ("w13", "w2")] == scale_shapes
    assert [case[n].format for n in ("w13", "w2")] == [kind, kind]
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gate_up", GATE_UP)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("shape", [SMALL_GROUPS, LARGE_GROUPS], ids=["small", "large"])
def test_layouts_activations_and_biases(kind, gate_up, activation, bias, shape):
    case = make_case(*shape, kind, bias=bias)
    if activation == "gpt_oss":  # many gate and up values past the clamps (+-7)
        case["w13"] = case["w13"]._replace(scales=case["w13"].scales * 4)
    check(case, gate_up=gate_up, activation=activation)


# Serving's: those that do not keep gu (test_gpu_moe_fp8_training.py forces the others).
UP_KERNELS = [v for v in _C.variants() if v["arch"] == 90 and v["family"] == "scaled_ragged_glu"
              and v["axes"]["gu"] == "dropped"]


UP_SHAPES = {"small": SMALL_GROUPS_WHOLE, "large": LARGE_GROUPS, "small_tails": SMALL_GROUPS,
             "large_tails": LARGE_GROUPS_TAILS, "small_halves": SMALL_GROUPS_HALVES,
             "large_halves": LARGE_GROUPS_HALVES}


@pytest.mark.parametrize("variant, shape", [
    pytest.param(v, shape, id=f"{v['key']}-{name}") for v in UP_KERNELS
    for name, shape in UP_SHAPES.items()
    if up_projection_runs_on(v, shape[2])])
def test_every_up_projection_kernel(variant, shape):
    """Each of the fused up projection's kernels forced, whatever the groups'
    size (the other steps' kernels chosen as usual), on groups of a few rows
    and of many, I = 256, 320 and 208, each where the kernel's condition
    holds."""
    case = make_case(*shape, up_kind(variant), bias=True)
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"])
    assert_matches_reference(out, case, EXACT_TOLERANCE, gate_up=variant["axes"]["gate_up"])


@pytest.mark.parametrize("variant, shape", [
    pytest.param(v, shape, id=f"{v['key']}-{name}") for v in UP_KERNELS
    for name, shape in {"tails": LARGE_GROUPS_TAILS, "whole": LARGE_GROUPS,
                        "halves": LARGE_GROUPS_HALVES}.items()
    if not up_projection_runs_on(v, shape[2])])
def test_a_kernel_is_refused_widths_its_condition_excludes(variant, shape):
    """The warp-specialised kernel scales each half's columns in blocks of
    128 (the family's condition `whole_halves`: I a multiple of 128) or 64
    (`odd_halves`: an odd multiple of 64), each within one weight block:
    forced on another I it is refused, and the dispatch never picks it there
    (test_every_up_projection_kernel's shapes, checked against the reference)."""
    case = make_case(*shape, up_kind(variant))
    with forced(variant["key"]), pytest.raises(ValueError, match="cannot run this problem"):
        gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("k", range(1, 9))
@pytest.mark.parametrize("tokens", [33, 300], ids=["few_rows", "many_rows"])
@every_inter
def test_every_k(kind, k, tokens, inter):
    """Groups of about 2-17 rows and 19-150 (past the per-channel decode
    kernel's 32), on every width."""
    check(make_case(tokens, 272, inter, 16, k, kind))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [TAILS, SHAPES["t4096"]], ids=["t64", "t4096"])
def test_random_data(kind, shape):
    """Normal tokens and weights: every quantization rounds."""
    check(make_case(*shape, kind, exact=False), RANDOM_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", [SMALL_GROUPS, LARGE_GROUPS], ids=["small", "large"])
def test_random_data_layouts_and_biases(kind, shape):
    case = make_case(*shape, kind, exact=False, bias=True)
    check(case, RANDOM_TOLERANCE, gate_up="interleaved", activation="gpt_oss")


@pytest.mark.parametrize("kind", KINDS)
def test_no_tokens(kind):
    case = make_case(0, 272, 208, 8, 2, kind)
    out = gg_runtime.moe_experts(**case)
    assert out.shape == (0, 272) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("kind", KINDS)
def test_no_experts(kind):
    """E = 0 (a rank that holds none): every slot dropped, the output zeros."""
    case = make_case(16, 272, 208, 2, 2, kind)
    for name in ("w13", "w2"):
        case[name] = case[name]._replace(values=case[name].values[:0],
                                         scales=case[name].scales[:0])
    case["topk_ids"].fill_(-1)
    out = gg_runtime.moe_experts(**case)
    assert out.shape == (16, 272) and out.eq(0).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [300, 1100], ids=["pingpong", "split"])
@every_inter
def test_all_tokens_on_one_expert(kind, tokens, inter):
    """One group of every row, the others empty: up to 512 rows a group the
    warp-specialised kernel's pingpong tiles, beyond its split ones."""
    case = make_case(tokens, 272, inter, 16, 1, kind)
    case["topk_ids"].fill_(7)
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@every_inter
def test_duplicate_ids_in_a_token(kind, inter):
    """A token may name an expert twice: both slots count, each with its weight."""
    case = make_case(160, 272, inter, 8, 4, kind)
    ids = case["topk_ids"]
    ids[:, 1] = ids[:, 0]
    ids[::3, 3] = ids[::3, 0]
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@every_inter
def test_dropped_ids_add_nothing(kind, inter):
    """-1 and ids >= E (other ranks' experts) drop their slots; a token whose
    slots are all dropped gets zeros (its row written: outputs are poisoned)."""
    case = make_case(197, 272, inter, 8, 4, kind)
    ids = case["topk_ids"]
    ids[torch.rand(ids.shape, device="cuda") < 0.3] = -1
    ids[0] = torch.tensor([8, 9, 2 ** 31 - 1, -300])
    ids[1, 2] = 8
    out = check(case)
    assert out[0].eq(0).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens, k", [(1, 8), (4, 4), (300, 4)],
                         ids=["one_token", "decode", "many"])
def test_tokens_given_quantized(kind, tokens, k):
    """x given quantized, a Quantized (quantize_fp8 in the layout the weights
    ask, per-token scales also as [T, 1]): bfloat16 out, the 16-bit tokens' result
    to the bit where both take the same kernels (many slots; per-channel
    weights' decode kernel, which reads the tokens quantized either way).
    Blockwise tokens given quantized take the two projections' kernels at
    any size: the reference's result."""
    case = make_case(tokens, 272, 208, 16, k, kind, dtype=torch.float16, bias=True)
    x = gg_runtime.quantize_fp8(case["x"], FP8_WEIGHT_SCALINGS[kind].rows)
    want = gg_runtime.moe_experts(**case)
    for xq in (x, x._replace(scales=x.scales[:, None])) if kind == "rowwise" else (x,):
        # Biases in the output's dtype (or float32).
        biases = {n: case[n].bfloat16() for n in ("b13", "b2")}
        got = gg_runtime.moe_experts(**{**case, **biases, "x": xq})
        assert got.dtype == torch.bfloat16
        if kind == "128x128" and tokens * k <= 16:
            assert last_variant().startswith("combine.")
        else:
            assert torch.equal(got.to(want.dtype), want)  # the same bfloat16 sums, converted
        assert_matches_reference(got.to(case["x"].dtype), case, EXACT_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [1, 64], ids=["decode", "routed"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_out_takes_the_output(kind, tokens, dtype):
    """out= on either path, the output written where given (float16 tokens:
    the kernels' bfloat16 sums converted into it)."""
    case = make_case(tokens, *TAILS[1:], kind, dtype=dtype)
    want = gg_runtime.moe_experts(**case)
    out = torch.full_like(want, float("nan"))
    assert gg_runtime.moe_experts(**case, out=out) is out
    assert torch.equal(out, want)


@pytest.mark.parametrize("kind", KINDS)
def test_float16_tokens(kind):
    check(make_case(*TAILS, kind, dtype=torch.float16, bias=True))


@pytest.mark.parametrize("kind", KINDS)
def test_strided_and_padded_storage(kind):
    """x a column slice; int32 ids; bfloat16 routing weights; each weight a
    slice of wider fp8 storage (K-major, rows 16-byte multiples apart);
    per-channel scales as [E, N, 1] (compressed-tensors' shape), block scales
    as transposed views."""
    case = make_case(*TAILS, kind)
    case["x"] = torch.cat([case["x"], case["x"]], 1)[:, 5:5 + 272].copy_(case["x"])
    case["topk_ids"] = case["topk_ids"].int()
    case["topk_weights"] = case["topk_weights"].bfloat16()
    for name in ("w13", "w2"):
        w, scale = case[name].values, case[name].scales
        wide = torch.empty(*w.shape[:2], w.shape[2] + 32, dtype=w.dtype, device="cuda")
        values = wide[..., :w.shape[2]]
        values.copy_(w)
        case[name] = case[name]._replace(
            values=values,
            scales=scale.unsqueeze(-1) if kind == "rowwise" else scale.mT.contiguous().mT)
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@every_inter
def test_non_finite_token_stays_in_its_row(kind, activation, inter):
    """A NaN in one token, an inf in another: every other token finite and
    as the reference; the two's outputs all NaN (the NaN stays e4m3's NaN,
    the inf makes its scale inf and its element NaN), not finite values."""
    case = make_case(160, 272, inter, 8, 4, kind)
    case["x"][3, 10] = float("nan")
    case["x"][40, 200] = float("inf")
    out = gg_runtime.moe_experts(**case, activation=activation)
    good = torch.ones(160, dtype=torch.bool, device="cuda")
    good[[3, 40]] = False
    assert torch.isfinite(out[good]).all()
    reference = moe_experts_fp8_ref(**case, activation=activation)
    assert_close(out[good], reference[good], EXACT_TOLERANCE)
    assert out[~good].isnan().all()


def skewed_routing(tokens, experts, k):
    """Most slots on expert 0, some dropped (-1): groups far from the captured ones."""
    ids, weights = routing(tokens, experts, k)
    ids[: tokens * 3 // 4, 0] = 0
    ids[::5, -1] = -1
    return ids, weights


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [3, 256], ids=["decode", "two_projections"])
@every_inter
def test_cuda_graph_replays_new_tokens_and_routing(kind, tokens, inter):
    """Captured (nothing may wait for the host), then replayed, each time with
    new tokens, ids and weights copied into the captured inputs: the routing
    captured, one skewed onto an expert with dropped slots, then another; 3
    tokens (6 slots, 8 experts) take the decode kernel, 256 the two
    projections."""
    case = make_case(tokens, 272, inter, 8, 2, kind)
    gg_runtime.moe_experts(**case)  # loads the kernels outside the capture
    assert last_variant().startswith("combine_parts." if tokens == 3 else "combine.")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gg_runtime.moe_experts(**case)
    for new_routing in (skewed_routing, routing):
        ids, weights = new_routing(tokens, 8, 2)
        case["x"].copy_(token_rows(tokens, 272, kind))
        case["topk_ids"].copy_(ids)
        case["topk_weights"].copy_(weights)
        out.fill_(float("nan"))
        graph.replay()
        assert_close(out, moe_experts_fp8_ref(**case), EXACT_TOLERANCE)


def vllm_options(kind):
    """fused_experts' arguments saying the scales' kind, as vLLM passes them."""
    return {"block_shape": [128, 128]} if kind == "128x128" else {"per_channel_quant": True}


def fused(case, **options):
    return gg_runtime.fused_experts(case["x"], case["w13"].values, case["w2"].values,
                                    case["topk_weights"], case["topk_ids"], use_fp8_w8a8=True,
                                    w1_scale=case["w13"].scales, w2_scale=case["w2"].scales,
                                    **options)


# Served layers' shapes (tokens, hidden, inter, experts, k): each kernel of the
# forward, once with a buffer freed before its launch or read past its end.
SERVED = {"deepseek_v3_tp16_decode": (5, 7168, 128, 256, 8),
          "deepseek_v3_tp16": (200, 7168, 128, 256, 8),
          "qwen3_30b_a3b": (37, 2048, 768, 128, 8),
          "gpt_oss": (24, 2880, 2880, 32, 4),
          "per_channel_mixtral_like": (300, 4096, 1408, 16, 2),
          "h272_i80": (100, 272, 80, 8, 2)}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SERVED.values(), ids=SERVED)
def test_served_shapes(shape, kind):
    check(make_case(*shape, kind, exact=False), RANDOM_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_experts_is_moe_experts(kind):
    case = make_case(*TAILS, kind)
    want = gg_runtime.moe_experts(**case)
    assert torch.equal(fused(case, **vllm_options(kind)), want)
    if kind == "128x128":  # block_shape None: the scales' shapes say blocks
        assert torch.equal(fused(case), want)
    x = case["x"].clone()
    returned = fused({**case, "x": x}, inplace=True, **vllm_options(kind))
    assert returned is x and torch.equal(x, want)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_experts_expert_map(kind):
    """Global ids through expert_map: this rank's 4 of 12 experts, the other
    ranks' slots dropped; no host sync on the way."""
    case = make_case(64, 272, 208, 4, 4, kind)
    expert_map = torch.full((12,), -1, dtype=torch.int32, device="cuda")
    held = torch.tensor([1, 5, 6, 10], device="cuda")
    expert_map[held] = torch.arange(4, dtype=torch.int32, device="cuda")
    global_ids, _ = routing(64, 12, 4)
    case["topk_ids"] = global_ids
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = fused(case, global_num_experts=12, expert_map=expert_map, **vllm_options(kind))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    local = {**case, "topk_ids": expert_map[global_ids]}
    assert torch.equal(out, gg_runtime.moe_experts(**local))
    assert_close(out, moe_experts_fp8_ref(**local), EXACT_TOLERANCE)


def test_end_to_end_error(record_property):
    """What fp8 costs: the error of moe_experts with fp8 weights, and of the
    16-bit layer (moe_experts on the dequantized weights in bfloat16), against
    the exact layer of the dequantized weights; printed (pytest -s) and
    recorded (--junitxml)."""
    shape = (256, 1024, 512, 16, 4)
    case = make_case(*shape, "128x128", exact=False)
    exact = dequantized_layer(**case)
    fp8 = gg_runtime.moe_experts(**case)
    w13, w2 = (w.bfloat16() for w in dequantized_experts(case["w13"], case["w2"]))
    bf16 = gg_runtime.moe_experts(case["x"], case["topk_ids"], case["topk_weights"], w13, w2)
    errors = {"fp8_vs_exact": rel_error(fp8, exact), "bf16_vs_exact": rel_error(bf16, exact),
              "fp8_vs_bf16": rel_error(fp8, bf16.double())}
    for name, error in errors.items():
        record_property(name, error)
    print(f"\nfp8 moe_experts, 128 x 128 blocks, (T, H, I, E, k) = {shape}: "
          + ", ".join(f"{name} {error:.2e}" for name, error in errors.items()))
    assert errors["bf16_vs_exact"] < errors["fp8_vs_exact"] < 0.1


def test_other_gpu_paths_are_refused():
    case = make_case(*TAILS, "128x128")
    gg_runtime.force_ptx(True)  # the sm80 path, which has no fp8 kernels
    try:
        with pytest.raises(gg_runtime.UnsupportedDeviceError, match="compute capability 9.0"):
            gg_runtime.moe_experts(**case)
    finally:
        gg_runtime.force_ptx(False)
