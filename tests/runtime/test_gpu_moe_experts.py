"""moe_experts and MoEExperts against a float32 layer computed expert by
expert, output and every gradient, no worse than twice the error of the same
layer computed in the inputs' dtype by torch; edges (dropped slots, empty
experts, T = 0, k up to 16, E up to 512), layouts, torch.compile, CUDA graphs,
transformers' models.  The operators it is made of, each alone:
test_gpu_moe_operators.py."""
import copy
import os

import pytest
import torch

import gg_runtime
from gg_runtime import _C
from moe_reference import layer_ref
from gg_runtime.testing import randn, rel_error

from conftest import COMPILE_BACKENDS, gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]


def make_inputs(tokens, hidden, inter, experts, k, dtype=torch.bfloat16, bias=False, seed=0):
    torch.manual_seed(seed)
    scores = torch.rand(tokens, experts, device="cuda")
    weights, ids = scores.topk(k, dim=-1)
    inputs = {"x": randn(tokens, hidden, dtype=dtype),
              "topk_ids": ids, "topk_weights": weights.softmax(-1),
              "w13": randn(experts, 2 * inter, hidden, dtype=dtype, scale=hidden ** -0.5),
              "w2": randn(experts, hidden, inter, dtype=dtype, scale=inter ** -0.5)}
    if bias:
        inputs.update(b13=randn(experts, 2 * inter, dtype=dtype, scale=0.1),
                      b2=randn(experts, hidden, dtype=dtype, scale=0.1))
    return inputs


DIFFERENTIABLE = ("x", "topk_weights", "w13", "w2", "b13", "b2")
# The widest experts (I) whose products gather rows through the routing's order
# (aot/families/ragged_glu.py); wider ones read permuted copies.
GATHER_MAX_INTER = _C.families()["ragged_glu"]["constants"]["kGatherMaxInter"]


def outputs_and_grads(fn, inputs, grad):
    """fn's output and the gradients of every differentiable input given."""
    leaves = {n: t.detach().clone().requires_grad_() if n in DIFFERENTIABLE else t
              for n, t in inputs.items()}
    out = fn(**leaves)
    out.backward(grad)
    return [out] + [leaves[n].grad for n in DIFFERENTIABLE if n in leaves]


def check_against_reference(inputs, gate_up="concatenated", fn=None, activation="swiglu"):
    fn = fn or (lambda **kw: gg_runtime.moe_experts(**kw, gate_up=gate_up, activation=activation))
    grad = randn(*inputs["x"].shape, dtype=inputs["x"].dtype)
    ours = outputs_and_grads(fn, inputs, grad)
    as_float = {n: t.float() if t.is_floating_point() else t for n, t in inputs.items()}
    # gpt-oss's clamps make the gradient jump at +-7: the float32 reference decides
    # them on the up projection as both implementations store it (x's dtype), or
    # every element within half an ulp of a clamp would count its gradient as error.
    gu_dtype = inputs["x"].dtype if activation == "gpt_oss" else None

    def reference(**kw):
        return layer_ref(**kw, interleaved=gate_up == "interleaved", activation=activation,
                         gu_dtype=gu_dtype)

    ref = outputs_and_grads(reference, as_float, grad.float())
    torchs = outputs_and_grads(reference, inputs, grad)
    names = ["out"] + [n for n in DIFFERENTIABLE if n in inputs]
    for name, got, want, theirs in zip(names, ours, ref, torchs):
        assert got.dtype == want.dtype or got.dtype == inputs["x"].dtype, name
        ours_error, torch_error = rel_error(got, want), rel_error(theirs, want)
        assert ours_error <= 2 * torch_error + 1e-3, (name, ours_error, torch_error)
    return ours


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_matches_float32_layer(dtype, gate_up, bias):
    check_against_reference(make_inputs(133, 72, 40, 6, 2, dtype, bias), gate_up)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_gpt_oss_activation(dtype, gate_up, bias):
    """gpt-oss's clamped activation, with w13 scaled so that many gate and up
    values lie past the clamps (their gradients are zero there)."""
    inputs = make_inputs(133, 72, 40, 6, 2, dtype, bias)
    inputs["w13"] = inputs["w13"] * 6
    check_against_reference(inputs, gate_up, activation="gpt_oss")


@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("tokens", [12, 300])
def test_nan_token_stays_its_own(activation, tokens):
    """A NaN in one token: its output all NaN (gpt-oss's clamps keep a NaN,
    as torch.clamp does), every other token's as the reference."""
    inputs = make_inputs(tokens, 72, 40, 6, 2, bias=True)
    inputs["x"][7, 3] = float("nan")
    with torch.no_grad():
        out = gg_runtime.moe_experts(**inputs, activation=activation)
    want = layer_ref(**{n: t.float() if t.is_floating_point() else t for n, t in inputs.items()},
                     activation=activation)
    others = torch.arange(tokens, device="cuda") != 7
    assert out[7].isnan().all()
    assert rel_error(out[others], want[others]) < 1e-2


def test_gpt_oss_activation_routed_in_chunks():
    """1200 slots: the routing's three launches and its scratch."""
    inputs = make_inputs(300, 64, 40, 8, 4, bias=True)
    inputs["w13"] = inputs["w13"] * 6
    check_against_reference(inputs, "interleaved", activation="gpt_oss")


@pytest.mark.parametrize("shape", [(1, 64, 32, 1, 1), (257, 128, 96, 24, 16), (40, 64, 32, 512, 8),
                                   (1000, 256, 176, 64, 6), (60, 32, 16, 1100, 4),
                                   (1000, 256, 96, 128, 8)],
                         ids=["one_token_one_expert", "k16", "e512", "fine_grained",
                              "e1100_routed_by_sort", "e128_k8_routed_in_32_chunks"])
def test_shapes(shape):
    """Forward and backward (the routing then saved: its scratch a tensor of
    its own, which the kernels once wrote after it was freed)."""
    check_against_reference(make_inputs(*shape))


def test_no_tokens():
    inputs = make_inputs(0, 64, 32, 4, 2)
    out = gg_runtime.moe_experts(**inputs)
    assert out.shape == (0, 64)


def test_all_tokens_on_one_expert_and_empty_experts():
    inputs = make_inputs(300, 64, 48, 16, 1)
    inputs["topk_ids"] = torch.full_like(inputs["topk_ids"], 7)
    check_against_reference(inputs)


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_dropped_slots_add_nothing(bias):
    """-1 (and any id outside [0, E)) drops the slot: the output is that of the
    other slots and the dropped weight's gradient is zero (the biases' terms
    included).  A token with one expert in all its slots counts it each time."""
    inputs = make_inputs(97, 64, 48, 8, 4, bias=bias)
    ids = inputs["topk_ids"]
    dropped = torch.rand(ids.shape, device="cuda") < 0.3
    ids[dropped] = -1
    ids[0, 0] = 8  # past the last expert: dropped too
    dropped[0, 0] = True
    ids[1], dropped[1] = 3, False
    out, *grads = check_against_reference(inputs)
    d_weights = grads[1]
    assert torch.all(d_weights[dropped] == 0)


def test_strided_inputs_and_gradient_layouts():
    """x a column slice, topk_weights float32 and strided, w13 a transposed view
    of an [E, H, 2I] tensor: every gradient comes back with its input's strides."""
    inputs = make_inputs(150, 64, 40, 8, 3)
    inputs["x"] = torch.cat([inputs["x"], inputs["x"]], 1)[:, 3:67]
    inputs["topk_weights"] = torch.cat([inputs["topk_weights"]] * 2, 1)[:, ::2]
    inputs["w13"] = inputs["w13"].mT.contiguous().mT
    inputs["w2"] = inputs["w2"].mT.contiguous().mT
    out, dx, d_weights, dw13, dw2 = check_against_reference(inputs)
    for grad, name in ((dw13, "w13"), (dw2, "w2")):
        assert grad.stride() == inputs[name].stride(), name


@pytest.mark.parametrize("inter", [48, GATHER_MAX_INTER + 8], ids=["gathered", "copied"])
def test_up_projection_gathers_or_copies_the_tokens(inter):
    """Both ways the products may read the tokens and the gradient's rows:
    through the routing's order, or from permuted copies where the experts
    are wider than GATHER_MAX_INTER; the forward says which, for the backward."""
    inputs = make_inputs(300, 64, inter, 8, 2, bias=True)
    gathered = torch.ops.gg_runtime.moe_experts_for_backward(**inputs)[-1]
    assert gathered == (inter <= GATHER_MAX_INTER)
    check_against_reference(inputs)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_out_takes_the_output(dtype):
    """out=: the output written into the tensor given (poisoned before) and
    returned, the same as without it; refused over x and with gradients."""
    inputs = make_inputs(257, 128, 96, 24, 4, dtype=dtype, bias=True)
    with torch.no_grad():
        want = gg_runtime.moe_experts(**inputs)
        out = torch.full_like(want, float("nan"))
        assert gg_runtime.moe_experts(**inputs, out=out) is out
        assert torch.equal(out, want)
        with pytest.raises(ValueError, match="out must not overlap x"):
            gg_runtime.moe_experts(**inputs, out=inputs["x"])
    with pytest.raises(ValueError, match="out is for inference"):
        gg_runtime.moe_experts(**{**inputs, "w2": inputs["w2"].requires_grad_()}, out=out)


def test_forward_without_gradients_matches_training_forward():
    """Nothing requires grad: the forward keeps nothing (no gu written), same output."""
    inputs = make_inputs(300, 64, 48, 8, 2)
    grad = randn(300, 64, dtype=torch.bfloat16)
    trained = outputs_and_grads(gg_runtime.moe_experts, inputs, grad)[0]
    assert torch.equal(gg_runtime.moe_experts(**inputs), trained)
    with torch.no_grad():
        leaves = {n: t.requires_grad_() if n in DIFFERENTIABLE else t
                  for n, t in make_inputs(300, 64, 48, 8, 2).items()}
        assert torch.equal(gg_runtime.moe_experts(**leaves), trained)


def test_module_forward_and_parameters():
    experts = gg_runtime.MoEExperts(8, 64, 32, bias=True, device="cuda", dtype=torch.bfloat16)
    names = {n: tuple(p.shape) for n, p in experts.named_parameters()}
    assert names == {"gate_up_proj": (8, 64, 64), "down_proj": (8, 64, 32),
                     "gate_up_proj_bias": (8, 64), "down_proj_bias": (8, 64)}
    inputs = make_inputs(50, 64, 32, 8, 2)
    out = experts(inputs["x"], inputs["topk_ids"], inputs["topk_weights"])
    want = layer_ref(inputs["x"].float(), inputs["topk_ids"], inputs["topk_weights"],
                     experts.gate_up_proj.float(), experts.down_proj.float(),
                     experts.gate_up_proj_bias.float(), experts.down_proj_bias.float())
    assert rel_error(out, want) < 2e-2


def test_cuda_graph_replay_with_new_routing():
    inputs = make_inputs(128, 64, 32, 8, 2)
    static = {n: t.clone() for n, t in inputs.items()}
    gg_runtime.moe_experts(**static)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gg_runtime.moe_experts(**static)
    fresh = make_inputs(128, 64, 32, 8, 2, seed=1)
    for name in ("x", "topk_ids", "topk_weights"):
        static[name].copy_(fresh[name])
    graph.replay()
    want = layer_ref(**{n: t.float() if t.is_floating_point() else t for n, t in static.items()})
    assert rel_error(out, want) < 2e-2


# (tokens, hidden, inter, experts, k): routed in one launch or three, warp-
# specialised or decode-sized up projections, so consecutive forwards' graphs
# differ in length, kernels and grids.
GRAPH_PROBLEMS = [(256, 64, 32, 8, 2), (3000, 96, 48, 16, 4), (5, 128, 40, 64, 8),
                  (500, 64, 4104, 4, 1), (1, 64, 32, 1, 1)]


def test_forwards_launched_as_one_graph_each_across_shapes_and_streams():
    """Without poisoning (whose fills come between the kernels) each no-grad
    forward's kernels go to the GPU as one CUDA graph, updated from call to
    call: forwards of different shapes queued back to back on two streams,
    none waiting for another, each as the float32 layer."""
    from gg_runtime import _ops
    problems = [make_inputs(*shape, seed=i) for i, shape in enumerate(GRAPH_PROBLEMS)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outs, launched = [], []
    _ops.set_poison(False)
    try:
        for turn in range(4):
            before = _C.graph_launches()
            for i, inputs in enumerate(problems):
                with torch.cuda.stream(side if (i + turn) % 2 else torch.cuda.current_stream()):
                    outs.append(gg_runtime.moe_experts(**inputs))
            launched.append(_C.graph_launches() - before)
        torch.cuda.current_stream().wait_stream(side)
    finally:
        _ops.set_poison(True)
    for out, inputs in zip(outs, problems * 4):
        want = layer_ref(**{n: t.float() if t.is_floating_point() else t
                            for n, t in inputs.items()})
        assert rel_error(out, want) < 2e-2
    # One graph a forward (the wide experts' holds the kernels after torch's
    # permuted copy of the tokens, its routing one launch before it) once
    # each stream's kernel scratch, which a graph's kernels share, has grown
    # to the largest problem's (growing it submits the kernels recorded before).
    assert launched[2:] == [len(problems)] * 2, launched


@pytest.mark.unguarded  # guarded, each part is an allocation of its own
@pytest.mark.skipif(os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") == "1",
                    reason="counts the caching allocator's allocations")
@pytest.mark.parametrize("tokens", [256, 3000], ids=["routed_in_one_launch", "in_three"])
def test_forward_without_autograd_allocates_twice(tokens):
    """Without autograd the routing (its sort's counts too) and the products'
    rows are parts of one block: a forward allocates that block and its output."""
    inputs = make_inputs(tokens, 64, 32, 8, 2)
    gg_runtime.moe_experts(**inputs)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    out = gg_runtime.moe_experts(**inputs)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] - before == 2
    want = layer_ref(**{n: t.float() if t.is_floating_point() else t for n, t in inputs.items()})
    assert rel_error(out, want) < 2e-2


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
def test_torch_compile_fullgraph(backend):
    """Traced whole, forward and backward."""
    torch._dynamo.reset()
    compiled = torch.compile(gg_runtime.moe_experts, fullgraph=True, backend=backend)
    check_against_reference(make_inputs(90, 64, 48, 8, 2), fn=compiled)


def compare_with_transformers_grouped_mm(model, vocab):
    """The model's logits and its first experts module's weight gradients with
    gg_runtime as its experts implementation (ExpertsInterface) and with
    transformers' own grouped_mm implementation, each against the model in
    float32 (transformers' eager experts): ours no worse than twice theirs.
    (Not ours against theirs: where gpt-oss's clamps make the gradient jump,
    the two round the up projection differently, once or twice with its bias.)"""
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register("gg_runtime", gg_runtime.transformers_experts_forward)
    ids = torch.randint(0, vocab, (2, 40), device="cuda")
    reference = copy.deepcopy(model).float()
    results = {}
    for implementation, run in (("eager", reference), ("grouped_mm", model),
                                ("gg_runtime", model)):
        run.config._experts_implementation = implementation
        run.zero_grad()
        logits = run(ids).logits
        logits.float().square().mean().backward()
        experts = next(m for m in run.modules() if hasattr(m, "gate_up_proj"))  # the first
        results[implementation] = (logits.detach(), experts.gate_up_proj.grad.clone(),
                                   experts.down_proj.grad.clone())
    for name, ours, theirs, want in zip(("logits", "gate_up_proj.grad", "down_proj.grad"),
                                        results["gg_runtime"], results["grouped_mm"],
                                        results["eager"]):
        ours_error, their_error = rel_error(ours, want), rel_error(theirs, want)
        assert ours_error <= 2 * their_error + 1e-3, (name, ours_error, their_error)


# Small models of the MoE families transformers runs through ExpertsInterface:
# (config class, model class, the config's own arguments, the std gate_up_proj is
# drawn with or None for the model's own initialisation).  gpt-oss: interleaved
# gate/up, biases and the clamped activation, weights large enough that the clamps act.
SMALL_MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  {"intermediate_size": 128, "moe_intermediate_size": 48, "num_experts": 8,
                   "decoder_sparse_step": 1, "mlp_only_layers": []}, None),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                {"intermediate_size": 96, "num_local_experts": 6}, None),
    "gpt_oss": ("GptOssConfig", "GptOssForCausalLM",
                {"intermediate_size": 48, "num_local_experts": 8,
                 "layer_types": ["full_attention"]}, 0.5),
}
# One block: a second block's router would take its top k of the first one's
# output, where a difference of one rounding can flip a near tie, and a token's
# logits with it (seen on the Mixtral model with two blocks: one token of 80 off
# by 0.10, the rest as close to float32 as transformers' own grouped_mm).
SMALL_MODEL_ARGS = {"vocab_size": 128, "hidden_size": 64, "num_hidden_layers": 1,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                    "num_experts_per_tok": 2}


@pytest.mark.parametrize("family", SMALL_MODELS)
def test_transformers_models(family):
    transformers = pytest.importorskip("transformers")
    config_class, model_class, own_args, gate_up_std = SMALL_MODELS[family]
    config = getattr(transformers, config_class)(**SMALL_MODEL_ARGS, **own_args)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(config).to("cuda", torch.bfloat16)
    if gate_up_std is not None:
        with torch.no_grad():
            for experts in (m for m in model.modules() if hasattr(m, "gate_up_proj")):
                experts.gate_up_proj.normal_(0, gate_up_std)
                experts.gate_up_proj_bias.normal_(0, gate_up_std)
    compare_with_transformers_grouped_mm(model, SMALL_MODEL_ARGS["vocab_size"])
