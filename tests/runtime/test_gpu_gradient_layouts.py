"""Gradients come back in the layout of their inputs, in every autograd route,
computed in that layout (no copy, in grouped_mm's backward or in
AccumulateGrad): the training path of an MoE layer whose weights are passed
as w.transpose(1, 2)."""
import pytest
import torch

import gg_runtime
from gg_runtime import autograd
from gg_runtime.testing import (moe_layer, moe_layer_inputs, offsets_from_counts, operand,
                                ref_grouped_mm, ref_grouped_mm_grads, rel_error)

from conftest import gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
# T = 136 and 135 (+ 3 rows in no group): no tile's multiple, an empty group; 135
# rows are no 16 bytes, which TMA's strides need (the kernels that load and store
# through pointers run), 136 are.
COUNTS = {"t136": [37, 0, 91, 5], "t135": [37, 0, 90, 5]}
M, K, N = 48, 72, 40


def shapes(case: str, counts: list) -> tuple:
    groups, tokens = len(counts), sum(counts) + 3
    return {"ragged_m": ((tokens, K), (groups, K, N)),
            "ragged_k": ((M, tokens), (tokens, N)),
            "ragged_n": ((groups, M, K), (K, tokens)),
            "batched": ((groups, M, K), (groups, K, N))}[case]


def with_autograd(route: str):
    if route == "eager":
        return gg_runtime.grouped_mm
    if route == "custom_op":
        return lambda a, b, offs: torch.ops.gg_runtime.grouped_mm(a, b, offs, None, None)
    if route == "inductor":
        # Inductor generates Triton kernels for what surrounds the op: it needs
        # Triton, which the runtime's test environment leaves out on purpose.
        pytest.importorskip("triton", reason="inductor needs Triton (not gg_runtime)")
    torch._dynamo.reset()
    return torch.compile(gg_runtime.grouped_mm, fullgraph=True, backend=route)


@pytest.mark.parametrize("route", ["eager", "custom_op", "aot_eager", "inductor"])
@pytest.mark.parametrize("a_row_major", [True, False], ids=["a_rows", "a_cols"])
@pytest.mark.parametrize("b_row_major", [True, False], ids=["b_rows", "b_cols"])
@pytest.mark.parametrize("case", ["ragged_m", "ragged_k", "ragged_n", "batched"])
@pytest.mark.parametrize("counts", COUNTS.values(), ids=COUNTS.keys())
def test_gradients_have_their_inputs_strides(case, counts, a_row_major, b_row_major, route):
    a_shape, b_shape = shapes(case, counts)
    a = operand(a_shape, a_row_major, False, torch.bfloat16).requires_grad_()
    b = operand(b_shape, b_row_major, False, torch.bfloat16).requires_grad_()
    offs = None if case == "batched" else offsets_from_counts(counts)
    out = with_autograd(route)(a, b, offs)
    grad = torch.randn(out.shape, device="cuda").to(out.dtype)
    got = torch.autograd.grad(out, (a, b), grad)
    for name, x, g, want in zip("ab", (a, b), got, ref_grouped_mm_grads(a, b, offs, grad)):
        assert rel_error(g, want) < 2e-2, name
        assert g.stride() == x.stride(), (name, g.stride(), x.stride())


def copies_in_gradient_nodes(backward) -> list:
    """Names of the copies that backward() runs inside grouped_mm's backward
    nodes or AccumulateGrad (profiled on the CPU side, where each op's parent
    is known), with the node they ran in."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        backward()
    copies = []
    for event in prof.events():
        if event.name not in ("aten::copy_", "aten::clone", "aten::contiguous"):
            continue
        parent = event.cpu_parent
        while parent is not None:
            node = parent.name.lower().replace("_", "")
            if "accumulategrad" in node or "groupedmm" in node:
                copies.append((event.name, parent.name))
                break
            parent = parent.cpu_parent
    return copies


def moe_layer_step(bias=False):
    """A small MoE layer's forward; returns its backward and the inputs."""
    inputs = moe_layer_inputs(300, 64, 48, 4, bias=bias)
    out = moe_layer(gg_runtime.grouped_mm, **inputs, top_k=2)
    grad = torch.randn_like(out)
    return (lambda: out.backward(grad)), inputs


@pytest.mark.parametrize("bias", [False, True])
def test_moe_layer_backward_copies_no_gradient(bias):
    backward, inputs = moe_layer_step(bias)
    assert copies_in_gradient_nodes(backward) == []
    for name, t in inputs.items():
        assert t.grad is not None and t.grad.stride() == t.stride(), name


def test_the_copy_check_sees_a_gradient_in_the_wrong_layout(monkeypatch):
    """With every gradient computed row-major, AccumulateGrad copies the
    expert weights' gradients: the check above can fail."""
    monkeypatch.setattr(autograd, "stored_transposed", lambda x: False)
    backward, _ = moe_layer_step()
    copies = copies_in_gradient_nodes(backward)
    assert len(copies) >= 2 and all("AccumulateGrad" in node for _, node in copies), copies


@pytest.mark.parametrize("bias", [False, True])
def test_moe_layer_matches_float32_reference(bias):
    """The layer's output and every gradient (x, router, both expert weights,
    their biases) against the same layer in float32, whose grouped product is
    a loop over the groups; the routing is computed in float32 in both, so
    both pick the same experts."""
    inputs = moe_layer_inputs(300, 64, 48, 4, bias=bias)
    refs = {name: t.detach().float().requires_grad_() for name, t in inputs.items()}
    outs = [moe_layer(mm, **x, top_k=2) for mm, x in ((gg_runtime.grouped_mm, inputs),
                                                       (ref_grouped_mm, refs))]
    grad = torch.randn_like(refs["x"])
    outs[0].backward(grad.to(outs[0].dtype))
    outs[1].backward(grad)
    assert rel_error(outs[0], outs[1].detach()) < 2e-2
    for name, t in inputs.items():
        assert rel_error(t.grad, refs[name].grad) < 2e-2, name
