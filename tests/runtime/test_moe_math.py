"""moe_experts' autograd function (gg_runtime/moe/differentiable.py: what its forward
returns and keeps, the permutations of its backward and every gradient
formula) in float64 on CPU, its operators stood in for by float64
references (moe_experts_for_backward, grouped_mm, gathered_mm, gathered_mm_k,
swiglu_backward and combine as their contracts say), against torch's
autograd through a layer computed expert by expert.  The kernels
themselves are checked on the GPU (test_gpu_moe_operators.py and
test_gpu_moe_experts.py); this checks the composition, on every machine."""
from types import SimpleNamespace

import pytest
import torch

import gg_runtime.autograd
import gg_runtime.moe.differentiable
from gg_runtime.moe.differentiable import ExpertsFunction
from moe_reference import combine_ref, layer_ref, route_by_sort
from gg_runtime.testing import gated_activation, moe_layer, moe_layer_no_atomics, route_top_k

DIFFERENTIABLE = ("x", "topk_weights", "w13", "w2", "b13", "b2")


def grouped_mm_ref(a, b, offs, bias=None, out_dtype=None, tf32=False):
    """The two forms moe.py uses: ragged M (2-D x 3-D; rows past the last
    group are zeros) and ragged K (2-D x 2-D -> [G, M, N])."""
    ends = offs.long().tolist()
    starts = [0] + ends[:-1]
    if b.dim() == 3:
        out = a.new_zeros(a.shape[0], b.shape[-1])
        for g, (start, end) in enumerate(zip(starts, ends)):
            out[start:end] = a[start:end] @ b[g] + (0 if bias is None else bias[g])
        return out
    return torch.stack([a[:, start:end] @ b[start:end] for start, end in zip(starts, ends)])


def swiglu_backward_ref(gu, grad, scale, gate_up="concatenated", activation="swiglu"):
    gu = gu.detach().requires_grad_()
    with torch.enable_grad():
        h = gated_activation(gu, gate_up == "interleaved", activation)
        (h * scale[:, None]).backward(grad)
    h = h.detach()
    return gu.grad, h * scale[:, None], (grad * h).sum(-1)


def grouped_mm_glu_ref(x, rows, k, w13, offs, bias=None, gate_up="concatenated",
                       activation="swiglu", save_gu=True):
    gu = grouped_mm_ref(x if rows is None else x[rows // k], w13.mT, offs, bias)
    return gated_activation(gu, gate_up == "interleaved", activation), gu if save_gu else gu[:0]


def moe_experts_for_backward_ref(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None,
                                 gate_up="concatenated", activation="swiglu", gathered=True):
    """torch.ops.gg_runtime.moe_experts_for_backward's contract: (out, gu,
    order, offs, inverse, gathered), the operator's decision `gathered` given."""
    tokens, k = topk_ids.shape
    order, offs, inverse = route_by_sort(topk_ids, w13.shape[0])
    h, gu = grouped_mm_glu_ref(x, order, k, w13, offs, b13, gate_up, activation)
    ys = grouped_mm_ref(h, w2.mT, offs, b2)
    out = combine_ref(ys, inverse.view(tokens, k), topk_weights.float(), offs).to(x.dtype)
    return out, gu, order, offs, inverse, gathered


def gathered_mm_ref(x, rows, k, b, offs):
    return grouped_mm_ref(x[rows // k], b, offs)


def gathered_mm_k_ref(a, b, offs, rows, k, gather_a):
    """out[g] = a_g^T @ b_g, the gathered operand's row r being its row rows[r] // k."""
    if gather_a:
        a = a[rows // k]
    else:
        b = b[rows // k]
    return grouped_mm_ref(a.mT, b, offs)


def default(fn):
    return SimpleNamespace(default=fn)


def use_reference_ops(monkeypatch, gathered=True):
    """The operators moe/differentiable.py and autograd.py call, as their
    references; the forward's says the products gather rows where `gathered`
    (the operator decides by the experts' width), and the backward's do as it
    says."""
    def for_backward(*args):
        return moe_experts_for_backward_ref(*args, gathered=gathered)

    ops = SimpleNamespace(
        moe_experts_for_backward=default(for_backward),
        grouped_mm=default(grouped_mm_ref),
        swiglu_backward=default(swiglu_backward_ref),
        gathered_mm=default(gathered_mm_ref),
        gathered_mm_k=default(gathered_mm_k_ref),
        combine=default(combine_ref))
    for module in (gg_runtime.moe.differentiable, gg_runtime.autograd):
        monkeypatch.setattr(module, "OPS", ops)


@pytest.fixture
def reference_ops(monkeypatch):
    use_reference_ops(monkeypatch)


def inputs(tokens, hidden, inter, experts, k, bias, transposed, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale

    given = {"x": randn(tokens, hidden),
             "topk_ids": torch.randint(0, experts, (tokens, k), generator=gen),
             "topk_weights": torch.rand(tokens, k, generator=gen, dtype=torch.float64),
             "w13": randn(experts, 2 * inter, hidden, scale=4 * hidden ** -0.5),
             "w2": randn(experts, hidden, inter, scale=inter ** -0.5),
             "b13": randn(experts, 2 * inter) if bias else None,
             "b2": randn(experts, hidden) if bias else None}
    if transposed:  # weights as transposed views: their gradients keep those strides
        given["w13"] = given["w13"].mT.contiguous().mT
        given["w2"] = given["w2"].mT.contiguous().mT
    return given


def outputs_and_grads(fn, given, grad):
    leaves = {n: t.clone().requires_grad_() if n in DIFFERENTIABLE and t is not None else t
              for n, t in given.items()}  # clone keeps a dense tensor's strides
    out = fn(**leaves)
    out.backward(grad)
    grads = {n: leaves[n].grad for n in DIFFERENTIABLE if leaves[n] is not None}
    return out, grads, leaves


@pytest.mark.parametrize("gather", [True, False], ids=["gathered", "copied"])
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("shape", [(37, 12, 6, 5, 3), (20, 8, 4, 1, 1), (64, 8, 4, 16, 8)],
                         ids=["k3", "one_expert", "k8_empty_experts"])
def test_matches_autograd_of_the_expert_loop(monkeypatch, shape, bias, gate_up, activation,
                                             gather):
    """gather: the products read rows through the routing's order, or (as the
    forward says for experts wider than ragged_glu's GATHER_MAX_INTER) from
    permuted copies."""
    use_reference_ops(monkeypatch, gathered=gather)
    given = inputs(*shape, bias=bias, transposed=shape[0] == 37)
    given["topk_ids"][::7, 0] = -1  # dropped slots
    given["topk_ids"][1, -1] = shape[3]  # past the last expert: dropped too
    # Seeded: the global generator's state depends on the tests before (hypothesis's).
    grad = torch.randn(shape[0], shape[1], generator=torch.Generator().manual_seed(1),
                       dtype=torch.float64)

    def ours(x, topk_ids, topk_weights, w13, w2, b13, b2):
        return ExpertsFunction.apply(x, topk_ids, topk_weights, w13, w2, b13, b2, gate_up,
                                     activation, None, None)

    def theirs(**given):
        return layer_ref(**given, interleaved=gate_up == "interleaved", activation=activation)

    out, grads, leaves = outputs_and_grads(ours, given, grad)
    want, want_grads, _ = outputs_and_grads(theirs, given, grad)
    # The routing weights are taken in float32 (combine's weights, swiglu_backward's
    # scale): relative errors of 1e-8 to 1e-7 (float32's rounding, 6e-8, in sums
    # over rows: 1.3e-7 seen for b13), a wrong formula's of 1.
    assert (out - want).norm() <= 1e-6 * want.norm()
    assert grads.keys() == want_grads.keys()
    for name, got in grads.items():
        want_grad = want_grads[name]
        assert (got - want_grad).norm() <= 1e-6 * want_grad.norm(), name
        assert got.stride() == leaves[name].stride(), name
    if shape[0] == 37:
        assert leaves["w13"].stride(-2) == 1 and leaves["w2"].stride(-2) == 1
    dropped = (given["topk_ids"] < 0) | (given["topk_ids"] >= shape[3])
    assert torch.all(grads["topk_weights"][dropped] == 0)


def test_backward_twice_with_the_graph_kept(reference_ops):
    """retain_graph=True: the backward keeps what it read (the up projection's
    output, which it frees otherwise), so a second backward adds the same
    gradients again."""
    given = inputs(29, 8, 4, 6, 2, bias=True, transposed=False)
    grad = torch.randn(29, 8, dtype=torch.float64)
    leaves = {n: t.clone().requires_grad_() if n in DIFFERENTIABLE else t for n, t in given.items()}
    out = ExpertsFunction.apply(*leaves.values(), "concatenated", "swiglu", None, None)
    out.backward(grad, retain_graph=True)
    once = {n: leaves[n].grad.clone() for n in DIFFERENTIABLE}
    out.backward(grad)
    for name in DIFFERENTIABLE:
        assert torch.allclose(leaves[name].grad, 2 * once[name], rtol=1e-12, atol=0), name
    with pytest.raises(RuntimeError, match="second time"):
        out.backward(grad)


@pytest.mark.parametrize("use_reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_activation_checkpointing(reference_ops, use_reentrant):
    """Under torch.utils.checkpoint (what MoE training wraps layers in) the
    gradients are the same: the forward runs again in backward and its saved
    tensors go through checkpoint's hooks."""
    given = inputs(29, 8, 4, 6, 2, bias=True, transposed=False)
    grad = torch.randn(29, 8, dtype=torch.float64)

    def plain(x, topk_ids, topk_weights, w13, w2, b13, b2):
        return ExpertsFunction.apply(x, topk_ids, topk_weights, w13, w2, b13, b2, "concatenated",
                                     "swiglu", None, None)

    def checkpointed(**given):
        return torch.utils.checkpoint.checkpoint(plain, *given.values(),
                                                 use_reentrant=use_reentrant)

    out, grads, _ = outputs_and_grads(checkpointed, given, grad)
    want, want_grads, _ = outputs_and_grads(plain, given, grad)
    assert torch.equal(out, want)
    for name, got in grads.items():
        assert torch.equal(got, want_grads[name]), name


@pytest.mark.parametrize("activation,interleaved", [("swiglu", False), ("gpt_oss", True)])
@pytest.mark.parametrize("layer", [moe_layer, moe_layer_no_atomics],
                         ids=["torchtitan", "no_atomics"])
def test_bench_torch_layers_compute_the_layer(layer, activation, interleaved):
    """make bench's torch layers (the anchors of the experts section) with a
    float64 grouped product, router included, against the expert loop."""
    given = inputs(41, 8, 4, 6, 2, bias=True, transposed=False)
    router = torch.randn(8, 6, dtype=torch.float64)
    weights, ids = route_top_k(given["x"], router, 2)
    params = {n: given[n] for n in ("x", "w13", "w2", "b13", "b2")}
    out = layer(grouped_mm_ref, router=router, top_k=2, activation=activation,
                interleaved=interleaved, **params)
    want = layer_ref(topk_ids=ids, topk_weights=weights.double(), interleaved=interleaved,
                     activation=activation, **params)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
