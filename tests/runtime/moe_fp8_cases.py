"""The cases of the fp8 moe_experts tests (test_gpu_moe_fp8.py and
test_gpu_moe_fp8_decode.py): their shapes, inputs made from exactly
quantized or normal data, and the checks against
gg_runtime.testing.moe_fp8's float64 reference with the tolerances each kind
of data allows (test_gpu_moe_fp8.py's docstring says why these)."""
import math

import pytest
import torch

import gg_runtime
from gg_runtime.testing import randn, rel_error
from gg_runtime.formats import FP8_WEIGHT_SCALINGS
from gg_runtime.testing.moe_fp8 import (exactly_quantized, fp8_experts, moe_experts_fp8_ref,
                                        one_step_changes)

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
        return exactly_quantized((tokens, hidden), FP8_WEIGHT_SCALINGS[kind].rows, 0.25, dtype)
    return randn(tokens, hidden, dtype=dtype)


def make_case(tokens, hidden, inter, experts, k, kind, exact=True, dtype=torch.bfloat16,
              bias=False):
    """moe_experts' keyword arguments: fp8 weights of `kind` (their format,
    "128x128" or "rowwise": gg_runtime.Quantized values) quantized from 16-bit
    ones by quantize_fp8; x and w13 exactly_quantized (exact) or normal."""
    ids, weights = routing(tokens, experts, k)
    if exact:
        # A power of two: the up projection's values about 2 in magnitude.
        unit = 2.0 ** -round(math.log2(4 * hidden ** 0.5))
        w13 = exactly_quantized((experts, 2 * inter, hidden), kind, unit)
    else:
        w13 = randn(experts, 2 * inter, hidden, dtype=torch.bfloat16, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, inter, dtype=torch.bfloat16, scale=inter ** -0.5)
    q13, q2 = fp8_experts(w13, w2, kind)
    case = {"x": token_rows(tokens, hidden, kind, exact, dtype), "topk_ids": ids,
            "topk_weights": weights, "w13": q13, "w2": q2}
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


def up_kind(variant) -> str:
    """The fp8 weights' format (a kind) a variant's scaling axis serves."""
    return "128x128" if variant["axes"]["scaling"] == "blockwise" else "rowwise"


def case_scaling(kind: str) -> str:
    """The kernels' scaling axis value of a weight kind (up_kind's inverse)."""
    return "blockwise" if kind == "128x128" else "rowwise"
