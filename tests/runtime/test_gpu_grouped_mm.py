"""grouped_mm (MoE layout) on the GPU: float32 references, torch._grouped_mm,
CUDA-graph replay with new offsets, autograd, torch.compile."""
import gc

import pytest
import torch

import gg_runtime
from gg_runtime import autograd
from gg_runtime.testing import (TOLERANCE, last_variant, offsets_from_counts, randn, ref_grouped_mm,
                                ref_grouped_mm_grads, rel_error, skewed_counts)

from conftest import device_arch, gpu, tma_runs_here

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
DTYPES = [torch.float16, torch.bfloat16]


def weights(groups, k, n, dtype, layout):
    """[G, K, N] either contiguous or a transposed view of nn.Linear-style [G, N, K]."""
    if layout == "kn":
        return randn(groups, k, n, dtype=dtype, scale=0.1)
    return randn(groups, n, k, dtype=dtype, scale=0.1).transpose(1, 2)


def check(a, b, offs, expect_flavour=None):
    out = gg_runtime.grouped_mm(a, b, offs)
    key = last_variant()
    torch.cuda.synchronize()
    if expect_flavour:
        assert f".{expect_flavour}." in key, key
    ref = ref_grouped_mm(a, b, offs)
    assert out.shape == ref.shape
    assert rel_error(out, ref) < TOLERANCE[a.dtype], key
    return out


# ---------------------------------------------------------------- ragged M

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_ragged_m_skewed(dtype, layout, allow_tma):
    groups, k, n = 16, 136, 200
    counts = skewed_counts(1500, groups, zero_groups=4)
    a = randn(sum(counts), k, dtype=dtype)
    check(a, weights(groups, k, n, dtype, layout), offsets_from_counts(counts, "cuda"),
          "tma" if allow_tma else "basic")


@pytest.mark.parametrize("counts", [[0], [37], [0, 0, 5, 0], [300] + [0] * 7, [1] * 200],
                         ids=["one-empty", "one", "mostly-empty", "all-in-first", "200x1"])
def test_ragged_m_edge_distributions(counts, allow_tma):
    k, n = 64, 72
    a = randn(sum(counts), k, dtype=torch.bfloat16)
    check(a, weights(len(counts), k, n, torch.bfloat16, "nk"), offsets_from_counts(counts, "cuda"))


def test_functorch_transforms_get_torch_error_not_a_wrong_gradient():
    """The eager autograd path skips Function.apply's Python wrapper except
    under functorch transforms, where the wrapper runs and refuses the call."""
    a = randn(8, 16, dtype=torch.bfloat16)
    b = weights(2, 16, 8, torch.bfloat16, "kn")
    offs = torch.tensor([3, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(RuntimeError, match="functorch transforms"):
        loss = lambda x: gg_runtime.grouped_mm(x, b, offs).float().sum()  # noqa: E731
        torch.func.grad(loss)(a.float().to(a.dtype))


def test_ragged_m_uncovered_rows_are_zero(allow_tma):
    a = randn(100, 32, dtype=torch.float16)
    offs = torch.tensor([10, 40, 60], dtype=torch.int32, device="cuda")
    out = check(a, weights(3, 32, 48, torch.float16, "kn"), offs)
    assert torch.equal(out[60:], torch.zeros_like(out[60:]))


def test_ragged_m_bad_offsets_are_clamped(allow_tma):
    a = randn(50, 40, dtype=torch.bfloat16)
    b = weights(4, 40, 24, torch.bfloat16, "kn")
    for offs in ([30, 10, 45, 40], [-5, 20, 80, 90], [60, 70, 80, 90]):
        out = check(a, b, torch.tensor(offs, dtype=torch.int32, device="cuda"))
        assert torch.isfinite(out).all()


def test_ragged_m_zero_tokens_and_zero_k():
    b = weights(3, 16, 8, torch.float16, "kn")
    out = gg_runtime.grouped_mm(randn(0, 16, dtype=torch.float16), b,
                                torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert out.shape == (0, 8)
    out = check(randn(9, 0, dtype=torch.float16), weights(2, 0, 8, torch.float16, "kn"),
                torch.tensor([4, 9], dtype=torch.int32, device="cuda"))
    assert torch.equal(out, torch.zeros_like(out))


def test_ragged_m_strided_a(allow_tma):
    a = randn(300, 96, dtype=torch.bfloat16)[:, :64]  # row stride 96
    check(a, weights(3, 64, 40, torch.bfloat16, "nk"), offsets_from_counts([100, 0, 180], "cuda"))


@pytest.mark.parametrize("b_layout", ["kn", "nk"])
@pytest.mark.parametrize("tokens", [1504, 1501])
def test_ragged_m_column_major_a(b_layout, tokens, allow_tma):
    """a a transposed view of [K, T] (3-D x 2-D's b), groups starting at odd
    rows: read in place where its row stride, T elements, is a multiple of
    16 bytes, else copied to row-major first (gg_runtime/ragged.py)."""
    # Groups of 1 and 3 rows, empty ones, the last 7 rows in none.
    counts = [5, 0, 131, 3, 700, 0, 1, tokens - 847]
    a = randn(136, tokens, dtype=torch.bfloat16).t()
    flavour = "tma" if allow_tma else "basic"
    check(a, weights(8, 136, 200, torch.bfloat16, b_layout), offsets_from_counts(counts, "cuda"),
          flavour)
    in_place = tokens % 8 == 0 and tma_runs_here()
    a_major = "column" if in_place else "row"
    b_major = "row" if b_layout == "kn" else "column"
    assert f".{a_major}-{b_major}-row.{flavour}." in last_variant()


def test_ragged_m_many_experts(allow_tma):
    counts = skewed_counts(8000, 1024, zero_groups=300)
    a = randn(sum(counts), 64, dtype=torch.bfloat16)
    check(a, weights(1024, 64, 32, torch.bfloat16, "kn"), offsets_from_counts(counts, "cuda"))


@pytest.mark.skipif(device_arch() != 90, reason="torch._grouped_mm's fused path is bf16 on sm90")
def test_ragged_m_matches_torch_grouped_mm():
    counts = skewed_counts(4096, 8, zero_groups=1)
    a = randn(sum(counts), 512, dtype=torch.bfloat16)
    b = weights(8, 512, 768, torch.bfloat16, "nk")
    offs = offsets_from_counts(counts, "cuda")
    ours = gg_runtime.grouped_mm(a, b, offs)
    theirs = torch._grouped_mm(a, b, offs)
    assert rel_error(ours, theirs.float()) < 1e-2


# ---------------------------------------------------------------- ragged K

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_layout", ["mt", "tm"])
def test_ragged_k(dtype, a_layout, allow_tma):
    m, n, groups = 72, 136, 6
    counts = skewed_counts(900, groups, zero_groups=2)
    total = sum(counts)
    a = randn(m, total, dtype=dtype) if a_layout == "mt" else randn(total, m, dtype=dtype).t()
    # A row-major a is copied to the [T, M] layout first (gg_runtime/ragged.py): tma either way.
    out = check(a, randn(total, n, dtype=dtype), offsets_from_counts(counts, "cuda"),
                "tma" if allow_tma else "basic")
    for g, c in enumerate(counts):
        if c == 0:
            assert torch.equal(out[g], torch.zeros_like(out[g]))


@pytest.mark.parametrize("tokens", [1504, 1501])
def test_ragged_k_row_major_a(tokens, allow_tma):
    """a row-major [M, T] (3-D x 2-D's dA), groups starting at odd rows,
    their values past the group (NaN, inf) never reaching it: read in place
    where T elements are a multiple of 16 bytes, else (or without sm90
    kernels) copied to [T, M] first (gg_runtime/ragged.py)."""
    counts = [5, 0, 131, 3, 700, 0, 1, tokens - 847]  # the last 7 rows in no group
    a = randn(72, tokens, dtype=torch.bfloat16)
    b = randn(tokens, 136, dtype=torch.bfloat16)
    a[:, -7:], b[-7:] = float("nan"), float("inf")
    offs = offsets_from_counts(counts, "cuda")
    out = check(a, b, offs, "tma" if allow_tma else "basic")
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    in_place = tokens % 8 == 0 and tma_runs_here()
    # ragged_k's one axis, a_major: read in place (row) or as a transposed view (column).
    assert f".{'row' if in_place else 'column'}." in last_variant()


def test_ragged_k_no_rows_at_all():
    out = check(randn(8, 0, dtype=torch.bfloat16), randn(0, 16, dtype=torch.bfloat16),
                torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert torch.equal(out, torch.zeros_like(out))


# ---------------------------------------------------------------- batched

@pytest.mark.parametrize("b_layout", ["kn", "nk"])
def test_batched(b_layout, allow_tma):
    a = randn(5, 77, 48, dtype=torch.float16)
    check(a, weights(5, 48, 40, torch.float16, b_layout), None)


def test_batched_transposed_a():
    a = randn(4, 48, 77, dtype=torch.bfloat16).transpose(1, 2)  # as in dB of a batched product
    check(a, randn(4, 48, 33, dtype=torch.bfloat16), None)


# ---------------------------------------------------------------- graphs, autograd, compile

def test_cuda_graph_replay_with_new_offsets():
    groups, k, n, capacity = 8, 128, 256, 2048
    a = randn(capacity, k, dtype=torch.bfloat16)
    b = weights(groups, k, n, torch.bfloat16, "nk")
    offs = offsets_from_counts(skewed_counts(capacity, groups), "cuda")
    gg_runtime.grouped_mm(a, b, offs)  # load kernels outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gg_runtime.grouped_mm(a, b, offs)
    for total, zeros in [(2048, 0), (1000, 3), (0, 8), (1999, 1)]:
        counts = skewed_counts(total, groups, zero_groups=zeros) if total else [0] * groups
        offs.copy_(offsets_from_counts(counts, "cuda"))
        a.copy_(randn(capacity, k, dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_error(out, ref_grouped_mm(a, b, offs)) < TOLERANCE[torch.bfloat16], counts


@pytest.mark.parametrize("case", ["ragged_m", "ragged_k", "batched"])
def test_autograd(case):
    dtype = torch.bfloat16
    counts = [70, 0, 130, 33]
    offs = offsets_from_counts(counts, "cuda")
    if case == "ragged_m":
        a, b = randn(sum(counts) + 5, 96, dtype=dtype), weights(4, 96, 80, dtype, "nk")
    elif case == "ragged_k":
        a, b = randn(48, sum(counts), dtype=dtype), randn(sum(counts), 40, dtype=dtype)
    else:
        offs = None
        a, b = randn(3, 50, 64, dtype=dtype), randn(3, 64, 24, dtype=dtype)
    a.requires_grad_()
    b.requires_grad_()
    out = gg_runtime.grouped_mm(a, b, offs)
    grad = randn(*out.shape, dtype=dtype)
    got = torch.autograd.grad(out, (a, b), grad)
    want = ref_grouped_mm_grads(a, b, offs, grad)
    for name, g, w in zip("ab", got, want):
        assert g.shape == w.shape
        assert rel_error(g, w) < 2e-2, name


def small_moe(dtype=torch.bfloat16):
    counts = [5, 0, 19]
    a = randn(sum(counts), 32, dtype=dtype).requires_grad_()
    b = weights(3, 32, 24, dtype, "nk").requires_grad_()
    return a, b, offsets_from_counts(counts, "cuda")


def test_backward_twice_needs_retain_graph_and_sees_inplace_changes():
    a, b, offs = small_moe()
    out = gg_runtime.grouped_mm(a, b, offs)
    out.float().sum().backward(retain_graph=True)
    out.float().sum().backward()
    with pytest.raises(RuntimeError, match="second time"):
        out.float().sum().backward()
    out = gg_runtime.grouped_mm(a, b, offs)
    with torch.no_grad():
        b.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.float().sum().backward()


def test_gradient_of_b_alone_and_double_backward():
    """The gradients are grouped_mm calls themselves, so they differentiate
    again: second derivatives against the float32 loop's."""
    a, b, offs = small_moe()
    out = gg_runtime.grouped_mm(a, b, offs)
    grad = randn(*out.shape, dtype=out.dtype)
    (grad_b,) = torch.autograd.grad(out, b, grad)
    assert rel_error(grad_b, ref_grouped_mm_grads(a, b, offs, grad)[1]) < 2e-2
    second = []
    for mm, x, y in ((gg_runtime.grouped_mm, a, b),
                     (ref_grouped_mm, a.detach().float().requires_grad_(),
                      b.detach().float().requires_grad_())):
        (grad_x,) = torch.autograd.grad((mm(x, y, offs).float() ** 2).sum(), x, create_graph=True)
        second.append(torch.autograd.grad(grad_x.float().sum(), (x, y)))
    for name, got, want in zip("ab", *second):
        assert rel_error(got, want) < 3e-2, name


def test_saved_tensor_hooks_and_backward_errors_reach_the_caller(monkeypatch):
    packed, unpacked = [], []

    def pack(t):
        packed.append(t)
        return t

    def unpack(t):
        unpacked.append(t)
        return t

    a, b, offs = small_moe()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = gg_runtime.grouped_mm(a, b, offs)
    assert [t.data_ptr() for t in packed] == [x.data_ptr() for x in (a, b, offs)]
    out.float().sum().backward()
    assert len(unpacked) == 3

    def broken(*args):
        raise ValueError("broken backward")

    monkeypatch.setattr(autograd, "input_gradient", broken)
    with pytest.raises(ValueError, match="broken backward"):
        gg_runtime.grouped_mm(a, b, offs).float().sum().backward()


def test_backward_under_compiled_autograd():
    """Compiled autograd traces every node of a backward, grouped_mm's too."""
    from torch._dynamo import compiled_autograd
    a, b, offs = small_moe()
    grad = randn(a.shape[0], b.shape[2], dtype=a.dtype)
    want = ref_grouped_mm_grads(a, b, offs, grad)
    torch._dynamo.reset()
    with compiled_autograd._enable(torch.compile(backend="eager")):
        gg_runtime.grouped_mm(a, b, offs).backward(grad)
    for name, got, w in zip("ab", (a.grad, b.grad), want):
        assert rel_error(got, w) < 2e-2, name


@pytest.mark.unguarded
def test_graphs_let_their_saved_inputs_go():
    """Outputs dropped, their nodes free what they saved (a, b, offs)."""
    _, b, offs = small_moe()
    gg_runtime.grouped_mm(*small_moe())  # anything allocated once per process
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for _ in range(20):
        a = randn(offs[-1].item(), 32, dtype=torch.bfloat16).requires_grad_()
        out = gg_runtime.grouped_mm(a, b, offs)
        del a, out
    gc.collect()
    # At most: something an earlier test left may be freed meanwhile (seen once:
    # 1.5 KB less); 20 inputs kept would be 20 x a's bytes more.
    assert torch.cuda.memory_allocated() <= before


class TinyMoE(torch.nn.Module):
    def __init__(self, experts, dim, hidden):
        super().__init__()
        self.up = torch.nn.Parameter(torch.randn(experts, hidden, dim, device="cuda",
                                                 dtype=torch.bfloat16) * 0.05)
        self.down = torch.nn.Parameter(torch.randn(experts, dim, hidden, device="cuda",
                                                   dtype=torch.bfloat16) * 0.05)

    def forward(self, x, offs):
        h = gg_runtime.grouped_mm(x, self.up.transpose(1, 2), offs)
        return gg_runtime.grouped_mm(torch.nn.functional.silu(h), self.down.transpose(1, 2), offs)


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    model = TinyMoE(4, 64, 128)
    x = randn(300, 64, dtype=torch.bfloat16).requires_grad_()
    offs = offsets_from_counts([100, 50, 0, 150], "cuda")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x, offs)
    out.float().sum().backward()
    eager = model(x.detach(), offs)
    assert rel_error(out, eager.float()) < 1e-2
    assert model.up.grad is not None and torch.isfinite(model.up.grad.float()).all()


@pytest.mark.parametrize("sms", [1, 7])
def test_sm_limit_caps_the_grid_and_keeps_the_result(sms):
    """Under sm_limit the persistent grid shrinks to that share of the
    device's programs and every tile is still computed, bit for bit."""
    counts = skewed_counts(2048, 16)
    a = randn(2048, 512, dtype=torch.bfloat16)
    b = weights(16, 512, 768, torch.bfloat16, "kn")
    offs = offsets_from_counts(counts, "cuda")
    with gg_runtime.sm_limit(0):  # the full grid, under make test's limited pass too
        full = gg_runtime.grouped_mm(a, b, offs)
        programs = gg_runtime._C.last_programs()
    with gg_runtime.sm_limit(sms):
        limited = gg_runtime.grouped_mm(a, b, offs)
        assert gg_runtime._C.last_programs() < programs
        per_sm = -(-programs // torch.cuda.get_device_properties(a.device).multi_processor_count)
        assert gg_runtime._C.last_programs() <= per_sm * sms
    assert torch.equal(limited, full)
