"""moe_experts with fp8 expert weights, and fused_experts (vLLM's entry to
it), on the GPU against gg_runtime.testing.moe_fp8's float64 reference, which
quantizes the activations as the implementation does: both kinds of scales,
H and I multiples of 16 but not of 128, E from 1 to 256, k from 1 to 8, T
from 0 to 4096, every token on one expert, duplicate and dropped ids, both
gate_up layouts and activations, biases, float16 tokens, strided and padded
storage, a non-finite token, CUDA graphs (k, one expert's tokens, the ids,
the non-finite token and the graphs on each up projection kernel's widths,
INTERS); the decode kernel (few slots) forced on every shape and case;
outputs poisoned.

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
from gg_runtime.testing import forced, last_variant, randn, rel_error
from gg_runtime.testing.moe_fp8 import (ACTIVATION_GRANULARITY, KINDS, WEIGHT_GRANULARITY,
                                        dequantized_experts, dequantized_layer,
                                        exactly_quantized, fp8_experts, moe_experts_fp8_ref,
                                        one_step_changes)

from conftest import device_arch, up_projection_runs_on

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]

# Exact data: the outputs' bfloat16 roundings (about 2e-3).
EXACT_TOLERANCE = 4e-3
# Normal data: a float64 model of the tensor cores' accumulation (14 significant
# bits, truncated, every 32 columns) gives up to 1e-2 with per-channel scales
# (whose accumulation spans all of H); tokens quantized at the wrong granularity
# give 4e-2 and more.
RANDOM_TOLERANCE = 2e-2
# A token's own error may exceed the whole output's: a wrong token still shows.
PER_TOKEN_FACTOR = 4
GATE_UP = ("concatenated", "interleaved")
ACTIVATIONS = ("swiglu", "gpt_oss")
# (tokens, hidden, inter, experts, k)
TAILS = (64, 272, 208, 8, 4)  # H and I multiples of 16, not of 128
# The up projection's kernels (aot/families/scaled_ragged_glu.py): the
# warp-specialised one (pingpong tiles up to 512 rows a group, split tiles
# beyond; per-channel groups of at most 32 rows take the Triton kernel), for
# 128 x 128 blocks only where I is a multiple of 64 (else the Triton kernel
# at every size): a kernel for I a multiple of 128 and one for I an odd
# multiple of 64 (I = 320: the up half's blocks start mid-tile).
SMALL_GROUPS = TAILS
SMALL_GROUPS_WHOLE = (64, 272, 256, 8, 4)
SMALL_GROUPS_HALVES = (64, 272, 320, 8, 4)
LARGE_GROUPS = (1024, 272, 256, 4, 2)
LARGE_GROUPS_HALVES = (1024, 272, 320, 4, 2)
LARGE_GROUPS_TAILS = (1024, 272, 208, 4, 2)
# Expert widths that take each up projection kernel (the edge-case tests run
# each): the Triton kernel with 128 x 128 blocks (I = 208), the
# warp-specialised one for whole halves (256) and for odd halves (320).
INTERS = {"tails": 208, "whole": 256, "halves": 320}
every_inter = pytest.mark.parametrize("inter", INTERS.values(), ids=INTERS)
SHAPES = {
    "tile_tails": TAILS,
    "smallest": (5, 16, 16, 4, 2),
    "one_token_k8": (1, 272, 208, 16, 8),
    "seven_tokens": (7, 272, 208, 8, 3),
    "one_expert": (64, 272, 208, 1, 1),
    "e256_k8": (512, 256, 128, 256, 8),
    "t4096": (4096, 512, 256, 16, 4),
    "large_groups_tails": LARGE_GROUPS_TAILS,
    "large_groups_halves": LARGE_GROUPS_HALVES,
}


def routing(tokens, experts, k):
    """(topk_ids, topk_weights): k distinct experts per token, softmax weights."""
    weights, ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=-1)
    return ids, weights.softmax(-1)


def token_rows(tokens, hidden, kind, exact=True, dtype=torch.bfloat16):
    if exact:
        return exactly_quantized((tokens, hidden), ACTIVATION_GRANULARITY[kind], 0.25, dtype)
    return randn(tokens, hidden, dtype=dtype)


def make_case(tokens, hidden, inter, experts, k, kind, exact=True, dtype=torch.bfloat16,
              bias=False):
    """moe_experts' keyword arguments: fp8 weights of `kind` quantized from
    16-bit ones by quantize_fp8; x and w13 exactly_quantized (exact) or normal."""
    ids, weights = routing(tokens, experts, k)
    if exact:
        # A power of two: the up projection's values about 2 in magnitude.
        unit = 2.0 ** -round(math.log2(4 * hidden ** 0.5))
        w13 = exactly_quantized((experts, 2 * inter, hidden), WEIGHT_GRANULARITY[kind], unit)
    else:
        w13 = randn(experts, 2 * inter, hidden, dtype=torch.bfloat16, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, inter, dtype=torch.bfloat16, scale=inter ** -0.5)
    q13, s13, q2, s2 = fp8_experts(w13, w2, kind)
    case = {"x": token_rows(tokens, hidden, kind, exact, dtype), "topk_ids": ids,
            "topk_weights": weights, "w13": q13, "w2": q2, "w13_scale": s13, "w2_scale": s2}
    if bias:
        case.update(b13=randn(experts, 2 * inter, dtype=dtype, scale=0.1),
                    b2=randn(experts, hidden, dtype=dtype, scale=0.1))
    return case


def assert_close(out, ref, tolerance, one_step=None):
    """The whole output within tolerance of the reference, each token's row
    within PER_TOKEN_FACTOR times that (a token whose reference is 0, all its
    slots dropped: exactly 0), plus, given `one_step` (one_step_changes), one
    activation element moved one e4m3 step: exactly quantized data make few
    such elements, but with thousands of slots one may land on a token whose
    row it moves past the factor."""
    error = rel_error(out, ref)
    assert error <= tolerance, f"relative error {error:.2e} > {tolerance:.0e}"
    if out.shape[0]:
        diff, norm = (out.double() - ref).norm(dim=1), ref.norm(dim=1)
        if one_step is not None:
            diff = (diff - one_step).clamp(min=0)
        per_token = torch.where(norm > 0, diff / norm.clamp(min=1e-300), diff)
        worst = int(per_token.argmax())
        assert per_token[worst] <= PER_TOKEN_FACTOR * tolerance, \
            f"token {worst}: relative error {float(per_token[worst]):.2e}"


def assert_matches_reference(out, case, tolerance, **options):
    """assert_close against moe_experts_fp8_ref, one activation step allowed."""
    assert_close(out, moe_experts_fp8_ref(**case, **options), tolerance,
                 one_step_changes(**case, **options))


def check(case, tolerance=EXACT_TOLERANCE, **options):
    """moe_experts against the reference; returns its output."""
    out = gg_runtime.moe_experts(**case, **options)
    assert out.shape == case["x"].shape and out.dtype == case["x"].dtype
    assert_matches_reference(out, case, tolerance, **options)
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES)
def test_shapes(kind, shape):
    tokens, hidden, inter, experts, k = shape
    case = make_case(*shape, kind)
    scale_shapes = {
        "blockwise": [(experts, math.ceil(2 * inter / 128), math.ceil(hidden / 128)),
                      (experts, math.ceil(hidden / 128), math.ceil(inter / 128))],
        "channelwise": [(experts, 2 * inter), (experts, hidden)]}[kind]
    assert [tuple(case[n].shape) for n in ("w13_scale", "w2_scale")] == scale_shapes
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gate_up", GATE_UP)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("shape", [SMALL_GROUPS, LARGE_GROUPS], ids=["small", "large"])
def test_layouts_activations_and_biases(kind, gate_up, activation, bias, shape):
    case = make_case(*shape, kind, bias=bias)
    if activation == "gpt_oss":  # many gate and up values past the clamps (+-7)
        case["w13_scale"] = case["w13_scale"] * 4
    check(case, gate_up=gate_up, activation=activation)


# Serving's: those that do not keep gu (test_gpu_moe_fp8_training.py forces the others).
UP_KERNELS = [v for v in _C.variants() if v["arch"] == 90 and v["family"] == "scaled_ragged_glu"
              and v["axes"]["gu"] == "dropped"]


def up_kind(variant) -> str:
    return "blockwise" if variant["axes"]["scaling"] == "blockwise" else "channelwise"


def case_scaling(kind: str) -> str:
    """The kernels' scaling axis value of a weight kind (up_kind's inverse)."""
    return "blockwise" if kind == "blockwise" else "rowwise"


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


# The decode kernels, which calls of few slots take: the one-kernel forward
# (aot/families/scaled_experts_decode.py) and the up projection of the forward
# with each unit's H cut into parts (scaled_decode_up.py, which forces that
# path and its down projection), forced here on shapes of up to their most
# slots, so that they meet many rows an expert too, each forced variant's
# scales, gate/up layout and tokens' dtype; past their most slots they are
# refused.
DECODE_KERNELS = [v for v in _C.variants() if v["arch"] == 90
                  and v["family"] in ("scaled_experts_decode", "scaled_decode_up")]
decode_kernels = pytest.mark.parametrize("variant", DECODE_KERNELS,
                                         ids=[v["key"] for v in DECODE_KERNELS])
MAX_DECODE_SLOTS = _C.families()["scaled_experts_decode"]["constants"]["kMaxSlots"]
# Groups of several slots, whole tiles and cut ones (I not a multiple of 128).
DECODE_GROUPS = (16, 272, 208, 8, 4)
DECODE_SHAPES = {
    "smallest": SHAPES["smallest"],
    "one_token_k8": SHAPES["one_token_k8"],
    "seven_tokens": SHAPES["seven_tokens"],
    "one_expert": SHAPES["one_expert"],  # its most slots, on one expert: four tiles
    "groups": DECODE_GROUPS,
    "groups_halves": (16, 272, 320, 8, 4),
    "e256_k8": (8, 256, 128, 256, 8),
    # Few units and a wide H: the split forward cuts each into 4 parts of
    # 5, 5, 5 and 2 of H's 17 blocks.
    "many_parts": (3, 2064, 208, 64, 8),
    "one_slot_too_many": (MAX_DECODE_SLOTS + 1, 272, 208, 1, 1),
}


def decode_runs_on(variant, case) -> bool:
    """Whether a scaled_experts_decode variant runs the call: the family's
    conditions (aot/families/scaled_experts_decode.py), which its key ends
    with: `few_slots`, at most its most slots, and `few_units`, a bound on the
    units too."""
    slots, experts, inter = case["topk_ids"].numel(), case["w2"].shape[0], case["w2"].shape[2]
    if slots > MAX_DECODE_SLOTS:
        return False
    return not variant["key"].endswith("_few_units") or \
        min(slots, experts) * math.ceil(inter / 128) <= 128


def decode_case(variant, shape, **options):
    """make_case for the variant's scales and tokens' dtype."""
    return make_case(*shape, up_kind(variant), dtype=getattr(torch, variant["dtype"]), **options)


def check_decode(variant, case, tolerance=EXACT_TOLERANCE, **options):
    """moe_experts with `variant` forced (its scales and tokens' dtype must be
    case's), against the reference; returns its output.  A variant whose
    conditions the call does not meet is refused."""
    options["gate_up"] = variant["axes"]["gate_up"]
    if not decode_runs_on(variant, case):
        with forced(variant["key"]), pytest.raises(ValueError, match="cannot run this problem"):
            gg_runtime.moe_experts(**case, **options)
        return None
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, **options)
        assert last_variant().startswith("combine_parts.")
    assert_matches_reference(out, case, tolerance, **options)
    return out


@decode_kernels
@pytest.mark.parametrize("shape", DECODE_SHAPES.values(), ids=DECODE_SHAPES)
def test_decode_kernel_on_every_shape(variant, shape):
    check_decode(variant, decode_case(variant, shape))


@decode_kernels
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("exact", [True, False], ids=["exact", "random"])
def test_decode_kernel_activations_biases_and_random_data(variant, activation, exact):
    case = decode_case(variant, DECODE_GROUPS, exact=exact, bias=True)
    if activation == "gpt_oss" and exact:  # many gate and up values past the clamps
        case["w13_scale"] = case["w13_scale"] * 4
    check_decode(variant, case, EXACT_TOLERANCE if exact else RANDOM_TOLERANCE,
                 activation=activation)


@decode_kernels
@pytest.mark.parametrize("inter", [16, *INTERS.values()])
def test_decode_kernel_duplicate_dropped_and_non_finite(variant, inter):
    """A token naming an expert twice, dropped slots (a token with all of
    them: zeros), a NaN and an inf in two tokens (the others as the
    reference), on widths of one partial chunk of h and more."""
    case = decode_case(variant, (16, 272, inter, 8, 4))
    ids = case["topk_ids"]
    ids[:, 1] = ids[:, 0]
    ids[::7, 2] = -1
    ids[0] = torch.tensor([8, 9, 2 ** 31 - 1, -300])
    out = check_decode(variant, case)
    assert out[0].eq(0).all()
    case["x"][3, 10] = float("nan")
    case["x"][13, 200] = float("inf")
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"])
    good = torch.ones(16, dtype=torch.bool, device="cuda")
    good[[3, 13]] = False
    assert torch.isfinite(out[good]).all()
    reference = moe_experts_fp8_ref(**case, gate_up=variant["axes"]["gate_up"])
    assert_close(out[good], reference[good], EXACT_TOLERANCE)


@decode_kernels
def test_decode_kernel_reads_strided_tokens(variant):
    """Tokens in padded rows 8 bytes into them, and one such row alone (the
    kernel copies rows 16 bytes at a time: the operator copies them)."""
    case = decode_case(variant, DECODE_GROUPS)
    x = case["x"]
    padded = torch.empty(x.shape[0], x.shape[1] + 24, dtype=x.dtype, device="cuda")
    padded[:, 4:4 + x.shape[1]] = x
    case["x"] = padded[:, 4:4 + x.shape[1]]
    check_decode(variant, case)
    for name in ("x", "topk_ids", "topk_weights"):
        case[name] = case[name][5:6]
    check_decode(variant, case)


SPLIT_DOWN_KERNELS = [v for v in _C.variants() if v["arch"] == 90
                      and v["family"] == "scaled_decode_down"]


@pytest.mark.parametrize("variant", SPLIT_DOWN_KERNELS, ids=[v["key"] for v in SPLIT_DOWN_KERNELS])
def test_split_decode_down_projection_forced(variant):
    """Each down projection of the split decode forward forced (which forces
    that path), biases and gpt-oss's activation on a width of a partial chunk
    of h, H of three parts."""
    kind = up_kind(variant)
    case = make_case(*DECODE_GROUPS, kind, bias=True)
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"],
                                     activation="gpt_oss")
    reference = moe_experts_fp8_ref(**case, gate_up=variant["axes"]["gate_up"],
                                    activation="gpt_oss")
    assert_close(out, reference, EXACT_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
def test_combine_parts_forced(kind):
    """combine_parts' variant forced: the decode path, whatever the slots
    (here as many as it takes, with groups of about 4 rows)."""
    (variant,) = [v for v in _C.variants() if v["arch"] == 90 and v["family"] == "combine_parts"]
    case = make_case(MAX_DECODE_SLOTS // 2, 272, 208, 16, 2, kind)
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case)
    assert_close(out, moe_experts_fp8_ref(**case), EXACT_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
def test_few_slots_take_the_decode_kernel(kind):
    """A token's 8 slots and 4 tokens' 16 among 16 experts: the decode kernel
    and its combine; 17 slots, more than the experts, and 4096 tokens' 8192:
    the two projections and the combine."""
    for tokens, k, family in ((1, 8, "combine_parts"), (4, 4, "combine_parts"),
                              (17, 1, "combine"), (4096, 2, "combine")):
        case = make_case(tokens, 272, 208, 16, k, kind)
        out = gg_runtime.moe_experts(**case)
        assert last_variant().startswith(family + ".")
        assert_close(out, moe_experts_fp8_ref(**case), EXACT_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [1, 2])
def test_few_units_take_the_split_decode(kind, tokens):
    """A token or two among 64 experts with a wide H: few units, each cut
    into parts of H by the dispatch itself (csrc/ops/expert_products_fp8.cc
    decode_splits), against the reference and the one-kernel forward."""
    case = make_case(tokens, 2064, 208, 64, 8, kind)
    out = gg_runtime.moe_experts(**case)
    assert_close(out, moe_experts_fp8_ref(**case), EXACT_TOLERANCE)
    (one_kernel,) = [v for v in DECODE_KERNELS if v["family"] == "scaled_experts_decode"
                     and v["axes"] == {"scaling": case_scaling(kind), "gate_up": "concatenated"}
                     and v["dtype"] == "bfloat16" and v["key"].endswith("_few_slots")]
    with forced(one_kernel["key"]):
        assert_close(out, gg_runtime.moe_experts(**case), EXACT_TOLERANCE)


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
    for name in ("w13", "w2", "w13_scale", "w2_scale"):
        case[name] = case[name][:0]
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
    """x given in fp8 with x_scale (quantize_fp8 at the weights' granularity,
    per-token scales also as [T, 1]): bfloat16 out, the 16-bit tokens' result
    to the bit where both take the same kernels (many slots; per-channel
    weights' decode kernel, which reads the tokens quantized either way).
    Blockwise tokens given quantized take the two projections' kernels at
    any size: the reference's result."""
    case = make_case(tokens, 272, 208, 16, k, kind, dtype=torch.float16, bias=True)
    q, scale = gg_runtime.quantize_fp8(case["x"], ACTIVATION_GRANULARITY[kind])
    want = gg_runtime.moe_experts(**case)
    for x_scale in (scale, scale[:, None]) if kind == "channelwise" else (scale,):
        # Biases in the output's dtype (or float32).
        biases = {n: case[n].bfloat16() for n in ("b13", "b2")}
        got = gg_runtime.moe_experts(**{**case, **biases, "x": q}, x_scale=x_scale)
        assert got.dtype == torch.bfloat16
        if kind == "blockwise" and tokens * k <= 16:
            assert last_variant().startswith("combine.")
        else:
            assert torch.equal(got.to(want.dtype), want)  # the same bfloat16 sums, converted
        assert_matches_reference(got.to(case["x"].dtype), case, EXACT_TOLERANCE)


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
        w = case[name]
        wide = torch.empty(*w.shape[:2], w.shape[2] + 32, dtype=w.dtype, device="cuda")
        case[name] = wide[..., :w.shape[2]]
        case[name].copy_(w)
        scale = case[f"{name}_scale"]
        case[f"{name}_scale"] = (scale.unsqueeze(-1) if kind == "channelwise"
                                 else scale.mT.contiguous().mT)
    check(case)


@pytest.mark.parametrize("kind", KINDS)
@every_inter
def test_non_finite_token_stays_in_its_row(kind, inter):
    """A NaN in one token, an inf in another: every other token finite and
    as the reference (what the two get is undefined: their rows' scales are)."""
    case = make_case(160, 272, inter, 8, 4, kind)
    case["x"][3, 10] = float("nan")
    case["x"][40, 200] = float("inf")
    out = gg_runtime.moe_experts(**case)
    good = torch.ones(160, dtype=torch.bool, device="cuda")
    good[[3, 40]] = False
    assert torch.isfinite(out[good]).all()
    assert_close(out[good], moe_experts_fp8_ref(**case)[good], EXACT_TOLERANCE)


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
    return {"block_shape": [128, 128]} if kind == "blockwise" else {"per_channel_quant": True}


def fused(case, **options):
    return gg_runtime.fused_experts(case["x"], case["w13"], case["w2"], case["topk_weights"],
                                    case["topk_ids"], use_fp8_w8a8=True,
                                    w1_scale=case["w13_scale"], w2_scale=case["w2_scale"],
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
    if kind == "blockwise":  # block_shape None: the scales' shapes say blocks
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
    case = make_case(*shape, "blockwise", exact=False)
    exact = dequantized_layer(**case)
    fp8 = gg_runtime.moe_experts(**case)
    w13, w2 = (w.bfloat16() for w in dequantized_experts(
        case["w13"], case["w2"], case["w13_scale"], case["w2_scale"]))
    bf16 = gg_runtime.moe_experts(case["x"], case["topk_ids"], case["topk_weights"], w13, w2)
    errors = {"fp8_vs_exact": rel_error(fp8, exact), "bf16_vs_exact": rel_error(bf16, exact),
              "fp8_vs_bf16": rel_error(fp8, bf16.double())}
    for name, error in errors.items():
        record_property(name, error)
    print(f"\nfp8 moe_experts, 128 x 128 blocks, (T, H, I, E, k) = {shape}: "
          + ", ".join(f"{name} {error:.2e}" for name, error in errors.items()))
    assert errors["bf16_vs_exact"] < errors["fp8_vs_exact"] < 0.1


def test_other_gpu_paths_are_refused():
    case = make_case(*TAILS, "blockwise")
    gg_runtime.force_ptx(True)  # the sm80 path, which has no fp8 kernels
    try:
        with pytest.raises(gg_runtime.UnsupportedDeviceError, match="compute capability 9.0"):
            gg_runtime.moe_experts(**case)
    finally:
        gg_runtime.force_ptx(False)
