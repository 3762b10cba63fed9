"""moe_experts refuses bad input with a message naming the argument, before
any launch, and gives the output's shape on fake tensors (torch.compile's
tracing).  Runs on CPU."""
import pytest
import torch

import gg_runtime
from gg_runtime._native import call
from moe_reference import route_by_sort

from conftest import cuda, fake_autograd

T, H, INTER, E, K = 10, 16, 8, 4, 2


def args(**changes):
    given = {"x": cuda(T, H), "topk_ids": torch.zeros(T, K, dtype=torch.int64, device="cuda"),
             "topk_weights": cuda(T, K, dtype=torch.float32), "w13": cuda(E, 2 * INTER, H),
             "w2": cuda(E, H, INTER)}
    given.update(changes)
    return given


def test_fake_tensors_give_the_output_shape(fake):
    out = gg_runtime.moe_experts(**args())
    assert out.shape == (T, H) and out.dtype == torch.bfloat16 and out.device.type == "cuda"


# (changes, error, message); changes is made inside the test, under the fake mode.
BAD = [
    (lambda: {"x": None}, TypeError, "x must be a torch.Tensor, got NoneType"),
    (lambda: {"b2": 3}, TypeError, "b2 must be a torch.Tensor or None, got int"),
    (lambda: {"x": cuda(T, H, dtype=torch.float32)}, TypeError, "x must be float16 or bfloat16"),
    (lambda: {"topk_ids": cuda(T, K, dtype=torch.float32)}, TypeError,
     "topk_ids must be int32 or int64"),
    (lambda: {"topk_ids": torch.zeros(T, K, dtype=torch.uint8, device="cuda")}, TypeError,
     "topk_ids must be int32 or int64, got torch.uint8"),
    (lambda: {"topk_weights": torch.zeros(T, K, dtype=torch.int64, device="cuda")}, TypeError,
     "topk_weights must be a floating-point tensor"),
    (lambda: {"w2": cuda(E, H, INTER, dtype=torch.float16)}, TypeError, "w2 must have x's dtype"),
    (lambda: {"topk_ids": torch.zeros(T + 1, K, dtype=torch.int64, device="cuda")}, ValueError,
     r"x must be \[T, H\] and topk_ids \[T, k\]"),
    (lambda: {"topk_weights": cuda(T, K + 1)}, ValueError,
     "topk_weights must have topk_ids' shape"),
    (lambda: {"topk_ids": torch.zeros(T, 0, dtype=torch.int64, device="cuda"),
              "topk_weights": cuda(T, 0)}, ValueError, "with k >= 1"),
    (lambda: {"w13": cuda(E, 2 * INTER + 1, H)}, ValueError,
     r"w13 must be \[E, 2I, H\] with H = 16"),
    (lambda: {"w2": cuda(E, H, INTER + 1)}, ValueError, r"w2 must have shape \(4, 16, 8\)"),
    (lambda: {"b13": cuda(E, INTER)}, ValueError, r"b13 must have shape \(4, 16\)"),
]


@pytest.mark.parametrize("changes,error,message", BAD, ids=[m[:30] for _, _, m in BAD])
def test_bad_arguments(fake, changes, error, message):
    with pytest.raises(error, match=message):
        gg_runtime.moe_experts(**args(**changes()))


def test_gate_up_and_activation_names(fake):
    with pytest.raises(ValueError, match="gate_up must be one of"):
        gg_runtime.moe_experts(**args(), gate_up="split")
    with pytest.raises(ValueError, match="gate_up must be one of"):
        gg_runtime.MoEExperts(E, H, INTER, gate_up="split")
    with pytest.raises(ValueError, match="activation must be one of"):
        gg_runtime.moe_experts(**args(), activation="gelu")
    with pytest.raises(ValueError, match="activation must be one of"):
        gg_runtime.MoEExperts(E, H, INTER, activation="gelu")
    out = gg_runtime.moe_experts(**args(), gate_up="interleaved", activation="gpt_oss")
    assert out.shape == (T, H)


def test_operator_weight_formats(fake):
    """The operator's weight_format names are formats.OPERATOR_WEIGHT_FORMATS,
    parsed in C++ (each known one reaches its own checks; 16-bit weights
    refuse scales), and the refusal of another lists them."""
    from gg_runtime.formats import OPERATOR_WEIGHT_FORMATS
    op = torch.ops.gg_runtime.moe_experts.default
    given = args()
    tensors = [given[n] for n in ("x", "topk_ids", "topk_weights", "w13", "w2")]
    listed = ", ".join(f"'{name}'" for name in OPERATOR_WEIGHT_FORMATS[:-1])
    with pytest.raises(ValueError, match=f"weight_format must be {listed} or "
                                         f"'{OPERATOR_WEIGHT_FORMATS[-1]}', got 'fp4'"):
        call(op, *tensors, None, None, "concatenated", "swiglu", "fp4")
    for name in OPERATOR_WEIGHT_FORMATS[1:]:  # 16-bit weights: refused as each format's
        with pytest.raises((TypeError, ValueError), match="w13|w2|scale") as refused:
            call(op, *tensors, None, None, "concatenated", "swiglu", name)
        assert "weight_format must be" not in str(refused.value)
    scale = cuda(E, 2 * INTER, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"w13\.scales must be None with unquantized weights"):
        call(op, *tensors, None, None, "concatenated", "swiglu", "unquantized", scale)
    assert call(op, *tensors, None, None, "concatenated", "swiglu", "unquantized").shape == (T, H)


def test_tensors_on_other_devices_are_refused():
    """Meta tensors (no fake mode: the fake mode refuses mixed devices itself)."""
    given = {"x": torch.empty(T, H, dtype=torch.bfloat16, device="meta"),
             "topk_ids": torch.empty(T, K, dtype=torch.int64, device="meta"),
             "topk_weights": torch.empty(T, K, device="meta"),
             "w13": torch.empty(E, 2 * INTER, H, dtype=torch.bfloat16, device="meta"),
             "w2": torch.zeros(E, H, INTER, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="w2 is on cpu but x is on meta"):
        gg_runtime.moe_experts(**given)


def test_cpu_tensors_are_refused():
    given = {"x": torch.zeros(T, H, dtype=torch.bfloat16),
             "topk_ids": torch.zeros(T, K, dtype=torch.int64), "topk_weights": torch.zeros(T, K),
             "w13": torch.zeros(E, 2 * INTER, H, dtype=torch.bfloat16),
             "w2": torch.zeros(E, H, INTER, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match="x must be on a CUDA device, got cpu"):
        gg_runtime.moe_experts(**given)


def test_swiglu_operators_check_their_inputs(fake):
    ops = torch.ops.gg_runtime
    with pytest.raises(ValueError, match=r"gu must be \[R, 2C\]"):
        call(ops.swiglu.default, cuda(4, 7))
    with pytest.raises(ValueError, match="activation must be 'swiglu' or 'gpt_oss', got 'relu'"):
        call(ops.swiglu.default, cuda(4, 6), "concatenated", "relu")
    with pytest.raises(ValueError, match="gate_up must be 'concatenated' or 'interleaved', "
                                         "got 'split'"):
        call(ops.swiglu.default, cuda(4, 6), "split")
    with pytest.raises(ValueError, match="activation must be 'swiglu' or 'gpt_oss'"):
        call(ops.swiglu_backward.default, cuda(4, 6), cuda(4, 3), cuda(4, dtype=torch.float32),
             "concatenated", "relu")
    with pytest.raises(ValueError, match=r"grad must have shape \(4, 3\)"):
        call(ops.swiglu_backward.default, cuda(4, 6), cuda(4, 6), cuda(4, dtype=torch.float32))
    with pytest.raises(TypeError, match="scale must be float32"):
        call(ops.swiglu_backward.default, cuda(4, 6), cuda(4, 3), cuda(4))
    h = torch.ops.gg_runtime.swiglu(cuda(4, 6), "interleaved")
    dgu, hs, dot = torch.ops.gg_runtime.swiglu_backward(cuda(4, 6), cuda(4, 3),
                                                        cuda(4, dtype=torch.float32))
    assert [tuple(t.shape) for t in (h, dgu, hs, dot)] == [(4, 3), (4, 6), (4, 3), (4,)]


@pytest.mark.parametrize("make, error, message", [
    (lambda: (cuda(300, 512, dtype=torch.float16), cuda(300, 256, dtype=torch.float16)),
     TypeError, "gu must be bfloat16, got torch.float16"),
    (lambda: (cuda(300, 511), cuda(300, 256)), ValueError, r"gu must be \[R, 2C\]"),
    (lambda: (cuda(300, 512), cuda(300, 128)), ValueError, r"grad must have shape \(300, 256\)"),
    (lambda: (cuda(300, 416), cuda(300, 208)), ValueError,
     "gate_up='concatenated' needs gu's halves to have a multiple of 128 columns"),
    (lambda: (cuda(300, 408), cuda(300, 204), "interleaved"), ValueError,
     "gu's halves must have a multiple of 16 columns, got 204"),
    (lambda: (cuda(300, 512), cuda(300, 256), "concatenated", "relu"), ValueError,
     "activation must be 'swiglu' or 'gpt_oss', got 'relu'"),
])
def test_swiglu_backward_fp8_refuses(fake, make, error, message):
    gu, grad, *choices = make()
    with pytest.raises(error, match=message):
        call(torch.ops.gg_runtime.swiglu_backward_fp8.default, gu, grad,
             cuda(gu.shape[0], dtype=torch.float32), cuda(4, dtype=torch.int32), *choices)


@pytest.mark.parametrize("sums", [False, True])
@pytest.mark.parametrize("gate_up, cols", [("concatenated", 256), ("interleaved", 208)])
def test_swiglu_backward_fp8_shapes(fake, gate_up, cols, sums):
    """d(gu) along rows and columns, h along columns (7 groups: 300 // 128 +
    7 blocks of 128 columns), the dot's partial sums per 128 columns, d(gu)'s
    sums per block of the column layout where asked for (else none)."""
    outs = call(torch.ops.gg_runtime.swiglu_backward_fp8.default, cuda(300, 2 * cols),
                cuda(300, cols), cuda(300, dtype=torch.float32), cuda(7, dtype=torch.int32),
                gate_up, "swiglu", sums)
    blocks = 300 // 128 + 7
    assert [tuple(t.shape) for t in outs] == [
        (300, 2 * cols), (300, (2 * cols + 127) // 128), (2 * cols, 128 * blocks),
        (blocks, 2 * cols), (cols, 128 * blocks), (blocks, cols), ((cols + 127) // 128, 300),
        (blocks if sums else 0, 2 * cols)]
    assert [t.dtype for t in outs] == [torch.float8_e4m3fn, torch.float32] * 3 + [torch.float32] * 2


def test_gathered_products_check_their_inputs(fake):
    """The backward's products over gathered rows (gathered_mm, gathered_mm_k)."""
    mm, mm_k = torch.ops.gg_runtime.gathered_mm.default, torch.ops.gg_runtime.gathered_mm_k.default
    offs = cuda(E, dtype=torch.int32)
    rows = torch.zeros(T * K, dtype=torch.int64, device="cuda")
    with pytest.raises(TypeError, match="rows must be int64"):
        call(mm, cuda(T, H), rows.int(), K, cuda(E, H, INTER), offs)
    with pytest.raises(ValueError, match=r"k must be in \[1, 2\*\*31\), got 0"):
        call(mm, cuda(T, H), rows, 0, cuda(E, H, INTER), offs)
    with pytest.raises(ValueError, match=r"b must be \[G, K, N\] with K = 16"):
        call(mm, cuda(T, H), rows, K, cuda(E, H + 1, INTER), offs)
    with pytest.raises(TypeError, match="b has dtype torch.float16 but x has"):
        call(mm, cuda(T, H), rows, K, cuda(E, H, INTER, dtype=torch.float16), offs)
    with pytest.raises(ValueError, match="offs has 5 entries but b has 4"):
        call(mm, cuda(T, H), rows, K, cuda(E, H, INTER), cuda(E + 1, dtype=torch.int32))
    for b in (cuda(E, H, INTER), cuda(E, INTER, H).mT):
        assert mm(cuda(T, H), rows, K, b, offs).shape == (T * K, INTER)
    with pytest.raises(ValueError, match=r"b must have a row for each of rows' 20 entries"):
        call(mm_k, cuda(T, H), cuda(T * K + 1, INTER), offs, rows, K, True)
    with pytest.raises(ValueError, match=r"a must have a row for each of rows' 20 entries"):
        call(mm_k, cuda(T, H), cuda(T, INTER), offs, rows, K, False)
    with pytest.raises(TypeError, match="offs must be int32"):
        call(mm_k, cuda(T, H), cuda(T * K, INTER), offs.long(), rows, K, True)
    with pytest.raises(TypeError, match="a must be float16 or bfloat16"):
        call(mm_k, cuda(T, H, dtype=torch.float32), cuda(T * K, INTER), offs, rows, K, True)
    assert mm_k(cuda(T, H), cuda(T * K, INTER), offs, rows, K, True).shape == (E, H, INTER)
    assert mm_k(cuda(T * K, H), cuda(T, INTER), offs, rows, K, False).shape == (E, H, INTER)


def test_grouped_mm_glu_checks_its_inputs(fake):
    op = torch.ops.gg_runtime.grouped_mm_glu.default
    offs = cuda(E, dtype=torch.int32)
    rows = torch.zeros(T * K, dtype=torch.int64, device="cuda")
    with pytest.raises(TypeError, match="rows must be int64"):
        call(op, cuda(T, H), rows.int(), K, cuda(E, 2 * INTER, H), offs)
    with pytest.raises(ValueError, match=r"k must be in \[1, 2\*\*31\), got 0"):
        call(op, cuda(T, H), rows, 0, cuda(E, 2 * INTER, H), offs)
    with pytest.raises(ValueError, match=r"w13 must be \[G, 2I, H\] with H = 16"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H + 1), offs)
    with pytest.raises(ValueError, match=r"w13 must be \[G, 2I, H\]"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER + 1, H), offs)
    with pytest.raises(TypeError, match="w13 has dtype torch.float16 but x has"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H, dtype=torch.float16), offs)
    with pytest.raises(ValueError, match="offs has 5 entries but w13 has 4"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H), cuda(E + 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"bias must have shape \(4, 16\)"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H), offs, cuda(E, INTER))
    with pytest.raises(ValueError, match="activation must be 'swiglu' or 'gpt_oss'"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H), offs, None, "concatenated", "relu")
    with pytest.raises(ValueError, match="gate_up must be 'concatenated' or 'interleaved'"):
        call(op, cuda(T, H), rows, K, cuda(E, 2 * INTER, H), offs, None, "split")
    for w13 in (cuda(E, 2 * INTER, H), cuda(E, H, 2 * INTER).mT):
        for gate_up in ("concatenated", "interleaved"):
            h, gu = op(cuda(T, H), rows, K, w13, offs, None, gate_up, "swiglu", True)
            assert (h.shape, gu.shape) == ((T * K, INTER), (T * K, 2 * INTER))
            h, gu = op(cuda(T, H), rows, K, w13, offs, None, gate_up, "swiglu", False)
            assert (h.shape, gu.shape) == ((T * K, INTER), (0, 2 * INTER))
            h, gu = op(cuda(T, H), None, 1, w13, offs, None, gate_up, "swiglu", True)
            assert (h.shape, gu.shape) == ((T, INTER), (T, 2 * INTER))


def test_combine_operator_checks_its_inputs(fake):
    ops = torch.ops.gg_runtime
    index = torch.zeros(4, 2, dtype=torch.int64, device="cuda")
    weights, offs = cuda(4, 2, dtype=torch.float32), cuda(3, dtype=torch.int32)
    with pytest.raises(TypeError, match="rows must be float16 or bfloat16"):
        call(ops.combine.default, cuda(8, 6, dtype=torch.float32), index, weights, offs)
    with pytest.raises(TypeError, match="index must be int64"):
        call(ops.combine.default, cuda(8, 6), index.int(), weights, offs)
    with pytest.raises(TypeError, match="weights must be float32"):
        call(ops.combine.default, cuda(8, 6), index, cuda(4, 2), offs)
    with pytest.raises(ValueError, match=r"weights must have shape \(4, 2\)"):
        call(ops.combine.default, cuda(8, 6), index, cuda(4, 3, dtype=torch.float32), offs)
    with pytest.raises(TypeError, match="offs must be int32"):
        call(ops.combine.default, cuda(8, 6), index, weights, offs.long())
    out = ops.combine(cuda(8, 6), index, weights, offs)
    assert out.shape == (4, 6) and out.dtype == torch.bfloat16


def test_route_operator_checks_its_inputs(fake):
    ops = torch.ops.gg_runtime
    ids = torch.zeros(37, dtype=torch.int64, device="cuda")
    with pytest.raises(TypeError, match="ids must be int64"):
        call(ops.route.default, ids.int(), 4)
    with pytest.raises(ValueError, match="ids must be 1-D"):
        call(ops.route.default, ids.view(1, 37), 4)
    with pytest.raises(ValueError, match="experts must be >= 0, got -1"):
        call(ops.route.default, ids, -1)
    for experts in (5, 3000):  # the route kernels, torch's sort past their bins
        order, offs, inverse = ops.route(ids, experts)
        assert [(tuple(t.shape), t.dtype) for t in (order, offs, inverse)] == [
            ((37,), torch.int64), ((experts,), torch.int32), ((37,), torch.int64)]


class NotSwiGLU(torch.nn.Module):
    """Stands for an experts module whose gating is its own (DeepSeek-V4's clamped SiLU, say)."""
    has_gate = True

    def _apply_gate(self, gate_up):
        return gate_up


class GptOssExperts(NotSwiGLU):
    """Stands for transformers' gpt-oss experts (its name, constants and layout flags)."""
    is_transposed, is_concatenated, has_bias = True, False, True

    def __init__(self, alpha=1.702, limit=7.0):
        super().__init__()
        self.alpha, self.limit = alpha, limit
        self.gate_up_proj = torch.nn.Parameter(cuda(E, H, 2 * INTER))
        self.down_proj = torch.nn.Parameter(cuda(E, INTER, H))
        self.gate_up_proj_bias = torch.nn.Parameter(cuda(E, 2 * INTER))
        self.down_proj_bias = torch.nn.Parameter(cuda(E, H))


def test_transformers_experts_forward_refuses_other_gating(fake):
    with pytest.raises(ValueError, match="NotSwiGLU: moe_experts runs SwiGLU experts"):
        gg_runtime.transformers_experts_forward(NotSwiGLU(), *args_for_module())
    ungated = torch.nn.Module()
    ungated.has_gate = False
    with pytest.raises(ValueError, match="SwiGLU experts"):
        gg_runtime.transformers_experts_forward(ungated, *args_for_module())
    with pytest.raises(ValueError, match=r"GptOssExperts: .* \(alpha, limit\) = \(1.702, 5.0\)"):
        gg_runtime.transformers_experts_forward(GptOssExperts(limit=5.0), *args_for_module())


@pytest.mark.parametrize("module", [None, torch.nn.Linear(2, 2)], ids=["None", "Linear"])
def test_transformers_experts_forward_refuses_other_modules(fake, module):
    with pytest.raises(TypeError, match="module must be a transformers experts module"):
        gg_runtime.transformers_experts_forward(module, *args_for_module())


@fake_autograd
def test_transformers_experts_forward_runs_gpt_oss_with_its_activation(fake, monkeypatch):
    seen = {}

    def record(*given, **options):
        seen.update(options, w13=given[3], w2=given[4])
        return given[0]

    monkeypatch.setattr(gg_runtime.moe.transformers_glue, "moe_experts", record)
    module = GptOssExperts()
    gg_runtime.transformers_experts_forward(module, *args_for_module())
    assert seen["activation"] == "gpt_oss" and seen["gate_up"] == "interleaved"
    assert seen["w13"].shape == (E, 2 * INTER, H) and seen["w2"].shape == (E, H, INTER)
    assert seen["b13"] is module.gate_up_proj_bias and seen["b2"] is module.down_proj_bias


def args_for_module():
    given = args()
    return given["x"], given["topk_ids"], given["topk_weights"]


def test_route_sorts_slots_by_expert_with_dropped_ones_last():
    """The routing by torch's sort (the route operator's reference), on CPU tensors."""
    for dtype in (torch.int64, torch.int32):
        ids = torch.tensor([[2, 0], [-1, 2], [0, 7], [1, 2], [-300, 3], [4, 2**31 - 1]],
                           dtype=dtype)
        order, offs, inverse = route_by_sort(ids, 4)
        assert order.tolist() == [1, 4, 6, 0, 3, 7, 9, 2, 5, 8, 10, 11]  # stable; dropped last
        assert offs.tolist() == [2, 3, 6, 7] and offs.dtype == torch.int32
        assert torch.equal(order[inverse], torch.arange(12))


@fake_autograd
def test_module_parameters_and_shapes(fake):
    experts = gg_runtime.MoEExperts(E, H, INTER, gate_up="interleaved", bias=True,
                                    device="cuda", dtype=torch.bfloat16)
    shapes = {name: tuple(p.shape) for name, p in experts.named_parameters()}
    assert shapes == {"gate_up_proj": (E, 2 * INTER, H), "down_proj": (E, H, INTER),
                      "gate_up_proj_bias": (E, 2 * INTER), "down_proj_bias": (E, H)}
    given = args()
    assert experts(given["x"], given["topk_ids"], given["topk_weights"]).shape == (T, H)


@pytest.mark.parametrize("gate_up", ["concatenated", "interleaved"])
def test_backward_gives_every_gradient_in_its_inputs_layout(gate_up):
    """Backward on meta tensors (the operators' Meta kernels; the autograd
    engine runs there without a GPU): every gradient has its input's shape,
    dtype and strides, weights given as transposed views and routing weights
    in float32 included."""
    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    leaves = {"x": meta(T, H), "topk_weights": meta(T, K, dtype=torch.float32),
              "w13": meta(E, H, 2 * INTER).mT, "w2": meta(E, H, INTER),
              "b13": meta(E, 2 * INTER), "b2": meta(E, H)}
    for leaf in leaves.values():
        leaf.requires_grad_()
    out = gg_runtime.moe_experts(leaves["x"], meta(T, K, dtype=torch.int64),
                                 leaves["topk_weights"], leaves["w13"], leaves["w2"],
                                 gate_up=gate_up, b13=leaves["b13"], b2=leaves["b2"])
    grads = torch.autograd.grad(out, list(leaves.values()), torch.ones_like(out))
    for (name, leaf), grad in zip(leaves.items(), grads):
        assert (grad.shape, grad.dtype, grad.stride()) == \
            (leaf.shape, leaf.dtype, leaf.stride()), name
