"""The torch bridge's C++ autograd node, which eager grouped_mm with autograd
records, driven on the CPU with a plain matmul as its forward and backward:
gradients, which inputs it is asked for, saved inputs, errors."""
import pytest
import torch
import torch.autograd.forward_ad as fwad

from gg_runtime import _native

pytestmark = pytest.mark.skipif(_native.bridge is None, reason="the torch bridge is not loaded")
CASE = object()  # passed through to forward and backward untouched


def forward(case, a, b, offs, out_dtype):
    assert case is CASE and not torch.is_grad_enabled()
    return a @ b


def backward(case, a, b, offs, grad, need_a, need_b):
    return (grad @ b.t() if need_a else None, a.t() @ grad if need_b else None)


def with_autograd(a, b, fwd=forward, bwd=backward):
    return _native.bridge.with_autograd(fwd, bwd, CASE, a, b, None, None)


def inputs(b_requires_grad=True):
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    return a, torch.randn(3, 4, dtype=torch.float64, requires_grad=b_requires_grad)


def test_gradients_are_backwards():
    a, b = inputs()
    out = with_autograd(a, b)
    assert out.requires_grad and out.grad_fn.name() == "GroupedMMBackward"
    grad = torch.randn(5, 4, dtype=torch.float64)
    got = torch.autograd.grad(out, (a, b), grad)
    want = torch.autograd.grad(a @ b, (a, b), grad)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_backward_is_asked_only_for_the_gradients_needed():
    asked = []

    def recording(case, a, b, offs, grad, need_a, need_b):
        asked.append((need_a, need_b))
        return backward(case, a, b, offs, grad, need_a, need_b)

    a, b = inputs(b_requires_grad=False)
    with_autograd(a, b, bwd=recording).sum().backward()
    a, b = inputs()
    torch.autograd.grad(with_autograd(a, b, bwd=recording).sum(), b)
    assert asked == [(True, False), (False, True)]


def test_forward_mode_gradients_and_non_tensors_are_left_to_python():
    a, b = inputs()
    with fwad.dual_level():
        dual = fwad.make_dual(a.detach(), torch.randn_like(a))
        assert with_autograd(dual, b) is None
    assert with_autograd("a", b) is None
    with pytest.raises(TypeError, match="takes 7 arguments"):
        _native.bridge.with_autograd(forward, backward, CASE, a, b, None)


def test_errors_of_forward_and_backward_reach_the_caller():
    a, b = inputs()
    with pytest.raises(RuntimeError, match="must return a new tensor"):
        with_autograd(a, b, fwd=lambda case, x, y, offs, out_dtype: (x @ y).t())

    def failing(*args):
        raise KeyError("from backward")

    with pytest.raises(KeyError, match="from backward"):
        with_autograd(a, b, bwd=failing).sum().backward()
    with pytest.raises(RuntimeError, match=r"must return \(grad_a, grad_b\)"):
        with_autograd(a, b, bwd=lambda *args: (None,)).sum().backward()


def test_backward_under_compiled_autograd_says_what_to_do():
    """A node recorded with compiled autograd off cannot be traced by it."""
    from torch._dynamo import compiled_autograd
    a, b = inputs()
    out = with_autograd(a, b)
    torch._dynamo.reset()
    refused = pytest.raises(NotImplementedError, match="run the forward with compiled autograd on")
    with refused, compiled_autograd._enable(torch.compile(backend="eager")):
        out.sum().backward()
