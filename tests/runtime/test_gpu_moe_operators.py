"""The operators moe_experts is made of, each alone against float32 and each
compiled variant forced: the SwiGLU operators and kernels, the up projection
that gathers its rows with the activation in its epilogue, the gathering
products and weight gradients, the combine and the routing (test_gpu_moe_experts.py
tests the layer they make)."""
import pytest
import torch

from gg_runtime import _C
from moe_reference import combine_ref, route_by_sort
from gg_runtime.testing import (forced, gated_activation, last_variant, offsets_from_counts,
                                poisoned, randn, rel_error)

from conftest import device_arch, gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]

# The route kernels' bins (aot/families/route.py): one per expert and one for
# dropped slots; the route operator sorts with torch past ROUTE_BINS - 1 experts.
ROUTE_BINS = _C.families()["route"]["constants"]["kBins"]
# Every route variant's bin count, and experts on either side of its limit
# (E <= bins - 1) with one launch's slots, small and large, and three's.
ROUTE_BIN_COUNTS = sorted({v["block"][1] for v in _C.variants() if v["family"] == "route"})
ROUTE_BIN_EDGES = [(slots, experts) for bins in ROUTE_BIN_COUNTS[:-1]
                   for experts in (bins - 1, bins) for slots in (37, 300, 2000)]


def swiglu_backward_ref(gu, grad, scale, gate_up, activation="swiglu"):
    """(d gu, h * scale, <grad, h> per row) by autograd in float32, h rounded as the kernel does."""
    gu = gu.float().requires_grad_()
    h = gated_activation(gu, gate_up == "interleaved", activation)
    (h * scale[:, None]).backward(grad.float())
    rounded = h.detach().to(grad.dtype).float()
    return gu.grad, rounded * scale[:, None], (grad.float() * rounded).sum(-1)


@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("rows,cols", [(1, 8), (77, 40), (300, 256), (33, 1000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_swiglu_operators(rows, cols, gate_up, dtype, activation):
    gu = randn(rows, 2 * cols, dtype=dtype) * 4  # past gpt-oss's clamps at 7 often
    grad = randn(rows, cols, dtype=dtype)
    scale = torch.rand(rows, device="cuda")
    h = torch.ops.gg_runtime.swiglu(gu, gate_up, activation)
    want = gated_activation(gu.float(), gate_up == "interleaved", activation)
    assert rel_error(h, want) < 1e-2
    got = torch.ops.gg_runtime.swiglu_backward(gu, grad, scale, gate_up, activation)
    wants = swiglu_backward_ref(gu, grad, scale, gate_up, activation)
    for name, g, want in zip(("dgu", "hs", "dot"), got, wants):
        assert g.shape == want.shape and g.is_contiguous(), name
        assert rel_error(g, want) < (1e-4 if name == "dot" else 1e-2), name


def test_swiglu_operators_strided_and_empty():
    gu = randn(50, 200, dtype=torch.bfloat16)[:, 20:180]  # row stride 200
    h = torch.ops.gg_runtime.swiglu(gu)
    assert rel_error(h, gated_activation(gu.float(), False)) < 1e-2
    empty = torch.ops.gg_runtime.swiglu_backward(gu[:0], gu[:0, :80], torch.rand(0, device="cuda"))
    assert [tuple(t.shape) for t in empty] == [(0, 160), (0, 80), (0,)]


SWIGLU_VARIANTS = [v for v in _C.variants() if v["family"] == "swiglu" and
                   v["arch"] == device_arch()]


@pytest.mark.skipif(not SWIGLU_VARIANTS, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("variant", SWIGLU_VARIANTS, ids=[v["key"] for v in SWIGLU_VARIANTS])
@pytest.mark.parametrize("activation", _C.choices()["Activation"])
def test_swiglu_variant(variant, activation):
    """Each compiled SwiGLU variant, forced, with each activation (a run-time
    choice), on more row tiles than one wave of programs (each program takes
    several) and columns that are no multiple of the tile (of 16 for `basic`)."""
    dtype = getattr(torch, variant["dtype"])
    direction, gate_up = variant["axes"]["direction"], variant["axes"]["gate_up"]
    cols = 45 if variant["flavour"] == "basic" else 48
    gu, grad = randn(20000, 2 * cols, dtype=dtype) * 4, randn(20000, cols, dtype=dtype)
    scale = torch.rand(20000, device="cuda")
    with forced(variant=variant["key"]):
        if direction == "forward":
            got = [torch.ops.gg_runtime.swiglu(gu, gate_up, activation)]
            want = [gated_activation(gu.float(), gate_up == "interleaved", activation)]
        else:
            got = torch.ops.gg_runtime.swiglu_backward(gu, grad, scale, gate_up, activation)
            want = swiglu_backward_ref(gu, grad, scale, gate_up, activation)
        assert last_variant() == variant["key"]
    for g, w in zip(got, want):
        assert rel_error(g, w) < 1e-2


GLU_K = 3  # each token's slots: rows[r] // GLU_K is the token


def glu_inputs(counts, past, hidden, inter, n_major, dtype, seed=0):
    """(x [T, H], rows [sum(counts) + past] (random slots: x's rows gathered
    in any order, repeats included), w13 [G, 2I, H] as stored or (n_major) a
    transposed view of [G, H, 2I], bias [G, 2I], offs); large enough products
    that gpt-oss's clamps act."""
    torch.manual_seed(seed)
    groups = len(counts)
    x = randn(97, hidden, dtype=dtype)
    rows = torch.randint(0, 97 * GLU_K, (sum(counts) + past,), device="cuda")
    w13 = randn(groups, hidden, 2 * inter, dtype=dtype, scale=4 * hidden ** -0.5).mT if n_major \
        else randn(groups, 2 * inter, hidden, dtype=dtype, scale=4 * hidden ** -0.5)
    bias = randn(groups, 2 * inter, dtype=dtype)
    return x, rows, w13, bias, offsets_from_counts(counts, "cuda")


def check_grouped_mm_glu(x, rows, w13, bias, offs, gate_up, activation, save_gu=True):
    """Both outputs against float32 (gu: the gathered rows' product plus bias,
    per group; h its activation; rows past the last group zero).  rows None:
    x's rows in order, read by TMA."""
    h, gu = torch.ops.gg_runtime.grouped_mm_glu(x, rows, GLU_K, w13, offs, bias, gate_up,
                                                activation, save_gu)
    gathered = (x if rows is None else x[rows // GLU_K]).float()
    want = torch.zeros(gathered.shape[0], w13.shape[1], device="cuda")
    start = 0
    for g, end in enumerate(offs.tolist()):
        want[start:end] = gathered[start:end] @ w13[g].float().T + bias[g].float()
        start = end
    assert rel_error(h, gated_activation(want, gate_up == "interleaved", activation)) < 1e-2
    assert torch.all(h[start:] == 0)
    if save_gu:
        assert rel_error(gu, want) < 1e-2
    else:
        assert gu.shape == (0, w13.shape[1])


GLU_VARIANTS = [v for v in _C.variants() if v["family"] == "ragged_glu" and
                v["arch"] == device_arch()]


@pytest.mark.skipif(not GLU_VARIANTS, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("variant", GLU_VARIANTS, ids=[v["key"] for v in GLU_VARIANTS])
def test_grouped_mm_glu_variant(variant, activation):
    """Each compiled up projection with its activation, forced: groups empty
    and of a few rows, rows past the last group, H and I no multiple of the
    tile (nor of 16 for `basic`), gu kept and not."""
    b_major, gate_up = variant["axes"]["b_major"], variant["axes"]["gate_up"]
    hidden, inter = (99, 133) if variant["flavour"] == "basic" else (112, 144)
    x, rows, w13, bias, offs = glu_inputs([150, 0, 3, 260, 70], 9, hidden, inter,
                                          b_major == "row", getattr(torch, variant["dtype"]))
    dense = x[rows // GLU_K]
    with forced(variant=variant["key"]):
        for save_gu in (True, False):
            check_grouped_mm_glu(x, rows, w13, bias, offs, gate_up, activation, save_gu)
            assert last_variant() == variant["key"]
        check_grouped_mm_glu(dense, None, w13, bias, offs, gate_up, activation)
        assert last_variant() == variant["key"]


GLU_PERSISTENT = [v for v in GLU_VARIANTS if v["flavour"] == "tma"]


@pytest.mark.skipif(not GLU_PERSISTENT, reason="needs a GPU with ragged_glu tma kernels")
@pytest.mark.parametrize("variant", GLU_PERSISTENT, ids=[v["key"] for v in GLU_PERSISTENT])
def test_grouped_mm_glu_many_groups_tiles_and_k_blocks(variant):
    """200 groups (some empty, some of one row), many tiles and K blocks a program."""
    counts = torch.randint(0, 160, (200,), generator=torch.Generator().manual_seed(0))
    counts[::17] = 0
    counts[5::31] = 1
    b_major, gate_up = variant["axes"]["b_major"], variant["axes"]["gate_up"]
    x, rows, w13, bias, offs = glu_inputs(counts.tolist(), 70, 1040, 392, b_major == "row",
                                          getattr(torch, variant["dtype"]))
    with forced(variant=variant["key"]):
        check_grouped_mm_glu(x, rows, w13, bias, offs, gate_up, "swiglu")
        check_grouped_mm_glu(x[rows // GLU_K], None, w13, bias, offs, gate_up, "swiglu")


def test_grouped_mm_glu_strided_x_odd_rows_and_no_groups():
    """x read through a row stride; rows of x that TMA's flavour cannot copy
    16 bytes at a time (H = 100) take the `basic` kernel; no groups: zeros."""
    x, rows, w13, bias, offs = glu_inputs([40, 0, 77], 5, 64, 48, True, torch.bfloat16)
    wide = randn(x.shape[0], 80, dtype=torch.bfloat16)
    wide[:, 8:72] = x
    check_grouped_mm_glu(wide[:, 8:72], rows, w13.contiguous(), bias, offs, "interleaved",
                         "gpt_oss")
    x, rows, w13, bias, offs = glu_inputs([40, 0, 77], 5, 100, 48, True, torch.bfloat16)
    padded = randn(x.shape[0], 104, dtype=torch.bfloat16)[:, :100]
    padded.copy_(x)
    check_grouped_mm_glu(padded, rows, w13, bias, offs, "concatenated", "swiglu")
    assert ".basic." in last_variant()
    h, gu = torch.ops.gg_runtime.grouped_mm_glu(x, rows, GLU_K, w13[:0], offs[:0])
    assert torch.all(h == 0) and torch.all(gu == 0) and gu.shape == (rows.shape[0], 96)


GATHERED_M_VARIANTS = [v for v in _C.variants() if v["family"] == "gathered_m" and
                       v["arch"] == device_arch()]


def check_gathered_mm(x, rows, b, offs):
    """gathered_mm against float32: x's rows gathered, times b[g] per group;
    rows past the last group zero."""
    got = torch.ops.gg_runtime.gathered_mm(x, rows, GLU_K, b, offs)
    gathered = x[rows // GLU_K].float()
    want = torch.zeros(rows.shape[0], b.shape[2], device="cuda")
    start = 0
    for g, end in enumerate(offs.tolist()):
        want[start:end] = gathered[start:end] @ b[g].float()
        start = end
    assert rel_error(got, want) < 1e-2
    assert torch.all(got[start:] == 0)


@pytest.mark.skipif(not GATHERED_M_VARIANTS, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("variant", GATHERED_M_VARIANTS,
                         ids=[v["key"] for v in GATHERED_M_VARIANTS])
def test_gathered_mm_variant(variant):
    """Each compiled product of gathered rows without a gate, forced: groups
    empty and of a few rows, rows past the last group, K and N no multiple of
    the tile (nor of 16 for `basic`); b as stored or a transposed view."""
    hidden, n = (99, 133) if variant["flavour"] == "basic" else (112, 144)
    dtype = getattr(torch, variant["dtype"])
    x, rows, _, _, offs = glu_inputs([150, 0, 3, 260, 70], 9, hidden, 8, False, dtype)
    b = randn(5, n, hidden, dtype=dtype).mT if variant["axes"]["b_major"] == "column" else \
        randn(5, hidden, n, dtype=dtype)
    with forced(variant=variant["key"]):
        check_gathered_mm(x, rows, b, offs)
        assert last_variant() == variant["key"]


GATHERED_K_VARIANTS = [v for v in _C.variants() if v["family"] == "gathered_k" and
                       v["arch"] == device_arch()]


def check_gathered_mm_k(a, b, offs, rows, gather_a):
    """gathered_mm_k against float32: each group's a^T @ b over its rows, one
    operand's rows gathered."""
    got = torch.ops.gg_runtime.gathered_mm_k(a, b, offs, rows, GLU_K, gather_a)
    left = (a[rows // GLU_K] if gather_a else a).float()
    right = (b if gather_a else b[rows // GLU_K]).float()
    want = torch.zeros(offs.shape[0], a.shape[1], b.shape[1], device="cuda")
    start = 0
    for g, end in enumerate(offs.tolist()):
        want[g] = left[start:end].T @ right[start:end]
        start = end
    assert rel_error(got, want) < 1e-2


def gathered_k_inputs(counts, past, m, n, gather_a, dtype, seed=0):
    """(a, b, offs, rows): the gathered operand [97, *], the other with a row
    for each of sum(counts) + past slots (the last `past` past every group)."""
    torch.manual_seed(seed)
    slots = sum(counts) + past
    rows = torch.randint(0, 97 * GLU_K, (slots,), device="cuda")
    a = randn(97 if gather_a else slots, m, dtype=dtype)
    b = randn(slots if gather_a else 97, n, dtype=dtype)
    return a, b, offsets_from_counts(counts, "cuda"), rows


@pytest.mark.skipif(not GATHERED_K_VARIANTS, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("variant", GATHERED_K_VARIANTS,
                         ids=[v["key"] for v in GATHERED_K_VARIANTS])
def test_gathered_mm_k_variant(variant):
    """Each compiled weight gradient over gathered rows, forced: groups empty
    and of a few rows, rows past the last group, M and N no multiple of the
    tile (nor of 8 for `basic`); then 200 groups (some empty, some of one
    row) with many tiles and K blocks a program."""
    m, n = (99, 133) if variant["flavour"] == "basic" else (112, 144)
    gather_a = variant["axes"]["gathered"] == "a"
    dtype = getattr(torch, variant["dtype"])
    counts = torch.randint(0, 160, (200,), generator=torch.Generator().manual_seed(0))
    counts[::17] = 0
    counts[5::31] = 1
    with forced(variant=variant["key"]):
        for shape in (([150, 0, 3, 260, 70], 9, m, n), (counts.tolist(), 70, 8 * m, n)):
            check_gathered_mm_k(*gathered_k_inputs(*shape, gather_a, dtype), gather_a)
            assert last_variant() == variant["key"]


def test_gathered_mm_k_strided_unaligned_and_empty():
    """Operands read through a row stride; a gathered operand whose rows TMA's
    flavour cannot copy 16 bytes at a time (M = 100) takes `basic`; no slots:
    zeros; no groups: an empty result."""
    a, b, offs, rows = gathered_k_inputs([40, 0, 77], 5, 64, 48, True, torch.bfloat16)
    wide = randn(a.shape[0], 80, dtype=torch.bfloat16)
    wide[:, 8:72] = a
    check_gathered_mm_k(wide[:, 8:72], b, offs, rows, True)
    a, b, offs, rows = gathered_k_inputs([40, 0, 77], 5, 48, 100, False, torch.bfloat16)
    check_gathered_mm_k(a, b, offs, rows, False)
    assert ".basic." in last_variant()
    none = torch.zeros(3, dtype=torch.int32, device="cuda")
    got = torch.ops.gg_runtime.gathered_mm_k(a[:0], b, none, rows[:0], GLU_K, False)
    assert got.shape == (3, 48, 100) and torch.all(got == 0)
    assert torch.ops.gg_runtime.gathered_mm_k(a, b, offs[:0], rows, GLU_K, False).shape == \
        (0, 48, 100)


def combine_inputs(tokens, k, hidden, dtype, end=None, seed=0):
    """rows [T * k + 5, H] (the 5 past every slot), index a permutation of the
    first T * k rows with some slots pointing past `end` (dropped) or at -1,
    float32 weights (inf on a dropped slot: it must add nothing), offs ending at `end`."""
    torch.manual_seed(seed)
    slots = tokens * k
    end = slots if end is None else end
    rows = randn(slots + 5, hidden, dtype=dtype)
    index = torch.randperm(slots, device="cuda").view(tokens, k)
    weights = torch.rand(tokens, k, device="cuda")
    if slots:
        index.view(-1)[::11] = -1
        index.view(-1)[5::13] = slots + 4  # a real row, but past the groups
        weights.view(-1)[::11] = float("inf")
    offs = torch.tensor([end // 3, end], dtype=torch.int32, device="cuda")
    return rows, index, weights, offs


@pytest.mark.parametrize("tokens,k,hidden", [(1, 1, 8), (37, 2, 45), (300, 8, 256),
                                             (129, 16, 1000), (0, 4, 64), (5, 0, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_combine_operator(tokens, k, hidden, dtype):
    rows, index, weights, offs = combine_inputs(tokens, k, hidden, dtype)
    with poisoned():
        got = torch.ops.gg_runtime.combine(rows, index, weights, offs)
    assert got.shape == (tokens, hidden) and got.dtype == dtype and got.is_contiguous()
    assert torch.isfinite(got).all()
    want = combine_ref(rows, index, weights, offs)
    if tokens * k:
        assert rel_error(got, want) < 1e-2
    else:
        assert torch.equal(got, torch.zeros_like(got))


def test_combine_operator_edges():
    """Rows past offs[-1] (here: half of the permutation) add nothing; no
    groups at all add nothing; strided inputs are read as they are."""
    rows, index, weights, offs = combine_inputs(200, 4, 96, torch.bfloat16, end=400)
    got = torch.ops.gg_runtime.combine(rows, index, weights, offs)
    assert rel_error(got, combine_ref(rows, index, weights, offs)) < 1e-2
    none = torch.ops.gg_runtime.combine(rows, index, weights, offs[:0])
    assert torch.equal(none, torch.zeros_like(none))
    wide = randn(rows.shape[0], 300, dtype=torch.bfloat16)
    got = torch.ops.gg_runtime.combine(wide[:, 7:103], index.mT.contiguous().mT,
                                       weights.mT.contiguous().mT, offs)
    assert rel_error(got, combine_ref(wide[:, 7:103], index, weights, offs)) < 1e-2


COMBINE_VARIANTS = [v for v in _C.variants() if v["family"] == "combine" and
                    v["arch"] == device_arch()]


@pytest.mark.skipif(not COMBINE_VARIANTS, reason="needs a GPU this wheel has kernels for")
@pytest.mark.parametrize("variant", COMBINE_VARIANTS, ids=[v["key"] for v in COMBINE_VARIANTS])
def test_combine_variant(variant):
    """Each compiled combine variant, forced, on more tiles than one wave of
    programs and columns that are no multiple of the tile (of 16 for `basic`)."""
    hidden = 45 if variant["flavour"] == "basic" else 48
    rows, index, weights, offs = combine_inputs(20000, 3, hidden, getattr(torch, variant["dtype"]))
    with forced(variant=variant["key"]):
        got = torch.ops.gg_runtime.combine(rows, index, weights, offs)
        assert last_variant() == variant["key"]
    assert rel_error(got, combine_ref(rows, index, weights, offs)) < 1e-2


@pytest.mark.parametrize("slots,experts", [(1, 1), (64, 256), (65, 8), (1023, 8), (1024, 128),
                                           (1025, 3), (131079, 128), (70000, ROUTE_BINS - 1),
                                           (500, 0), (5000, ROUTE_BINS), (3000, 4000),
                                           *ROUTE_BIN_EDGES])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_route_operator(slots, experts, dtype):
    """The route kernels (the three phases, or the one for a single chunk,
    large or small) against torch's stable sort, exactly: ids in and out of
    [0, E) (-1, E, far past), chunks of slots whole and partial, more chunks
    than one scan step, experts on each side of every bin count's limit;
    past the kernels' bins, the operator's own sort."""
    torch.manual_seed(slots)
    ids = torch.randint(-2, experts + 3, (slots,), device="cuda", dtype=dtype)
    ids[::97] = 2**31 - 1
    with poisoned():
        got = torch.ops.gg_runtime.route(ids.long(), experts)
    for name, g, want in zip(("order", "offs", "inverse"), got, route_by_sort(ids, experts)):
        assert g.dtype == want.dtype and torch.equal(g, want), name


SINGLE_ROUTE_VARIANTS = [v for v in _C.variants() if v["family"] == "route"
                         and v["axes"]["phase"] == "single" and v["arch"] == device_arch()]


@pytest.mark.parametrize("variant", SINGLE_ROUTE_VARIANTS, ids=lambda v: v["key"])
def test_every_single_chunk_route_kernel(variant):
    """Each one-launch sort forced on as many slots as its chunk holds and
    as many experts as its bins hold; the small chunk's refused one slot
    more (its condition `few_slots`), and each but the widest refused one
    expert more (its condition `bins_*`)."""
    slots, bins = variant["block"][:2]
    experts = bins - 1
    ids = torch.randint(-1, experts + 1, (slots,), device="cuda")
    with forced(variant["key"]), poisoned():
        got = torch.ops.gg_runtime.route(ids, experts)
        assert last_variant() == variant["key"]
    for name, g, want in zip(("order", "offs", "inverse"), got, route_by_sort(ids, experts)):
        assert torch.equal(g, want), name
    if "_few_slots" in variant["key"]:
        with forced(variant["key"]), pytest.raises(ValueError, match="cannot run this problem"):
            torch.ops.gg_runtime.route(torch.zeros(slots + 1, dtype=torch.int64, device="cuda"),
                                       experts)
    if bins < ROUTE_BINS:
        with forced(variant["key"]), pytest.raises(ValueError, match="cannot run this problem"):
            torch.ops.gg_runtime.route(ids, bins)


def test_route_operator_without_slots():
    order, offs, inverse = torch.ops.gg_runtime.route(torch.zeros(0, dtype=torch.int64,
                                                                  device="cuda"), 5)
    assert order.numel() == inverse.numel() == 0 and torch.equal(offs, torch.zeros_like(offs))
