"""grouped_gemm on the GPU against a float32 reference, outputs poisoned."""
import pytest
import torch

import gg_runtime
from gg_runtime.testing import TOLERANCE, last_variant, randn, ref_list, rel_error

from conftest import device_arch, gpu, tma_runs_here

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
DTYPES = [torch.float16, torch.bfloat16]


def make_case(mnks, dtype, trans_b, pad=0, align=1):
    """Inputs for sizes [(M, N, K)]: slices of tensors whose rows are `pad` wider,
    rounded up to a multiple of `align` elements (8 keeps TMA's 16-byte rule)."""
    def width(n):
        return -(-(n + pad) // align) * align

    As, Bs = [], []
    for m, n, k in mnks:
        As.append(randn(m, width(k), dtype=dtype)[:, :k])
        if trans_b:
            Bs.append(randn(n, width(k), dtype=dtype)[:, :k])
        else:
            Bs.append(randn(k, width(n), dtype=dtype)[:, :n])
    return As, Bs


def check(As, Bs, trans_b, expect_flavour=None):
    Cs = gg_runtime.grouped_gemm(As, Bs, trans_b=trans_b)
    key = last_variant()
    torch.cuda.synchronize()
    if expect_flavour:
        assert f".{expect_flavour}." in key, key
    refs = ref_list(As, Bs, trans_b)
    for i, (c, ref) in enumerate(zip(Cs, refs)):
        assert c.shape == ref.shape and c.dtype == As[0].dtype
        assert rel_error(c, ref) < TOLERANCE[c.dtype], f"group {i} {tuple(ref.shape)} via {key}"
    return key


def random_mnks(groups, high, zero_every=0):
    sizes = torch.randint(1, high, (groups, 3)).tolist()
    for i in range(0, groups, zero_every or groups + 1):
        sizes[i][0] = 0
    return sizes


def test_tutorial_example(allow_tma):
    sizes = [(s, s, s) for s in (1024, 512, 256, 128)]
    As = [torch.rand(s, s, device="cuda", dtype=torch.float16) for s, _, _ in sizes]
    Bs = [torch.rand(s, s, device="cuda", dtype=torch.float16) for s, _, _ in sizes]
    check(As, Bs, False, "tma" if allow_tma else "basic")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
def test_random_shapes(dtype, trans_b, allow_tma):
    sizes = random_mnks(24, 300, zero_every=7)
    sizes[1] = [129, 257, 65]  # one past common tile sizes
    check(*make_case(sizes, dtype, trans_b), trans_b)


@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
def test_leading_dims_larger_than_width(trans_b, allow_tma):
    sizes = [[m, -(-n // 8) * 8, k] for m, n, k in random_mnks(9, 200)]  # C rows aligned too
    As, Bs = make_case(sizes, torch.bfloat16, trans_b, pad=5, align=8)
    check(As, Bs, trans_b, "tma" if allow_tma else "basic")


def test_equal_n_outputs_are_row_slices_of_one_buffer():
    sizes = [(m, 136, 72) for m in (5, 0, 130, 64, 1)]  # offsets m * 136: 16-byte aligned
    As, Bs = make_case(sizes, torch.bfloat16, False)
    check(As, Bs, False, "tma" if tma_runs_here() else "basic")
    Cs = gg_runtime.grouped_gemm(As, Bs)
    filled = [c for c in Cs if c.numel()]  # an empty tensor has no address
    for before, after in zip(filled, filled[1:]):
        assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()


def test_misaligned_rows_fall_back_to_basic():
    As, Bs = make_case([(33, 40, 17), (70, 9, 23)], torch.float16, False, pad=3)  # odd rows
    check(As, Bs, False, "basic")


def test_flavour_rules_hold_for_every_group_with_work():
    """One group with odd row strides among 40 aligned ones takes the call off
    TMA; the same group with no rows (no tile touches it) does not."""
    aligned = make_case([(32, 48, 64)] * 40, torch.float16, False, align=8)
    odd = make_case([(32, 48, 64)], torch.float16, False, pad=3)
    odd_empty = make_case([(0, 48, 64)], torch.float16, False, pad=3)
    for (a, b), flavour in ((odd, "basic"), (odd_empty, "tma" if tma_runs_here() else "basic")):
        As, Bs = (xs[:17] + extra + xs[17:] for xs, extra in zip(aligned, (a, b)))
        check(As, Bs, False, flavour)


def test_single_group(allow_tma):
    check(*make_case([(777, 333, 555)], torch.bfloat16, True), True)


def test_many_groups(allow_tma):
    sizes = random_mnks(1100, 64, zero_every=13)
    check(*make_case(sizes, torch.float16, False), False)


@pytest.mark.parametrize("trans_b", [False, True], ids=["b_kn", "b_nk"])
def test_programs_walk_tiles_of_many_groups(trans_b, allow_tma):
    """~3,000 tiles of 400 groups of every size (no rows, K = 0, one tile, many)
    with padded rows: each program takes tiles of many groups, so where the
    warp-specialised kernel runs it makes the descriptors of each in turn."""
    torch.manual_seed(7)
    sizes = [[m, -(-n // 8) * 8, k // 8 * 8] for m, n, k in random_mnks(400, 600, zero_every=29)]
    sizes[3][2] = 0
    sizes[5] = [1, 8, 8]
    key = check(*make_case(sizes, torch.bfloat16, trans_b, pad=8, align=8), trans_b,
                "tma" if allow_tma else "basic")
    if allow_tma and device_arch() == 90:
        assert key.endswith("_ws"), key


def test_zero_k_gives_zeros(allow_tma):
    As, Bs = make_case([(5, 7, 0), (16, 16, 16)], torch.bfloat16, False)
    Cs = gg_runtime.grouped_gemm(As, Bs)
    assert torch.equal(Cs[0], torch.zeros_like(Cs[0]))


def test_all_groups_empty_launches_nothing():
    As, Bs = make_case([(0, 8, 8), (4, 0, 8)], torch.float16, False)
    gg_runtime.grouped_gemm(*make_case([(3, 8, 8)], torch.float16, False))
    Cs = gg_runtime.grouped_gemm(As, Bs)
    assert last_variant() == "" and [c.shape for c in Cs] == [(0, 8), (4, 0)]


def test_public_api_and_stream():
    As, Bs = make_case([(64, 32, 48), (10, 20, 30)], torch.float16, False)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        Cs = gg_runtime.grouped_gemm(As, Bs)
    stream.synchronize()
    for c, ref in zip(Cs, ref_list(As, Bs)):
        assert rel_error(c, ref) < TOLERANCE[torch.float16]


def test_other_device_dtype_errors():
    a = randn(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"As\[2\] must be 2-D"):  # past the fast checks
        gg_runtime.grouped_gemm([a, a, a[None], a], [a.t().contiguous()] * 4)
    with pytest.raises(ValueError, match=r"group 1: .*K differs"):
        gg_runtime.grouped_gemm([a, a], [a.t().contiguous(), a])
    with pytest.raises(TypeError, match=r"Bs\[0\] has dtype"):
        gg_runtime.grouped_gemm([a], [randn(8, 4, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match=r"Bs\[0\] must be on a CUDA device, got cpu"):
        gg_runtime.grouped_gemm([a], [torch.randn(8, 4).half()])


def test_graph_capture_is_refused():
    As, Bs = make_case([(16, 16, 16)], torch.float16, False)
    gg_runtime.grouped_gemm(As, Bs)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(ValueError, match="cannot be captured"), torch.cuda.graph(graph):
        gg_runtime.grouped_gemm(As, Bs)


def test_device_reported_supported():
    device = gg_runtime.info()["device"]
    assert device["supported"] == (device_arch() is not None)
    assert device["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count
    major, minor = torch.cuda.get_device_capability()
    cubins_run = major == 8 or (major, minor) == (9, 0)  # the wheel's sm80 and sm90a cubins
    ptx = gg_runtime._C.force_ptx() or not cubins_run
    assert device["path"] == ("ptx (compiled by the driver)" if ptx else "cubin")


def test_forced_ptx_path_runs_the_sm80_kernels():
    """Switched on for one call: the sm80 variant runs on any GPU >= 8.0."""
    As, Bs = make_case([(70, 40, 24), (3, 16, 8)], torch.bfloat16, True)
    before = gg_runtime._C.force_ptx()
    gg_runtime.force_ptx(True)
    try:
        Cs = gg_runtime.grouped_gemm(As, Bs, trans_b=True)
        assert ".sm80." in last_variant() and gg_runtime.info()["device"]["kernel_arch"] == 80
    finally:
        gg_runtime.force_ptx(before)
    torch.cuda.synchronize()
    for c, ref in zip(Cs, ref_list(As, Bs, True)):
        assert rel_error(c, ref) < TOLERANCE[torch.bfloat16]
