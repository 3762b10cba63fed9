"""scaled_grouped_mm (fp8) on the GPU against float32 products of the
dequantised inputs: both granularities, both output types, shapes that are
multiples of no tile, empty and many groups, strided inputs, CUDA graphs, and
the errors that need CUDA tensors."""
import random

import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import (FP8_TOLERANCE, SCALE_KINDS, dequantized, forced, fp8_moe_inputs,
                                group_parts, last_variant,
                                offsets_from_counts, quantize_ref, random_group_sizes,
                                ref_scaled_grouped_mm, rel_error)

from conftest import device_arch

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]
GRANULARITIES = ("rowwise", "blockwise", "blockwise_rowwise")


def check(counts, n, k, granularity, out_dtype=torch.bfloat16, extra_rows=0, fast=False):
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, n, k, granularity)
    if extra_rows:  # rows past the last group: zeros in the output
        a = torch.cat([a, a[:extra_rows]])
        scale_a = torch.cat([scale_a, scale_a[:extra_rows]])
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=out_dtype,
                                       use_fast_accum=fast)
    ref = ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, granularity)
    assert out.shape == ref.shape and out.dtype == out_dtype
    assert rel_error(out, ref) < FP8_TOLERANCE[out_dtype]
    if extra_rows:
        assert out[sum(counts):].eq(0).all()


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("fast", [False, True], ids=["promoted", "fast"])
@pytest.mark.parametrize("counts,n,k", [
    ([150, 0, 3, 260, 70], 336, 208),  # N, K multiples of 16, not of 128
    ([1000], 128, 128),  # one group
    ([0, 0, 5], 16, 16),
    ([7, 130, 0, 0], 4096 + 16, 1024 + 48),
])
def test_ragged(granularity, out_dtype, fast, counts, n, k):
    check(counts, n, k, granularity, out_dtype, extra_rows=9, fast=fast)


@pytest.mark.parametrize("seed", range(24), ids=[f"seed_{s}" for s in range(24)])
def test_random_problem(seed):
    """Seeded random ragged problems (random_group_sizes: one to 1,200 groups,
    empty ones, up to ~1,500 rows; N and K multiples of 16, not of 128), each
    group's rows checked alone against float64 products of the dequantised
    inputs (per group, twice the whole output's tolerance)."""
    rng = random.Random(seed)
    granularity = rng.choice(GRANULARITIES)
    out_dtype = rng.choice((torch.bfloat16, torch.float32))
    counts = random_group_sizes(rng)
    widest = 80 if len(counts) <= 64 else 16  # 1,200 groups' weights stay within a few GB
    n, k = 16 * rng.randint(1, widest), 16 * rng.randint(1, widest)
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, n, k, granularity)
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=out_dtype)
    a32, b32 = dequantized(a, b, scale_a, scale_b, granularity)
    where = f"{granularity}, {out_dtype}, groups {len(counts)}, rows {sum(counts)}, N {n}, K {k}"
    for group, got, want in group_parts(a32, b32, offs, out):
        if got.numel():
            assert rel_error(got, want) < 2 * FP8_TOLERANCE[out_dtype], f"group {group}: {where}"


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_many_groups(granularity):
    counts = torch.randint(0, 9, (1000,)).tolist()
    counts[3] = 0
    check(counts, 144, 272, granularity)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_no_rows_and_no_k(granularity):
    check([0, 0], 64, 128, granularity)
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([3, 4], 64, 0, granularity)
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    assert out.eq(0).all() and out.shape == (7, 64)


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_batched(granularity):
    groups, m, n, k = 3, 77, 160, 272
    x = torch.randn(groups, m, k, device="cuda")
    w = torch.randn(groups, n, k, device="cuda") * k ** -0.5
    a_kind, b_kind = SCALE_KINDS[granularity]
    a, scale_a = quantize_ref(x, a_kind)
    b, scale_b = quantize_ref(w, b_kind)
    out = gg_runtime.scaled_grouped_mm(a, b.transpose(1, 2), scale_a, scale_b)
    flat = ref_scaled_grouped_mm(a.reshape(groups * m, k), b.transpose(1, 2),
                                 scale_a.reshape(groups * m, *scale_a.shape[2:]), scale_b,
                                 offsets_from_counts([m] * groups), granularity)
    assert out.shape == (groups, m, n)
    assert rel_error(out, flat.view(groups, m, n)) < FP8_TOLERANCE[torch.bfloat16]


def test_strided_inputs():
    """a with a row stride past K, weights a slice of a wider [G, N', K'] tensor."""
    counts, n, k = [40, 0, 90], 96, 160
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, n, k, "rowwise")
    wide_a = torch.zeros(a.shape[0], k + 32, dtype=a.dtype, device="cuda")
    wide_a[:, :k] = a
    wide_b = torch.zeros(3, n + 16, k + 64, dtype=b.dtype, device="cuda")
    wide_b[:, :n, :k] = b.transpose(1, 2)
    out = gg_runtime.scaled_grouped_mm(wide_a[:, :k], wide_b[:, :n, :k].transpose(1, 2),
                                       scale_a, scale_b, offs)
    ref = ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, "rowwise")
    assert rel_error(out, ref) < FP8_TOLERANCE[torch.bfloat16]


def test_cuda_graph_replays_new_offsets():
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([50, 60, 70], 128, 256, "blockwise")
    gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs)  # load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    offs.copy_(offsets_from_counts([100, 0, 80]))
    graph.replay()
    torch.cuda.synchronize()
    ref = ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, "blockwise")
    assert rel_error(out, ref) < FP8_TOLERANCE[torch.bfloat16]


def test_unaligned_pointer_and_missing_kernels_are_errors():
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([5, 6], 32, 64, "rowwise")
    shifted = torch.empty(a.numel() + 16, dtype=a.dtype, device="cuda")[1:a.numel() + 1]
    with pytest.raises(ValueError, match="16-byte aligned data pointers"):
        gg_runtime.scaled_grouped_mm(shifted.view(a.shape), b, scale_a, scale_b, offs)
    gg_runtime.force_ptx(True)  # the sm80 path, which has no fp8 kernels
    try:
        with pytest.raises(gg_runtime.UnsupportedDeviceError, match="compute capability 9.0"):
            gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs)
    finally:
        gg_runtime.force_ptx(False)


# The fast blockwise kernels count a block's scale below this as this
# (scaled_grouped_mm's docstring): per-column b's scales multiply it after.
UNIT_FLOOR = 2.0 ** -100


def blockwise_reference(a, b, scale_a, scale_b, counts):
    """(result, the sum of its terms' magnitudes, what the unit floor may
    add) in float64, K block by K block; scale_b per 128 x 128 block [G,
    N/128, K/128] or per column [G, N]."""
    out = torch.zeros(a.shape[0], b.shape[2], dtype=torch.float64, device=a.device)
    size = torch.zeros_like(out)
    floor = torch.zeros_like(out)
    start = 0
    for g, count in enumerate(counts):
        rows = slice(start, start + count)
        for j in range(scale_a.shape[1]):
            ks = slice(128 * j, 128 * (j + 1))
            columns = scale_b[g] if scale_b.dim() == 2 else \
                scale_b[g, :, j].repeat_interleave(128)[:b.shape[2]]
            scale = scale_a[rows, j, None].double() * columns.double()[None, :]
            x, w = a[rows, ks].double(), b[g, ks].double()
            out[rows] += (x @ w) * scale
            size[rows] += (x.abs() @ w.abs()) * scale.abs()
            after = scale_b[g].double().abs() if scale_b.dim() == 2 else 1.0
            floor[rows] += (x.abs() @ w.abs()) * UNIT_FLOOR * after
        start += count
    return out, size, floor


@pytest.mark.parametrize("key,fast", [(v["key"], v["axes"]["accumulation"] == "fast")
                                      for v in _C.variants() if v["arch"] == 90
                                      and v["family"] == "scaled_ragged_m"
                                      and v["axes"]["scaling"].startswith("blockwise")])
def test_blockwise_scales_far_apart(key, fast):
    """Scales from 1e-30 to 1e10 within one row and one weight block, and
    zeros over nonzero fp8 data: every output element within float32's
    rounding of its terms (the bf16 outputs: of their own rounding).  Groups
    of more and of fewer rows than one MMA partition of the warp-specialised
    kernel takes (64; there the other partition skips the tile).  Zero
    scales of a: the fast kernels count them at the unit floor, which per-
    column scales of b multiply after the sum (up to 1e10 here)."""
    counts, n, k = [70, 0, 130, 40], 384, 640
    a, b, _, _, offs = fp8_moe_inputs(counts, n, k, "blockwise")
    scale_a = 10 ** torch.empty(sum(counts), k // 128, device="cuda").uniform_(-30, 10)
    weight_blocks = (n,) if "blockwise_rowwise" in key else (n // 128, k // 128)
    scale_b = 10 ** torch.empty(len(counts), *weight_blocks, device="cuda").uniform_(-30, 10)
    scale_a[::7, 1] = 0
    scale_a[5] = 0
    scale_b[(2, 200) if scale_b.dim() == 2 else (2, 1, 3)] = 0
    ref, size, floor = blockwise_reference(a, b, scale_a, scale_b, counts)
    out_dtype = torch.float32 if "float32" in key else torch.bfloat16
    with forced(key):
        out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=out_dtype,
                                           use_fast_accum=fast)
    assert out.dtype == out_dtype and torch.isfinite(out).all()
    error = (out.double() - ref).abs()
    bound = (1e-3 if out_dtype == torch.float32 else 1e-2) * size + floor + 1e-20
    assert (error <= bound).all()


def test_grouped_mm_refuses_fp8():
    a, b, _, _, offs = fp8_moe_inputs([5, 6], 32, 64, "rowwise")
    with pytest.raises(TypeError, match="a must be float16 or bfloat16 or float32"):
        gg_runtime.grouped_mm(a, b, offs)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([40, 0, 90], 128, 256, "blockwise")

    def layer(a, b, scale_a, scale_b, offs):
        return torch.nn.functional.silu(
            gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, out_dtype=torch.float32))

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    out = compiled(a, b, scale_a, scale_b, offs)
    assert out.dtype == torch.float32
    assert rel_error(out, layer(a, b, scale_a, scale_b, offs)) < 1e-6


def test_out_dtype_none_is_bfloat16():
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([5, 6], 32, 64, "rowwise")
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, None)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_use_fast_accum_false_keeps_float32_accuracy_at_large_k(granularity):
    """use_fast_accum=False adds each K step's product on the CUDA cores: its
    error against float64 stays at the per-step level as K grows, where the
    tensor cores' own accumulation (True) loses bits."""
    a, b, scale_a, scale_b, offs = fp8_moe_inputs([300], 256, 16384, granularity)
    ref = dequantized(a, b, scale_a, scale_b, granularity)
    ref = ref[0].double() @ ref[1][0].double()
    errors = {fast: rel_error(gg_runtime.scaled_grouped_mm(
        a, b, scale_a, scale_b, offs, out_dtype=torch.float32, use_fast_accum=fast), ref)
        for fast in (False, True)}
    assert errors[False] < 6e-4, errors
    assert errors[True] > 2 * errors[False], errors


@pytest.mark.parametrize("counts,few_tiles", [([5], True), ([0, 1, 0, 0, 0, 1, 0, 0], True),
                                              ([0, 1, 0, 2, 1, 0, 1, 1], False)],
                         ids=["one_expert", "two_experts", "five_experts"])
def test_decode_with_few_column_tiles_takes_narrow_tiles(counts, few_tiles):
    """Decode's blockwise down projection (fast accumulation, a few rows an
    expert, N = 4096: 32 tiles of 128 columns a group with rows): one expert,
    or two groups with rows, make fewer tiles than the SMs and take 64-column
    tiles (the family's condition `few_tiles`), five do not; each against the
    float32 product of the dequantised inputs."""
    a, b, scale_a, scale_b, offs = fp8_moe_inputs(counts, 4096, 1040, "blockwise")
    out = gg_runtime.scaled_grouped_mm(a, b, scale_a, scale_b, offs, use_fast_accum=True)
    assert last_variant().endswith("_few_tiles") == few_tiles, last_variant()
    ref = ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, "blockwise")
    assert rel_error(out, ref) < FP8_TOLERANCE[torch.bfloat16]
