"""moe_experts(fp8=recipe), fp8 training of the experts, on the GPU: the
output and every gradient against gg_runtime.testing.moe_fp8_training's
float64 reference (the operands quantized as the implementation quantizes
them), for both recipes: H and I multiples of 16 but not of 128 (the up
projection's Triton kernel with 128 x 128 blocks) and of 128, small and
large groups, E = 1 and 256, k from 1 to 8, T = 0, 1 and 7,
experts of 0, 1 and 127 rows, dropped and duplicate ids, both gate_up
layouts and activations, biases, weights stored transposed (their
gradients in their strides), float16 tokens, output-gradient rows from
1e-30 to 1e10 and zero, token rows of 1e-10 to 1e10 and experts' weights of
magnitudes far apart; some inputs frozen; each up-projection kernel that
keeps gu forced; CUDA graphs; torch.compile; weights quantized once
(quantize_expert_weights) against the recipe; float32 master weights and
biases.
Outputs poisoned.

Normal data: every quantization rounds, and the forward's fast
accumulation (the serving kernels') moves some of gu's elements by its
reduced precision, which the backward's products carry (TOLERANCE).
"""
import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import forced, randn, rel_error
from gg_runtime.testing.fp8_training import RECIPES
from gg_runtime.testing.moe_fp8_training import GRADIENTS, moe_experts_fp8_training_ref

from conftest import COMPILE_BACKENDS, device_arch, up_projection_runs_on

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]

# fp8 products of normal data whose operands are the reference's own: their
# accumulation and the bfloat16 roundings (the serving tests' RANDOM_TOLERANCE).
TOLERANCE = 2e-2
# (tokens, hidden, inter, experts, k)
SHAPES = {
    # The up projection that keeps gu (aot/families/scaled_ragged_glu.py): the
    # warp-specialised split tiles, for 128 x 128 blocks only where I is a
    # multiple of 64 (else the Triton kernel; I = 320, an odd multiple: the
    # up half's blocks start mid-tile).
    "tile_tails": (64, 272, 208, 8, 4),
    "small_groups": (64, 272, 256, 8, 4),
    "large_groups": (1024, 272, 256, 4, 2),
    "large_groups_tails": (1024, 272, 208, 4, 2),
    "large_groups_halves": (1024, 272, 320, 4, 2),
    "one_expert": (37, 144, 128, 1, 1),
    "e256_k8": (300, 256, 128, 256, 8),
    "one_token": (1, 272, 208, 16, 8),
    "seven_tokens": (7, 128, 128, 8, 3),
}


def routing(tokens, experts, k):
    """(topk_ids, topk_weights): k distinct experts per token, softmax weights."""
    weights, ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=-1)
    return ids, weights.softmax(-1)


def layer(tokens, hidden, inter, experts, k, dtype=torch.bfloat16, bias=False,
          transposed=False):
    """(x, topk_ids, topk_weights, w13, w2, b13, b2, grad): random data; the
    weights stored [E, H, 2I] and [E, I, H] and given transposed where asked."""
    ids, weights = routing(tokens, experts, k)
    x = randn(tokens, hidden, dtype=dtype)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, scale=hidden ** -0.5)
    w2 = randn(experts, hidden, inter, dtype=dtype, scale=inter ** -0.5)
    if transposed:
        w13, w2 = w13.mT.contiguous().mT, w2.mT.contiguous().mT
    b13 = randn(experts, 2 * inter, dtype=dtype, scale=0.1) if bias else None
    b2 = randn(experts, hidden, dtype=dtype, scale=0.1) if bias else None
    return x, ids, weights, w13, w2, b13, b2, randn(tokens, hidden, dtype=dtype)


def run(x, ids, weights, w13, w2, b13, b2, grad, recipe, wanted=None, **options) -> dict:
    """{"out": ..., name: gradient} of moe_experts(fp8=recipe), every
    floating input a leaf, those named in `wanted` (None: all) requiring grad."""
    leaves = {"x": x, "topk_weights": weights, "w13": w13, "w2": w2, "b13": b13, "b2": b2}
    leaves = {n: t.detach().requires_grad_(wanted is None or n in wanted)
              for n, t in leaves.items() if t is not None}
    out = gg_runtime.moe_experts(leaves["x"], ids, leaves["topk_weights"], leaves["w13"],
                                 leaves["w2"], b13=leaves.get("b13"), b2=leaves.get("b2"),
                                 fp8=recipe, **options)
    needs = {n: t for n, t in leaves.items() if t.requires_grad}
    got = dict(zip(needs, torch.autograd.grad(out, list(needs.values()), grad)))
    return {"out": out, **got}


def check(inputs, recipe, **options):
    x, ids, weights, w13, w2, b13, b2, grad = inputs
    got = run(*inputs, recipe, **options)
    want = moe_experts_fp8_training_ref(x, ids, weights, w13, w2, grad, recipe, b13, b2,
                                        **options)
    originals = {"out": x, "x": x, "topk_weights": weights, "w13": w13, "w2": w2, "b13": b13,
                 "b2": b2}
    for name, value in got.items():
        original = originals[name]
        assert value.dtype == original.dtype and value.shape == original.shape, name
        assert value.stride() == original.stride() or name in ("out", "x"), name
        assert torch.isfinite(value).all(), f"{name}: not finite"
        if want[name].abs().max() == 0:
            assert value.eq(0).all(), f"{name}: not zero"
        else:
            error = rel_error(value, want[name])
            assert error <= TOLERANCE, f"{name}: relative error {error:.2e}"
    return got


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES)
def test_output_and_gradients(recipe, shape):
    check(layer(*shape), recipe)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("biases", ["both", "b2", "none"])
def test_layouts_activations_biases(recipe, gate_up, activation, biases):
    """Biases and weights stored transposed: every gradient, the weights' in
    their strides.  Without b13 (whose gradient needs d(gu) in 16 bits) the
    blockwise backward quantizes d(gu) and h in SwiGLU's backward."""
    inputs = list(layer(*SHAPES["small_groups"], bias=True, transposed=True))
    if biases != "both":
        inputs[5] = None
    if biases == "none":
        inputs[6] = None
    check(inputs, recipe, gate_up=gate_up, activation=activation)


FROZEN = {"experts_frozen": ("x", "topk_weights"), "tokens_frozen": ("w13", "w2", "b13", "b2"),
          "w2_only": ("w2",), "x_only": ("x",)}


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("wanted", FROZEN.values(), ids=FROZEN)
def test_some_inputs_frozen(recipe, wanted):
    """Only some inputs require grad: their gradients as the reference's."""
    x, ids, weights, w13, w2, b13, b2, grad = inputs = layer(*SHAPES["small_groups"], bias=True)
    got = run(*inputs, recipe, wanted)
    want = moe_experts_fp8_training_ref(x, ids, weights, w13, w2, grad, recipe, b13, b2)
    assert set(got) == {"out", *wanted}
    for name, value in got.items():
        assert rel_error(value, want[name]) <= TOLERANCE, name


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("bias", [True, False])
def test_float32_master_weights(recipe, bias):
    """float32 weights (and biases) with bfloat16 tokens: the output and
    every gradient as the reference's, in their inputs' dtypes, the weights'
    the float32 products (not rounded to bfloat16).  Without biases the
    blockwise backward quantizes in SwiGLU's backward."""
    inputs = list(layer(*SHAPES["small_groups"], bias=bias))
    for i in range(3, 7):
        if inputs[i] is not None:
            inputs[i] = inputs[i].float().mul_(1 + 2 ** -12)  # values bfloat16 cannot hold
    got = check(inputs, recipe)
    for name in ("w13", "w2"):
        assert not torch.equal(got[name], got[name].to(torch.bfloat16).float()), name


@pytest.mark.parametrize("recipe", RECIPES)
def test_float16_tokens(recipe):
    check(layer(*SHAPES["tile_tails"], dtype=torch.float16), recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_float32_biases_rounded_once(recipe):
    """float32 biases with float16 tokens reach the kernels' bfloat16 in one
    rounding: 1 + 2^-8 + 2^-11 gives what 1 + 2^-7 does, where rounding to
    float16 first would tie to 1 + 2^-8 and then to 1."""
    x, ids, weights, w13, w2, _, _, _ = layer(*SHAPES["small_groups"], dtype=torch.float16)
    w13, w2 = w13.float(), w2.float()

    def forward(value):
        b13 = torch.full(w13.shape[:2], value, device="cuda")
        b2 = torch.full(w2.shape[:2], value, device="cuda")
        return gg_runtime.moe_experts(x, ids, weights, w13, w2, b13=b13, b2=b2, fp8=recipe)

    got = forward(1 + 2 ** -8 + 2 ** -11)
    assert torch.equal(got, forward(1 + 2 ** -7))
    assert not torch.equal(got, forward(1.0))


@pytest.mark.parametrize("recipe", RECIPES)
def test_dropped_and_duplicate_ids(recipe):
    """Ids outside [0, E) add nothing and get zero weight gradients; an
    expert twice in a token's top-k counts twice; every token on one expert."""
    inputs = list(layer(*SHAPES["tile_tails"]))
    ids = inputs[1]
    ids[::3, 0] = -1
    ids[1::3, 1] = 8
    ids[2::3, 2] = ids[2::3, 3]
    ids[:5] = 2
    got = check(inputs, recipe)
    dropped = (ids < 0) | (ids >= 8)
    assert got["topk_weights"][dropped].eq(0).all()


@pytest.mark.parametrize("recipe", RECIPES)
def test_groups_of_0_1_127_rows(recipe):
    """Experts with 0, 1, 127 and 200 rows (a 128-row block along the rows
    cut by a group's end), tokens in a shuffled order."""
    inputs = list(layer(328, 256, 128, 4, 1))
    counts = torch.tensor([0, 1, 127, 200])
    ids = torch.repeat_interleave(torch.arange(4), counts)[torch.randperm(328)]
    inputs[1] = ids.view(-1, 1).cuda()
    inputs[2] = torch.rand(328, 1, device="cuda")
    check(inputs, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_no_tokens(recipe):
    x, ids, weights, w13, w2, _, _, grad = layer(0, 128, 128, 4, 2)
    got = run(x, ids, weights, w13, w2, None, None, grad, recipe)
    assert got["out"].shape == (0, 128)
    assert got["w13"].eq(0).all() and got["w2"].eq(0).all()


@pytest.mark.parametrize("variant", [v for v in _C.variants() if v["arch"] == 90
                                     and v["family"] == "scaled_ragged_glu"
                                     and v["axes"]["gu"] == "kept"],
                         ids=lambda v: v["key"])
def test_every_up_projection_kernel_that_keeps_gu(variant):
    """Each kernel forced on a problem it runs (I as its config's condition
    says): the output and every gradient (gu feeds them all)."""
    axes = variant["axes"]
    recipe = "blockwise" if axes["scaling"] == "blockwise" else "rowwise"
    shape = SHAPES["tile_tails"]
    if not up_projection_runs_on(variant, shape[2]):
        shape = next((256, 272, inter, 4, 2) for inter in (256, 320)
                     if up_projection_runs_on(variant, inter))
    with forced(variant["key"]):
        check(layer(*shape), recipe, gate_up=axes["gate_up"])


def test_no_gradient_wanted_runs_the_forward():
    """With nothing requiring grad, the forward alone: the reference's output."""
    x, ids, weights, w13, w2, _, _, grad = layer(*SHAPES["tile_tails"])
    out = gg_runtime.moe_experts(x, ids, weights, w13, w2, fp8="blockwise")
    want = moe_experts_fp8_training_ref(x, ids, weights, w13, w2, grad, "blockwise")["out"]
    assert rel_error(out, want) <= TOLERANCE


@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_graph_replays_new_routing(recipe):
    """Forward and backward captured once, replayed with new routing and data."""
    inputs = layer(*SHAPES["small_groups"])
    static = [t.clone() for t in inputs if t is not None]
    x, ids, weights, w13, w2, grad = static
    leaves = [t.requires_grad_() for t in (x, weights, w13, w2)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture, as torch asks
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2, fp8=recipe)
        torch.autograd.grad(out, leaves, grad)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gg_runtime.moe_experts(x, ids, weights, w13, w2, fp8=recipe)
        grads = torch.autograd.grad(out, leaves, grad)
    fresh = layer(*SHAPES["small_groups"])
    with torch.no_grad():
        for target, source in zip(static, [t for t in fresh if t is not None]):
            target.copy_(source)
    graph.replay()
    want = moe_experts_fp8_training_ref(*static[:5], static[5], recipe)
    for name, value in zip(("out",) + GRADIENTS[:4], (out, *grads)):
        assert rel_error(value, want[name]) <= TOLERANCE, name


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", ["tile_tails", "large_groups", "e256_k8"])
def test_weights_quantized_once(recipe, shape):
    """quantize_expert_weights' weights, reused by two micro-batches, give
    what the recipe gives, output and every gradient bit for bit (biases,
    weights stored transposed)."""
    first = layer(*SHAPES[shape], bias=True, transposed=True)
    w13, w2, b13, b2 = first[3:7]
    quantized = gg_runtime.quantize_expert_weights(w13, w2, fp8=recipe)
    second = layer(*SHAPES[shape])
    for x, ids, weights, *_, grad in (first, second):
        inputs = (x, ids, weights, w13, w2, b13, b2, grad)
        want = run(*inputs, recipe)
        got = run(*inputs, quantized)
        for name, value in want.items():
            assert torch.equal(got[name], value), name


@pytest.mark.parametrize("recipe", RECIPES)
def test_module_requantizes_after_a_step(recipe):
    """MoEExperts(fp8=recipe) computes what moe_experts(fp8=recipe) does on
    its parameters, bit for bit, before and after an optimizer's step."""
    tokens, hidden, inter, experts, k = SHAPES["small_groups"]
    module = gg_runtime.MoEExperts(experts, hidden, inter, fp8=recipe, device="cuda",
                                   dtype=torch.bfloat16)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    for _ in range(2):
        x, ids, weights, *_, grad = layer(tokens, hidden, inter, experts, k)
        got = module(x, ids, weights)
        got_grads = torch.autograd.grad(got, list(module.parameters()), grad)
        want = gg_runtime.moe_experts(x, ids, weights, module.gate_up_proj, module.down_proj,
                                      fp8=recipe)
        want_grads = torch.autograd.grad(want, list(module.parameters()), grad)
        assert torch.equal(got, want)
        assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))
        for parameter, gradient in zip(module.parameters(), got_grads):
            parameter.grad = gradient
        optimizer.step()


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
@pytest.mark.parametrize("recipe", RECIPES)
def test_torch_compile_fullgraph(recipe, backend):
    """Traced whole (fullgraph) through the autograd function and the
    operators' Meta kernels: the reference's output and gradients."""
    torch._dynamo.reset()
    compiled = torch.compile(gg_runtime.moe_experts, fullgraph=True, backend=backend)
    x, ids, weights, w13, w2, _, _, grad = layer(*SHAPES["tile_tails"])
    leaves = [t.detach().requires_grad_() for t in (x, weights, w13, w2)]
    got = [compiled(leaves[0], ids, *leaves[1:], fp8=recipe)]
    got += torch.autograd.grad(got[0], leaves, grad)
    want = moe_experts_fp8_training_ref(x, ids, weights, w13, w2, grad, recipe)
    for name, value in zip(("out",) + GRADIENTS[:4], got):
        assert rel_error(value, want[name]) <= TOLERANCE, name


@pytest.mark.parametrize("recipe", RECIPES)
def test_gradient_rows_from_1e_30_to_1e10(recipe):
    """Output-gradient rows of magnitudes 1e-30 to 1e10 and zero: each
    token's dx row judged against its own magnitude (its rows are quantized
    on their own along H), a zero row's dx exactly zero; the weights'
    gradients as the reference quantizes them (blocks along the rows mix
    magnitudes)."""
    inputs = list(layer(*SHAPES["small_groups"]))
    grad = inputs[-1]
    magnitudes = torch.tensor([1e-30, 1e-10, 1.0, 1e10, 0.0], device="cuda")
    grad.mul_(magnitudes[torch.arange(grad.shape[0], device="cuda") % 5, None].to(grad.dtype))
    got = check(inputs, recipe)
    want = moe_experts_fp8_training_ref(*inputs[:5], grad, recipe)
    for token in range(grad.shape[0]):
        if grad[token].eq(0).all():
            assert got["x"][token].eq(0).all(), f"token {token}: not zero"
        else:
            assert_token_close(got["x"], want["x"], token)


def scaled_token_rows(recipe, magnitudes):
    """run()'s results and the reference's for token rows scaled by
    `magnitudes` in turn: (got, want, each token's magnitude)."""
    inputs = list(layer(*SHAPES["small_groups"]))
    x = inputs[0]
    magnitudes = torch.tensor(magnitudes, device="cuda")
    of_token = magnitudes[torch.arange(x.shape[0], device="cuda") % len(magnitudes)]
    x.mul_(of_token[:, None].to(x.dtype))
    return run(*inputs, recipe), moe_experts_fp8_training_ref(*inputs[:5], inputs[-1], recipe), \
        of_token.tolist()


def assert_token_close(got, want, token):
    error = rel_error(got[token], want[token])
    assert error <= 2 * TOLERANCE, f"token {token}: relative error {error:.2e}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_token_rows_from_1e_10_to_1e3(recipe):
    """Token rows of magnitudes 1e-10 to 1e3 and zero, each quantized on its
    own: each token's output and dx judged against its own magnitude (a zero
    row's output exactly zero: no bias), the other gradients whole."""
    got, want, magnitudes = scaled_token_rows(recipe, [1e-10, 1e-3, 1.0, 1e3, 0.0])
    for name in ("w13", "w2", "topk_weights"):
        assert rel_error(got[name], want[name]) <= TOLERANCE, name
    for token, magnitude in enumerate(magnitudes):
        if magnitude == 0:
            assert got["out"][token].eq(0).all(), f"token {token}: not zero"
        else:
            assert_token_close(got["out"], want["out"], token)
            assert_token_close(got["x"], want["x"], token)


@pytest.mark.parametrize("recipe", RECIPES)
def test_token_rows_of_1e10(recipe):
    """Tokens of magnitude 1e10 among ones: each output as the reference's,
    every gradient finite.  Their gradients are not compared: the up
    projection's accumulation error (about 1e-4 of a row's magnitude) is
    some 1e6 there, far wider than SiLU's bend (|gate| < 10), so a gate that
    small may take the other sign than the reference's, and its gradient
    the other side of a step (0 or 1 times up)."""
    got, want, _ = scaled_token_rows(recipe, [1.0, 1e10])
    for token in range(want["out"].shape[0]):
        assert_token_close(got["out"], want["out"], token)
    for name, value in got.items():
        assert torch.isfinite(value).all(), name


@pytest.mark.parametrize("recipe", RECIPES)
def test_experts_of_far_apart_magnitudes(recipe):
    """Each expert's weights scaled by its own factor, 1e-6 to 1e3 and zero
    (a weight block of zeros): the output and every gradient as the
    reference's (larger gates than 1e3 x normal: test_token_rows_of_1e10)."""
    inputs = list(layer(*SHAPES["small_groups"]))
    factors = torch.tensor([1.0, 1e-6, 1e3, 0.0, 1e-3, 1e2, 1.0, 1e-6], device="cuda")
    for w in inputs[3:5]:
        w.mul_(factors[:, None, None].to(w.dtype))
    check(inputs, recipe)
