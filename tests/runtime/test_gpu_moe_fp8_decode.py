"""fp8 moe_experts' decode path (few slots) on the GPU against
gg_runtime.testing.moe_fp8's float64 reference: the one-kernel forward
(scaled_experts_decode) and the forward split over H in one launch
(scaled_decode_split), each variant forced on shapes of up to their most slots,
with both activations, biases, dropped, duplicate and non-finite ids and
strided tokens; the dispatch's own choice between them and the routed path;
outputs poisoned.  The data and tolerances are test_gpu_moe_fp8.py's
(moe_fp8_cases.py)."""
import math

import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import forced, last_variant
from gg_runtime.testing.moe_fp8 import KINDS, moe_experts_fp8_ref

from conftest import device_arch
from moe_fp8_cases import (ACTIVATIONS, EXACT_TOLERANCE, INTERS, RANDOM_TOLERANCE, SHAPES,
                           assert_close, assert_matches_reference, case_scaling, make_case,
                           up_kind)

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]


# The decode kernels, which calls of few slots take: the one-kernel forward
# (aot/families/scaled_experts_decode.py) and the forward with each slot's H
# cut into parts (scaled_decode_split.py, which forcing forces that path),
# forced here on shapes of up to their most slots, so that they meet many
# rows an expert too, each forced variant's scales, gate/up layout and
# tokens' dtype; past their most slots (the split's `wide` config: or where
# H is narrower than 4096) they are refused.
DECODE_KERNELS = [v for v in _C.variants() if v["arch"] == 90
                  and v["family"] in ("scaled_experts_decode", "scaled_decode_split")]
decode_kernels = pytest.mark.parametrize("variant", DECODE_KERNELS,
                                         ids=[v["key"] for v in DECODE_KERNELS])
# The combine of the decode path's parts: one variant for tokens of few parts.
COMBINE_PARTS = [v for v in _C.variants() if v["arch"] == 90 and v["family"] == "combine_parts"]
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
    # H past 4096 (the split's `wide` config), not a multiple of 128.
    "wide": (2, 4112, 208, 16, 8),
    # 40 (slot, chunk) pairs a token (the split's `many_pairs` config: two
    # down steps of 32), I not a multiple of 128.
    "many_pairs": (2, 528, 560, 16, 8),
    "one_slot_too_many": (MAX_DECODE_SLOTS + 1, 272, 208, 1, 1),
}


def decode_runs_on(variant, case) -> bool:
    """Whether a decode variant runs the call: its family's conditions
    (aot/families/scaled_experts_decode.py, scaled_decode_split.py), which
    its key ends with: `few_slots`, at most its most slots; `few_units`, a
    bound on the units too; `wide`, H of at least 4096 too; `many_pairs`,
    more than 16 (slot, chunk) pairs a token too."""
    slots, (experts, hidden, inter) = case["topk_ids"].numel(), case["w2"].values.shape
    if slots > MAX_DECODE_SLOTS:
        return False
    if variant["key"].endswith("_wide"):
        return hidden >= 4096
    if variant["key"].endswith("_many_pairs"):
        return case["topk_ids"].shape[1] * math.ceil(inter / 128) > 16
    return not variant["key"].endswith("_few_units") or \
        min(slots, experts) * math.ceil(inter / 128) <= 256


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
        split = variant["family"] == "scaled_decode_split"
        assert last_variant().startswith("scaled_decode_split." if split else "combine_parts.")
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
        case["w13"] = case["w13"]._replace(scales=case["w13"].scales * 4)
    check_decode(variant, case, EXACT_TOLERANCE if exact else RANDOM_TOLERANCE,
                 activation=activation)


@decode_kernels
@pytest.mark.parametrize("inter", [16, *INTERS.values()])
def test_decode_kernel_duplicate_dropped_and_non_finite(variant, inter):
    """A token naming an expert twice, dropped slots (a token with all of
    them: zeros), a NaN and an inf in two tokens (the others as the
    reference, the two's outputs NaN), on widths of one partial chunk of h
    and more."""
    case = decode_case(variant, (16, 272, inter, 8, 4))
    ids = case["topk_ids"]
    ids[:, 1] = ids[:, 0]
    ids[::7, 2] = -1
    ids[0] = torch.tensor([8, 9, 2 ** 31 - 1, -300])
    out = check_decode(variant, case)
    if out is None:  # refused: H is narrower than the variant's
        return
    assert out[0].eq(0).all()
    case["x"][3, 10] = float("nan")
    case["x"][13, 200] = float("inf")
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"])
    good = torch.ones(16, dtype=torch.bool, device="cuda")
    good[[3, 13]] = False
    assert torch.isfinite(out[good]).all()
    assert out[~good].isnan().all()
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


@decode_kernels
def test_decode_kernel_forced_with_no_tokens(variant):
    """T = 0 with a decode kernel forced: an empty output (the operator returns
    before any launch, on every path)."""
    case = decode_case(variant, (0, 272, 208, 8, 4))
    with forced(variant["key"]):
        out = gg_runtime.moe_experts(**case, gate_up=variant["axes"]["gate_up"])
    assert out.shape == (0, 272) and out.dtype == case["x"].dtype


@decode_kernels
@pytest.mark.parametrize("programs", [1, 5])
def test_decode_kernel_with_several_units_a_program(variant, programs):
    """The call's 48 units walked by fewer programs (gg_runtime.sm_limit), so
    that each program's rings run on from unit to unit, over an H of 17
    blocks (the warp-specialised kernel's units: 9 up steps and 5 down)."""
    case = decode_case(variant, (3, 2064, 208, 64, 8))
    with gg_runtime.sm_limit(programs):
        check_decode(variant, case)


SPLIT_KERNELS = [v for v in DECODE_KERNELS if v["family"] == "scaled_decode_split"]


@pytest.mark.parametrize("variant", SPLIT_KERNELS, ids=[v["key"] for v in SPLIT_KERNELS])
def test_split_decode_forced_with_biases_and_gpt_oss(variant):
    """Each variant of the split decode forward forced, biases and gpt-oss's
    activation on a width of a partial chunk of h, H of 33 blocks (the last
    partial) in parts, 64 slots of 8 experts."""
    case = decode_case(variant, (16, 4112, 208, 8, 4), bias=True)
    check_decode(variant, case, activation="gpt_oss")


# combine_parts' cases: (make_case's arguments, whether a token has few parts
# and H is wide, the few-parts variant's condition): 16 parts of H 4112, 32
# parts, and 16 parts of H 272; each with more units than the split forward
# takes.
COMBINE_CASES = (((5, 4112, 208, 64, 8), True), ((3, 4112, 400, 16, 8), False),
                 ((1, 272, 208, 16, 8), False))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("variant", COMBINE_PARTS, ids=[v["key"] for v in COMBINE_PARTS])
def test_combine_parts_forced(kind, variant):
    """Each combine_parts variant forced: the decode path, whatever the slots
    (as many as it takes, groups of about 4 rows); on each of COMBINE_CASES,
    the one for few parts runs where its condition holds and is refused
    elsewhere, the other runs."""
    few_parts_variant = variant["key"].endswith("_few_parts")
    cases = [(make_case(MAX_DECODE_SLOTS // 2, 4112, 208, 16, 2, kind), True)]
    cases += [(make_case(*shape, kind), few_parts) for shape, few_parts in COMBINE_CASES]
    for case, few_parts in cases:
        with forced(variant["key"]):
            if few_parts_variant and not few_parts:
                with pytest.raises(ValueError, match="cannot run this problem"):
                    gg_runtime.moe_experts(**case)
            else:
                assert_close(gg_runtime.moe_experts(**case), moe_experts_fp8_ref(**case),
                             EXACT_TOLERANCE)


@pytest.mark.parametrize("kind", KINDS)
def test_combine_parts_by_parts_a_token(kind):
    """The dispatch's combine_parts on COMBINE_CASES: the tiles for few parts
    where a token has at most 16 and H is wide, the other elsewhere."""
    for shape, few_parts in COMBINE_CASES:
        case = make_case(*shape, kind)
        assert_close(gg_runtime.moe_experts(**case), moe_experts_fp8_ref(**case),
                     EXACT_TOLERANCE)
        assert last_variant().startswith("combine_parts.")
        assert last_variant().endswith("_few_parts") == few_parts


@pytest.mark.parametrize("kind", KINDS)
def test_few_slots_take_the_decode_kernel(kind):
    """A token's 8 slots, 4 tokens' 16 and 16 tokens' 32 among 16 experts (at
    most two an expert): the decode kernel and its combine; 17 tokens' 34
    slots, more than two an expert, and 4096 tokens' 8192: the two
    projections and the combine."""
    for tokens, k, family in ((1, 8, "combine_parts"), (4, 4, "combine_parts"),
                              (16, 2, "combine_parts"), (17, 2, "combine"),
                              (4096, 2, "combine")):
        case = make_case(tokens, 272, 208, 16, k, kind)
        out = gg_runtime.moe_experts(**case)
        assert last_variant().startswith(family + ".")
        assert_matches_reference(out, case, EXACT_TOLERANCE)  # thousands of slots: one step


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tokens", [1, 2])
def test_few_units_take_the_split_decode(kind, tokens):
    """A token or two among 64 experts with a wide H (41 blocks): few units,
    each cut into parts of H by the dispatch itself (csrc/ops/
    expert_products_fp8_decode.cc decode_splits), against the reference and
    the one-kernel forward."""
    case = make_case(tokens, 5136, 208, 64, 8, kind)
    out = gg_runtime.moe_experts(**case)
    assert last_variant().startswith("scaled_decode_split.")
    assert_close(out, moe_experts_fp8_ref(**case), EXACT_TOLERANCE)
    (one_kernel,) = [v for v in DECODE_KERNELS if v["family"] == "scaled_experts_decode"
                     and v["axes"] == {"scaling": case_scaling(kind), "gate_up": "concatenated"}
                     and v["dtype"] == "bfloat16" and v["key"].endswith("_few_slots")]
    with forced(one_kernel["key"]):
        assert_close(out, gg_runtime.moe_experts(**case), EXACT_TOLERANCE)
