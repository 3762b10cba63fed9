"""Every compiled variant that can run on this GPU, forced by key, on shapes
that are multiples of no tile (inner sizes kept multiples of 16 for the `tma`
and `aligned` flavours, whose rules need them).  Covers exactly what the wheel ships: each dtype,
output dtype and axis value."""
import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import (FP8_TOLERANCE, forced, fp8_moe_inputs, last_variant,
                                offsets_from_counts, randn, ref_grouped_mm, ref_list,
                                ref_scaled_grouped_mm, rel_error, tf32_allowed, tolerance)

from conftest import device_arch

# Families the runners below do not run: their own test file forces each
# variant (with its exact reference), or, for the 4-bit ones, reaches each
# kernel's tile size through the dispatch.
OWN_TEST = {"quantize_fp8": "test_gpu_quantize.py",
            "quantize_fp8_columns": "test_gpu_quantize_columns.py",
            "swiglu": "test_gpu_moe_operators.py",
            "ragged_glu": "test_gpu_moe_operators.py", "gathered_m": "test_gpu_moe_operators.py",
            "gathered_k": "test_gpu_moe_operators.py", "combine": "test_gpu_moe_operators.py",
            "route": "test_gpu_moe_operators.py", "scaled_ragged_glu": "test_gpu_moe_fp8.py",
            "scaled_ragged_k": "test_gpu_fp8_grouped_mm.py",
            "scaled_experts_decode": "test_gpu_moe_fp8_decode.py",
            "scaled_decode_split": "test_gpu_moe_fp8_decode.py",
            "combine_parts": "test_gpu_moe_fp8_decode.py",
            "w4_glu": "test_gpu_moe_w4.py", "w4_ragged_m": "test_gpu_moe_w4.py",
            "w4_decode_glu": "test_gpu_moe_w4.py", "w4_decode_down": "test_gpu_moe_w4.py",
            "w4_decode_split": "test_gpu_moe_w4.py", "widen_mxfp4": "test_gpu_moe_w4.py",
            "swiglu_backward_fp8": "test_gpu_swiglu_backward_fp8.py",
            "dispatch_plan": "test_gpu_expert_parallel_plan.py",
            "received_slots": "test_gpu_expert_parallel_plan.py",
            "send_rows": "test_gpu_send_rows.py", "send_fp8_rows": "test_gpu_send_rows.py",
            "sum_peer_rows": "test_gpu_send_rows.py"}
RUNNABLE = [v for v in _C.variants() if v["arch"] == device_arch() and v["family"] not in OWN_TEST]
pytestmark = pytest.mark.usefixtures("poison")


def sizes(variant, aligned, odd):
    """A multiple of 16 for the tma and aligned flavours, odd for basic."""
    return odd if variant["flavour"] == "basic" else aligned


def matrix(rows, cols, transposed, dtype):
    """[rows, cols], row-major or a transposed view of a row-major [cols, rows]."""
    return randn(cols, rows, dtype=dtype).t() if transposed else randn(rows, cols, dtype=dtype)


def run_list(v, dtype, out_dtype):
    trans_b = v["axes"]["b_major"] == "column"
    mnks = [(sizes(v, 144, 131), sizes(v, 208, 203), sizes(v, 80, 77)), (0, 16, 16),
            (sizes(v, 48, 37), sizes(v, 272, 261), sizes(v, 304, 299)), (1, 16, 16)]
    As = [randn(m, k, dtype=dtype) for m, n, k in mnks]
    Bs = [randn(n, k, dtype=dtype) if trans_b else randn(k, n, dtype=dtype) for m, n, k in mnks]
    Cs = gg_runtime.grouped_gemm(As, Bs, trans_b=trans_b)
    return list(zip(Cs, ref_list(As, Bs, trans_b)))


def ragged_m_operands(v, rows, k, n, groups, dtype):
    """(a [rows, K], b [G, K, N]) stored as the variant's axes say.  rows is
    rounded up to a multiple of 16: gg_runtime reads a stored [K, T] a in place
    only with a 16-byte aligned row stride, else copies it to row-major."""
    rows += -rows % 16
    a = matrix(rows, k, v["axes"]["a_major"] == "column", dtype)
    b = (randn(groups, n, k, dtype=dtype).transpose(1, 2) if v["axes"]["b_major"] == "column"
         else randn(groups, k, n, dtype=dtype))
    return a, b


def ragged_m_product(v, a, b, offs, out_dtype):
    """(out, ref) [rows, N] of ragged_m's operands a [rows, K] and b [G, K, N]
    on the variant's axes.  Its c column-major (stored transposed): 3-D x 2-D
    (ragged N) on their transposes, whose [N, rows] output ragged_m writes
    transposed, returned transposed back."""
    if v["axes"]["c_major"] == "row":
        return gg_runtime.grouped_mm(a, b, offs, out_dtype=out_dtype), ref_grouped_mm(a, b, offs)
    a, b = b.transpose(1, 2), a.t()
    out = gg_runtime.grouped_mm(a, b, offs, out_dtype=out_dtype)
    assert out.is_contiguous()
    return out.t(), ref_grouped_mm(a, b, offs).t()


def run_ragged_m(v, dtype, out_dtype):
    k, n = sizes(v, 112, 99), sizes(v, 144, 133)
    counts = [150, 0, 3, 260, 70]
    a, b = ragged_m_operands(v, sum(counts) + 9, k, n, len(counts), dtype)
    offs = offsets_from_counts(counts, "cuda")
    return [ragged_m_product(v, a, b, offs, out_dtype)]


def ragged_k_a(v, m, total, dtype):
    """a [M, T] stored as the variant's axes say: a row-major one is read in
    place only with a 16-byte aligned row stride (gg_runtime copies it
    otherwise), so its T is rounded up to a multiple of 16."""
    if v["axes"]["a_major"] == "column":
        return randn(total, m, dtype=dtype).t()
    return randn(m, total + -total % 16, dtype=dtype)[:, :total]


def run_ragged_k(v, dtype, out_dtype):
    m, n = sizes(v, 80, 67), sizes(v, 144, 131)
    counts = [150, 0, 33, 260]
    total = sizes(v, 448, sum(counts))
    counts[-1] += total - sum(counts)
    a = ragged_k_a(v, m, total, dtype)
    b = randn(total, n, dtype=dtype)
    offs = offsets_from_counts(counts, "cuda")
    return [(gg_runtime.grouped_mm(a, b, offs, out_dtype=out_dtype), ref_grouped_mm(a, b, offs))]


def scaled_call(v, counts, n, k, out_dtype):
    """(out, ref) of scaled_grouped_mm on the variant's axes: its scaling
    (rowwise or blockwise scales) and accumulation (fast: use_fast_accum)."""
    granularity = v["axes"]["scaling"]
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, n, k, granularity)
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=out_dtype,
                                       use_fast_accum=v["axes"]["accumulation"] == "fast")
    return out, ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, granularity)


def run_scaled_ragged_m(v, dtype, out_dtype):
    return [scaled_call(v, [150, 0, 3, 260, 70], 144, 208, out_dtype)]


RUNNERS = {"grouped_gemm": run_list, "ragged_m": run_ragged_m, "ragged_k": run_ragged_k,
           "scaled_ragged_m": run_scaled_ragged_m}


def test_every_family_has_a_runner_or_its_own_test():
    """A family added without a runner here or an entry in OWN_TEST would fail
    test_variant on a GPU only: this holds on any machine."""
    missing = sorted(set(_C.families()) - set(RUNNERS) - set(OWN_TEST))
    assert not missing, f"families with neither a runner nor their own test: {missing}"


def dtypes(variant) -> tuple:
    """(input dtype, output dtype, whether TF32 is allowed) of a variant."""
    tf32 = variant["dtype"] == "tf32"
    dtype = torch.float32 if tf32 else getattr(torch, variant["dtype"])
    return dtype, getattr(torch, variant["out_dtype"]), tf32


@pytest.mark.skipif(not RUNNABLE, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("variant", RUNNABLE, ids=[v["key"] for v in RUNNABLE])
def test_variant(variant):
    dtype, out_dtype, tf32 = dtypes(variant)
    with forced(variant=variant["key"]), tf32_allowed(tf32):
        pairs = RUNNERS[variant["family"]](variant, dtype, out_dtype)
        assert last_variant() == variant["key"]
    torch.cuda.synchronize()
    allowed = FP8_TOLERANCE[out_dtype] if dtype is torch.float8_e4m3fn else \
        tolerance(dtype, out_dtype, tf32)
    for out, ref in pairs:
        assert out.dtype == out_dtype
        assert rel_error(out, ref) < allowed


PERSISTENT = [v for v in RUNNABLE if v["family"] in ("ragged_m", "ragged_k", "scaled_ragged_m")
              and v["flavour"] == "tma"]


def many_groups() -> list:
    """200 groups: several of the kernels' 64-group chunks, some empty, some of one row."""
    counts = torch.randint(0, 160, (200,), generator=torch.Generator().manual_seed(0))
    counts[::17] = 0
    counts[5::31] = 1
    return counts.tolist()


@pytest.mark.skipif(not PERSISTENT, reason="needs a GPU with ragged_m tma kernels")
@pytest.mark.parametrize("variant", PERSISTENT, ids=[v["key"] for v in PERSISTENT])
def test_persistent_many_groups_tiles_and_k_blocks(variant):
    """Where test_variant's call is one tile per program, this one gives each
    program many tiles of many groups and many K blocks (more than any ring of
    stages), and rows past the last group: ragged M writes them zero, ragged K
    must not add them."""
    if variant["family"] == "ragged_k":
        # M < N, then M > N: the tiles' order follows the shorter side (k_tile_origin).
        for m, n in ((208, 784), (784, 208)):
            check_ragged_k_many_groups(variant, many_groups(), m, n)
        return
    dtype, out_dtype, tf32 = dtypes(variant)
    counts, k, n = many_groups(), 1040, 784
    if variant["key"].endswith("_few_tiles"):  # its condition: few groups x column tiles
        with forced(variant=variant["key"]), pytest.raises(ValueError, match="cannot run"):
            scaled_call(variant, counts, n, k, out_dtype)
        return
    with forced(variant=variant["key"]), tf32_allowed(tf32):
        if variant["family"] == "scaled_ragged_m":
            out, ref = scaled_call(variant, counts, n, k, out_dtype)
            allowed = FP8_TOLERANCE[out_dtype]
        else:
            a, b = ragged_m_operands(variant, sum(counts) + 70, k, n, len(counts), dtype)
            offs = offsets_from_counts(counts, "cuda")
            out, ref = ragged_m_product(variant, a, b, offs, out_dtype)
            allowed = tolerance(dtype, out_dtype, tf32)
    torch.cuda.synchronize()
    assert rel_error(out, ref) < allowed
    assert torch.all(out[sum(counts):] == 0)


def check_ragged_k_many_groups(variant, counts, m, n):
    """The ragged_k part of test_persistent_many_groups_tiles_and_k_blocks:
    out [G, m, n] with 70 rows past the last group, which it must not add."""
    dtype, out_dtype, tf32 = dtypes(variant)
    a = ragged_k_a(variant, m, sum(counts) + 70, dtype)
    b = randn(sum(counts) + 70, n, dtype=dtype)
    offs = offsets_from_counts(counts, "cuda")
    with forced(variant=variant["key"]), tf32_allowed(tf32):
        out = gg_runtime.grouped_mm(a, b, offs, out_dtype=out_dtype)
    assert rel_error(out, ref_grouped_mm(a, b, offs)) < tolerance(dtype, out_dtype, tf32)


def test_forcing_a_variant_that_cannot_run_is_an_error():
    if not RUNNABLE:
        pytest.skip("needs a GPU this wheel has kernels for")
    other_dtype = next(v["key"] for v in RUNNABLE
                       if v["family"] == "ragged_m" and v["dtype"] == "bfloat16")
    a = randn(8, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="cannot run this problem"), forced(variant=other_dtype):
        gg_runtime.grouped_mm(a, randn(1, 8, 8, dtype=torch.float16),
                              torch.tensor([8], dtype=torch.int32, device="cuda"))
    # Another family's variant leaves this call's dispatch alone.
    with forced(next(v["key"] for v in RUNNABLE if v["family"] == "grouped_gemm")):
        gg_runtime.grouped_mm(a, randn(1, 8, 8, dtype=torch.float16),
                              torch.tensor([8], dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="no variant nonsense in this build"), forced("nonsense"):
        gg_runtime.grouped_mm(a, randn(1, 8, 8, dtype=torch.float16),
                              torch.tensor([8], dtype=torch.int32, device="cuda"))
