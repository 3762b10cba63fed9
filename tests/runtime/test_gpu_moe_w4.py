"""moe_experts with 4-bit expert weights (W4A16: MXFP4, INT4 in groups of
32 and 128; W4A8 at prefill with MXFP4 on sm90) on the GPU against
gg_runtime.testing.w4's float64 reference
built from the same 4-bit values and scales: H and I multiples of the scale
group but not of 64 or 128 where the group allows, E from 1 to 1024, k from
1 to 8, T from 0 to 4096 (every kernel's tile size), more than 1,000
groups, dropped ids, both gate_up layouts and activations, biases, bytes or
torch's 4-bit dtypes, a non-finite token, CUDA graphs; outputs poisoned.

The reference widens the weights as the kernels do (MXFP4 exactly, INT4's
q * scale rounded once to bfloat16), so the implementation's products differ
from the reference's only in their float32 sums; what remains is the
bfloat16 roundings of h, of the down projection's rows and of the output
(TOLERANCE).  Taking the nibbles in the other order, a scale for the wrong
group or row, or another expert's weights gives errors of order 1.

At prefill (at least 64 slots an expert on average) moe_experts widens
MXFP4 weights to fp8 and runs its fp8 products on them (W4A8, sm90): those
calls are checked against gg_runtime.testing.moe_fp8's reference on the fp8
weights torch makes from the same values (testing.w4.widened_fp8), which
quantizes the tokens and h as the fp8 products do (W4A8_TOLERANCE)."""
import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import forced, last_variant, randn, rel_error
from gg_runtime.testing.moe_fp8 import moe_experts_fp8_ref
from gg_runtime.testing.w4 import (moe_experts_w4_ref, random_int4, random_mxfp4, widened,
                                   widened_fp8)

from conftest import HAS_GPU, device_arch

pytestmark = [pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("poison")]

# The bfloat16 roundings of h, the rows and the output (2^-9 each, relative).
TOLERANCE = 6e-3
PER_TOKEN_FACTOR = 4
# The formats, each with its (tokens, hidden, inter, experts, k): H and I
# multiples of the scale group, not of 64 where it is 32.
TAILS = {"mxfp4": (64, 288, 160, 8, 4), "int4_g32": (64, 288, 160, 8, 4),
         "int4_g128": (64, 384, 256, 8, 4)}
FORMATS = tuple(TAILS)
# Tokens that make at most one slot an expert with TAILS' E and k: the split
# forward (w4_decode_split) runs without biases, the decode kernels
# (w4_decode_glu, w4_decode_down) with them, not the routed ones.
DECODE_TOKENS = 2
PATHS = ("split", "decode", "routed", "widened")
W4A16_PATHS = PATHS[:3]
# W4A8's calls: random tokens and h quantized to e4m3 per 128 columns, the
# fp8 products' fast accumulation (test_gpu_moe_fp8.py's RANDOM_TOLERANCE).
W4A8_TOLERANCE = 2e-2
# Tokens that make 64 slots an expert with TAILS' E and k: MXFP4's calls
# then widen the weights to fp8 (W4A8) on sm90.
PREFILL_TOKENS = 128
WIDENS = device_arch() == 90  # the sm90 kernels run here: the fp8 products do


def routing(tokens, experts, k, dropped=False):
    ids = torch.stack([torch.randperm(max(experts, k), device="cuda")[:k] % max(experts, 1)
                       for _ in range(tokens)]) if tokens else \
        torch.empty(0, k, dtype=torch.int64, device="cuda")
    if dropped and tokens:
        ids[::3, -1] = -1
        ids[1::7, 0] = experts  # past the last expert: dropped too
    weights = torch.rand(tokens, k, device="cuda")
    return ids, weights


def random_weights(experts, n, k, weight_format):
    if weight_format == "mxfp4":
        return random_mxfp4(experts, n, k)
    return random_int4(experts, n, k, group=int(weight_format.split("_g")[1]))


def make_case(tokens, hidden, inter, experts, k, bias=False, dropped=False,
              weight_format="mxfp4"):
    w13 = random_weights(experts, 2 * inter, hidden, weight_format)
    w2 = random_weights(experts, hidden, inter, weight_format)
    ids, weights = routing(tokens, experts, k, dropped)
    case = {"x": randn(tokens, hidden, dtype=torch.bfloat16), "topk_ids": ids,
            "topk_weights": weights, "w13": w13, "w2": w2}
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


def kernels_run(case, **options) -> set:
    """The names of the GPU kernels one call launches."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        run(case, **options)
        torch.cuda.synchronize()
    return {event.name for event in profile.events()}


def assert_path(case, path, **options):
    """The call runs `path`'s kernels (PATHS: the split forward, the decode
    kernels, the routed ones, the widening and fp8's products) and no
    other's (not checked where the profiler sees no kernels: under
    compute-sanitizer, which holds the GPU's profiling interface)."""
    names = " ".join(kernels_run(case, **options))
    if not names:
        return
    ran = ("w4_decode_split" in names, "w4_decode_glu" in names and "w4_decode_down" in names,
           "w4_glu_kernel" in names and "w4_ragged_m" in names,
           "widen_mxfp4" in names and "scaled_ragged_glu" in names)
    assert ran == tuple(p == path for p in PATHS), names


def w4a8_reference(w13, w2, **case_and_options):
    """The float64 reference of a call that widens its MXFP4 weights to fp8
    (moe_experts_w4_ref's arguments)."""
    return moe_experts_fp8_ref(w13=widened_fp8(w13), w2=widened_fp8(w2), **case_and_options)


def decode_kernel(weight_format, gate_up):
    """The key of this GPU's w4_decode_glu variant for the format and layout
    that any call can run (its unconditioned config): forcing it makes a
    call take the decode kernels."""
    return next(v["key"] for v in _C.variants()
                if v["family"] == "w4_decode_glu" and v["arch"] == device_arch()
                and v["axes"]["format"] == weight_format and v["axes"]["gate_up"] == gate_up
                and v["key"].endswith("_s1"))


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("path", W4A16_PATHS)
def test_layouts_activations_biases(weight_format, gate_up, activation, bias, path):
    """Each path (the decode kernels forced where the call would take the
    split forward; biases make a decode call take the decode kernels)."""
    tokens, *shape = TAILS[weight_format]
    case = make_case(tokens if path == "routed" else DECODE_TOKENS, *shape, bias=bias,
                     dropped=True, weight_format=weight_format)
    options = {"gate_up": gate_up, "activation": activation}
    force = decode_kernel(weight_format, gate_up) if path == "decode" else ""
    with forced(variant=force):
        assert_close(run(case, **options), moe_experts_w4_ref(**case, **options))
        assert_path(case, "decode" if path == "split" and bias else path, **options)


@pytest.mark.parametrize("weight_format", FORMATS)
def test_far_more_experts_than_slots_take_the_routed_kernels(weight_format):
    """T * k <= E but E > 32 T * k: the routed kernels (the rule in
    csrc/ops/expert_products_w4.cc)."""
    _, hidden, inter, _, _ = TAILS[weight_format]
    case = make_case(1, hidden, inter, 256, 4, bias=True, weight_format=weight_format)
    assert_close(run(case), moe_experts_w4_ref(**case))
    assert_path(case, "routed")


DECODE_VARIANTS = [v for v in _C.variants() if HAS_GPU and v["arch"] == device_arch()
                   and v["family"] in ("w4_decode_glu", "w4_decode_down", "w4_decode_split")]


@pytest.mark.parametrize("variant", DECODE_VARIANTS, ids=lambda v: v["key"])
def test_every_decode_variant_forced(variant):
    """Each decode kernel variant of this GPU forced on a call whose
    conditions it meets (TAILS' shapes at decode meet every one: few units,
    K at most 256; no biases for the split forward), against the reference."""
    weight_format = variant["axes"]["format"]
    gate_up = variant["axes"].get("gate_up", "concatenated")
    _, *shape = TAILS[weight_format]
    case = make_case(DECODE_TOKENS, *shape, bias=variant["family"] != "w4_decode_split",
                     dropped=True, weight_format=weight_format)
    with forced(variant=variant["key"]):
        out = run(case, gate_up=gate_up)
    assert_close(out, moe_experts_w4_ref(**case, gate_up=gate_up))


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("shape", [
    (48, 288, 160, 64, 1), (100, 96, 32, 1024, 8), (1, 2880, 2880, 4, 4),
    (4, 2048, 768, 32, 8), (1, 288, 160, 1, 1)], ids=lambda s: "x".join(map(str, s)))
def test_decode_shapes(weight_format, shape):
    """The decode kernels on more rows than a step's 16 for one expert (the
    first 40 tokens' slot to expert 0), 1024 experts (the busy ones found
    among them), K past the last whole step (gpt-oss's 2880: 11 steps of 256
    and 64 more), Qwen3's I = 768, one expert (E = 1)."""
    tokens, hidden, inter, experts, k = shape
    if weight_format == "int4_g128" and (hidden % 128 or inter % 128):
        hidden, inter = 128 * -(-hidden // 128), 128 * -(-inter // 128)
    case = make_case(tokens, hidden, inter, experts, k, bias=True, dropped=True,
                     weight_format=weight_format)
    case["topk_ids"][:40, 0] = 0
    assert_close(run(case), moe_experts_w4_ref(**case))
    assert_path(case, "decode")


SPLIT_VARIANTS = [v["key"] for v in _C.variants() if HAS_GPU and v["arch"] == device_arch()
                  and v["family"] == "w4_decode_split"]


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("shape", [
    (1, 7168, 256, 16, 8), (2, 2048, 384, 16, 8), (3, 288, 160, 8, 2), (1, 2880, 2880, 4, 4),
    (1, 288, 160, 1, 1), (4, 1024, 32, 64, 8)], ids=lambda s: "x".join(map(str, s)))
def test_split_shapes(weight_format, shape):
    """The split forward: H in 14 parts of two steps (Kimi-K2's TP8 shard's H
    and I, 16 experts), Qwen3's TP2 shard at T = 2, H of one part and its last
    step short, gpt-oss's H and I (a chunk of h and a step of K short; its
    units are too many for the rule, so the variant is forced), one expert
    and k = 1, I of one scale group; dropped ids; each token's pairs in down
    parts."""
    tokens, hidden, inter, experts, k = shape
    too_many_units = inter == 2880
    if weight_format == "int4_g128" and (hidden % 128 or inter % 128):
        hidden, inter = 128 * -(-hidden // 128), 128 * -(-inter // 128)
    case = make_case(tokens, hidden, inter, experts, k, dropped=tokens > 1,
                     weight_format=weight_format)
    key = next(key for key in SPLIT_VARIANTS if f".{weight_format}-concatenated." in key)
    with forced(variant=key if too_many_units else ""):
        assert_close(run(case), moe_experts_w4_ref(**case))
        assert_path(case, "split")


def largest_tile(family, weight_format):
    """The key of this GPU's `family` variant (w4_glu: concatenated) for the
    format with the most rows a tile: forcing it keeps a prefill call on
    the W4A16 kernels."""
    return max((v for v in _C.variants()
                if v["family"] == family and v["arch"] == device_arch()
                and v["axes"]["format"] == weight_format
                and v["axes"].get("gate_up", "concatenated") == "concatenated"),
               key=lambda v: v["block"][0])["key"]


@pytest.mark.parametrize("shape", [
    (1, 288, 160, 8, 4), (3, 96, 64, 32, 1), (7, 288, 160, 1, 1), (17, 160, 96, 256, 8),
    (200, 288, 160, 8, 2), (1000, 96, 32, 1024, 2), (4096, 288, 160, 8, 4)],
    ids=lambda s: "x".join(map(str, s)))
def test_shapes(shape):
    """Decode's 16-row tiles to 128-row ones (W4A16's, forced where the call
    would widen the weights to fp8); one expert; 1024 experts (more than
    1,000 groups, many empty); I = 32, one scale group."""
    case = make_case(*shape, dropped=shape[0] > 1)
    with forced(variant=largest_tile("w4_ragged_m", "mxfp4") if shape[0] == 4096 else ""):
        assert_close(run(case), moe_experts_w4_ref(**case))


@pytest.mark.parametrize("weight_format", ["int4_g32", "int4_g128"])
@pytest.mark.parametrize("shape", [(1, 256, 128, 8, 4), (17, 384, 256, 256, 8),
                                   (300, 256, 384, 4, 2), (4096, 384, 128, 8, 4)],
                         ids=lambda s: "x".join(map(str, s)))
def test_int4_shapes(weight_format, shape):
    """INT4 on every tile size; I = 128, one group of 128."""
    case = make_case(*shape, dropped=shape[0] > 1, weight_format=weight_format)
    assert_close(run(case), moe_experts_w4_ref(**case))


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("decode", [True, False], ids=["split", "routed"])
def test_out_takes_the_output(weight_format, decode):
    tokens, *shape = TAILS[weight_format]
    case = make_case(DECODE_TOKENS if decode else tokens, *shape, weight_format=weight_format)
    with torch.no_grad():
        want = run(case)
        out = torch.full_like(want, float("nan"))
        assert run(case, out=out) is out
    assert torch.equal(out, want)


def test_no_tokens_and_no_kept_slots():
    case = make_case(0, 288, 160, 8, 2)
    assert run(case).shape == (0, 288)
    case = make_case(5, 288, 160, 8, 2)
    case["topk_ids"].fill_(-1)
    assert torch.equal(run(case), torch.zeros(5, 288, dtype=torch.bfloat16, device="cuda"))


@pytest.mark.parametrize("weight_format", FORMATS)
def test_same_as_bfloat16_weights(weight_format):
    """The 16-bit layer on the widened weights (bfloat16, as the kernels
    widen them) runs the same math with its own kernels."""
    case = make_case(*TAILS[weight_format], bias=True, weight_format=weight_format)
    dense = dict(case, w13=widened(case["w13"]).bfloat16(), w2=widened(case["w2"]).bfloat16())
    assert_close(run(case), gg_runtime.moe_experts(**dense).double(), 2 * TOLERANCE)


def test_bytes_and_checkpoint_layout():
    """uint8 values and scales, and gpt-oss's [E, N, K/32, 16] blocks through
    mxfp4_expert_weights, give the same bits as torch's 4-bit dtypes."""
    case = make_case(*TAILS["mxfp4"])
    out = run(case)
    as_bytes = dict(case, **{n: case[n]._replace(values=case[n].values.view(torch.uint8),
                                                 scales=case[n].scales.view(torch.uint8))
                             for n in ("w13", "w2")})
    assert torch.equal(run(as_bytes), out)
    experts, n, half = case["w13"].values.shape
    w13 = gg_runtime.mxfp4_expert_weights(
        case["w13"].values.view(torch.uint8).reshape(experts, n, half // 16, 16),
        case["w13"].scales.view(torch.uint8))
    assert torch.equal(run(dict(case, w13=w13)), out)


@pytest.mark.parametrize("w13_exponents, w2_exponents, token_scale", [
    ((0, 6), (118, 124), 2.0 ** 100),  # w13's values down to 2^-128: bf16 subnormals
    ((127, 140), (127, 140), 1.0)])  # scales above 2 (up to 2^13)
def test_mxfp4_scales_over_their_range(w13_exponents, w2_exponents, token_scale):
    """MXFP4's widening is exact for every e8m0 scale: the smallest (2^-127,
    whose products with 0.5 are bfloat16 subnormals) and ones above 2; the
    tokens scaled so that the layer's values stay normal float32."""
    case = make_case(*TAILS["mxfp4"])
    hidden, inter = case["x"].shape[1], case["w2"].values.shape[2] * 2
    experts = case["w13"].values.shape[0]
    case["w13"] = random_mxfp4(experts, 2 * inter, hidden, w13_exponents)
    case["w2"] = random_mxfp4(experts, hidden, inter, w2_exponents)
    case["x"] = (case["x"].double() * token_scale).bfloat16()
    assert_close(run(case), moe_experts_w4_ref(**case))


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("path", PATHS)
def test_nonfinite_token_stays_its_own(weight_format, activation, path):
    """An inf in one token, a NaN in another, on each path: every other
    token as the reference; the NaN token's output all NaN (an inf's may be
    finite under gpt-oss's clamps, as in torch)."""
    tokens, hidden, inter, experts, k = TAILS[weight_format]
    if path == "split":  # 24 slots over 64 experts, I's 3 chunks: 72 units
        tokens, experts, k = 12, 64, 2
    elif path == "decode":  # at most one slot an expert, the kernels forced
        tokens = 10
        experts = tokens * k
    elif path == "widened":
        if weight_format != "mxfp4" or not WIDENS:
            pytest.skip("W4A8 widens MXFP4 weights on sm90 only")
        tokens = PREFILL_TOKENS
    case = make_case(tokens, hidden, inter, experts, k, weight_format=weight_format)
    case["x"][5, 7] = float("inf")
    case["x"][9, 0] = float("nan")
    options = {"activation": activation}
    force = decode_kernel(weight_format, "concatenated") if path == "decode" else ""
    with forced(variant=force):
        out = run(case, **options)
        assert_path(case, path, **options)
    others = torch.ones(case["x"].shape[0], dtype=torch.bool, device="cuda")
    others[[5, 9]] = False
    if path == "widened":
        assert_close(out[others], w4a8_reference(**case, **options)[others], W4A8_TOLERANCE)
    else:
        assert_close(out[others], moe_experts_w4_ref(**case, **options)[others])
    assert out[9].isnan().all()


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("decode", [True, False], ids=["split", "routed"])
def test_weights_in_padded_storage(weight_format, decode):
    """Rows 16-byte multiples apart beyond their length."""
    tokens, *shape = TAILS[weight_format]
    case = make_case(DECODE_TOKENS if decode else tokens, *shape, weight_format=weight_format)
    experts, n, half = case["w13"].values.shape
    padded = torch.empty(experts, n, half + 16, dtype=torch.uint8, device="cuda")
    padded[..., :half] = case["w13"].values.view(torch.uint8)
    out = run(dict(case, w13=case["w13"]._replace(values=padded[..., :half])))
    assert torch.equal(out, run(case))


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("tokens", [3, 256], ids=["decode", "prefill"])
def test_cuda_graph_replays_new_tokens_and_routing(weight_format, tokens):
    """MXFP4's prefill (64 slots an expert) widens its weights to fp8 on sm90."""
    _, hidden, inter, experts, _ = TAILS[weight_format]
    case = make_case(tokens, hidden, inter, experts, 2, weight_format=weight_format)
    w4a8 = tokens == 256 and weight_format == "mxfp4" and WIDENS
    reference = w4a8_reference if w4a8 else moe_experts_w4_ref
    run(case)  # loads the kernels outside the capture
    assert last_variant().startswith("w4_decode_split." if tokens == 3 else "combine.")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(case)
    for dropped in (False, True):
        ids, weights = routing(tokens, experts, 2, dropped)
        case["x"].copy_(randn(tokens, hidden, dtype=torch.bfloat16))
        case["topk_ids"].copy_(ids)
        case["topk_weights"].copy_(weights)
        out.fill_(float("nan"))
        graph.replay()
        assert_close(out, reference(**case), W4A8_TOLERANCE if w4a8 else TOLERANCE)


def test_int4_encodings_and_packings():
    """compressed-tensors' int32 words and two's complement nibbles, through
    int4_expert_weights, give the same bits as the bytes stored q + 8."""
    case = make_case(*TAILS["int4_g32"], weight_format="int4_g32")
    out = run(case)
    words = case["w13"].values.view(torch.int32)
    w13 = gg_runtime.int4_expert_weights(words, case["w13"].scales)
    assert torch.equal(run(dict(case, w13=w13)), out)
    signed = case["w2"].values ^ 0x88
    w2 = gg_runtime.int4_expert_weights(signed, case["w2"].scales, encoding="signed")
    assert torch.equal(run(dict(case, w2=w2)), out)


w4a8_only = pytest.mark.skipif(not WIDENS, reason="W4A8 runs the sm90 kernels' fp8 products")


@w4a8_only
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_prefill_widens_mxfp4_to_fp8(gate_up, activation, bias):
    """64 slots an expert: the weights widened to fp8, the fp8 products; INT4
    (whose values times scales fp8 does not hold) stays W4A16."""
    _, *shape = TAILS["mxfp4"]
    case = make_case(PREFILL_TOKENS, *shape, bias=bias, dropped=True)
    options = {"gate_up": gate_up, "activation": activation}
    assert_close(run(case, **options), w4a8_reference(**case, **options), W4A8_TOLERANCE)
    assert_path(case, "widened", **options)
    for weight_format in ("int4_g32", "int4_g128"):
        _, *shape = TAILS[weight_format]
        case = make_case(PREFILL_TOKENS, *shape, bias=bias, weight_format=weight_format)
        assert_close(run(case, **options), moe_experts_w4_ref(**case, **options))
        assert_path(case, "routed", **options)


@w4a8_only
@pytest.mark.parametrize("shape", [
    (1, 288, 160, 8, 4), (3, 96, 32, 1, 1), (130, 160, 96, 3, 2), (1000, 96, 32, 1024, 2),
    (0, 288, 160, 8, 2)], ids=lambda s: "x".join(map(str, s)))
def test_widened_shapes(shape):
    """Forced: one token; one expert, I = 32 (K in one part of a block);
    N and K in no whole number of 128 x 128 blocks; 1024 experts; no
    tokens."""
    case = make_case(*shape, dropped=shape[0] > 1)
    with forced(variant=next(v["key"] for v in _C.variants()
                             if v["family"] == "widen_mxfp4" and v["arch"] == 90)):
        assert_close(run(case), w4a8_reference(**case), W4A8_TOLERANCE)


@w4a8_only
@pytest.mark.parametrize("exponents", [(104, 124), (0, 12), (150, 164)])
def test_widened_scales_over_their_range(exponents):
    """A block's groups up to 20 binades below its largest (exact within 14,
    rounded below: the widening's slow tables); the smallest scales
    (2^-127, block scales float32 subnormals); scales past 2^20; the tokens
    scaled so that the layer's values stay normal float32 (and above the
    tokens' quantization's floor of 1e-12)."""
    _, hidden, inter, experts, k = TAILS["mxfp4"]
    case = make_case(PREFILL_TOKENS, hidden, inter, experts, k)
    case["w13"] = random_mxfp4(experts, 2 * inter, hidden, exponents)
    case["w2"] = random_mxfp4(experts, hidden, inter, (118, 124))
    scale = 2.0 ** (121 - (exponents[0] + exponents[1]) // 2)
    case["x"] = (case["x"].double() * scale).bfloat16()
    ref = w4a8_reference(**case)
    assert_close(run(case), ref, W4A8_TOLERANCE)


@w4a8_only
def test_widened_nan_scale_stays_with_its_experts_tokens():
    """A NaN scale (e8m0 255) in expert 3's w13 widens to e4m3 NaNs, which
    reach only the tokens routed to expert 3, whose outputs are NaN; every
    other token's output is right."""
    case = make_case(PREFILL_TOKENS, *TAILS["mxfp4"][1:])
    scales = case["w13"].scales.view(torch.uint8)
    scales[3, 5, 2] = 255
    out = run(case)
    hit = (case["topk_ids"] == 3).any(dim=1)
    ref = w4a8_reference(**dict(case, topk_ids=torch.where(hit[:, None], -1, case["topk_ids"])))
    assert_close(out[~hit], ref[~hit], W4A8_TOLERANCE)
    assert hit.any() and out[hit].isnan().all()
