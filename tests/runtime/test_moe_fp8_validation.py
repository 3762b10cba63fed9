"""moe_experts with fp8 weights, and fused_experts, refuse bad input with a
message naming the argument before anything launches, and give the output's
shape and dtype on meta tensors (the operator's Meta kernel runs every check
without launching).  Runs on CPU."""
import pytest
import torch

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.formats import SCALINGS
from gg_runtime._native import call

FP8 = torch.float8_e4m3fn
# H and I multiples of 16, not of 128: the block scales' ceil shows.
T, H, INTER, E, K = 10, 272, 208, 4, 2
# The fp8 weights' formats, and their scales' shapes in each.
BLOCKS, CHANNELS = "128x128", "rowwise"
SCALE_SHAPES = {BLOCKS: {"w13": (E, 4, 3), "w2": (E, 3, 2)},  # ceil(2I/128), ceil(H/128); ...
                CHANNELS: {"w13": (E, 2 * INTER), "w2": (E, H)}}
VALUE_SHAPES = {"w13": (E, 2 * INTER, H), "w2": (E, H, INTER)}
# The tokens' layout each format asks, given quantized.
TOKEN_FORMATS = {BLOCKS: "1x128", CHANNELS: "rowwise"}


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def weight(name, kind=BLOCKS, values=None, scales=None):
    """w13 or w2 (`name`) in fp8, a Quantized in format `kind`: meta values
    and float32 scales of their shapes, or `values` and `scales` given."""
    if values is None:
        values = meta(*VALUE_SHAPES[name], dtype=FP8)
    if scales is None:
        scales = meta(*SCALE_SHAPES[kind][name], dtype=torch.float32)
    return Quantized(values, scales, kind)


def weights(kind, **scale_shapes):
    """{"w13": ..., "w2": ...} in format `kind`, some scales of other shapes."""
    return {name: weight(name, kind, scales=meta(*scale_shapes[name], dtype=torch.float32)
                         if name in scale_shapes else None) for name in VALUE_SHAPES}


def tokens_quantized(tokens, scale_shape, kind=BLOCKS, dtype=FP8, scale_dtype=torch.float32):
    """x given quantized in the layout `kind`'s weights ask."""
    return Quantized(meta(tokens, H, dtype=dtype), meta(*scale_shape, dtype=scale_dtype),
                     TOKEN_FORMATS[kind])


def args(kind=BLOCKS, **changes):
    """moe_experts' keyword arguments with fp8 weights, `changes` replacing some."""
    given = {"x": meta(T, H), "topk_ids": meta(T, K, dtype=torch.int64),
             "topk_weights": meta(T, K, dtype=torch.float32), **weights(kind)}
    given.update(changes)
    return given


def padded(*shape, columns):
    """An fp8 [..., R, C] tensor whose rows lie `columns` apart (C < columns)."""
    return meta(*shape[:-1], columns, dtype=FP8)[..., :shape[-1]]


@pytest.mark.parametrize("kind", [BLOCKS, CHANNELS])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [T, 0])
def test_output_shape_and_dtype(kind, dtype, tokens):
    out = gg_runtime.moe_experts(**args(kind, x=meta(tokens, H, dtype=dtype),
                                        topk_ids=meta(tokens, K, dtype=torch.int64),
                                        topk_weights=meta(tokens, K, dtype=dtype)))
    assert out.shape == (tokens, H) and out.dtype == dtype and out.device.type == "meta"


def test_accepted_variants():
    """Channel scales as [E, N, 1]; biases, in x's dtype or float32; int32
    ids; both layouts and activations; weights in padded storage (rows
    16-byte multiples apart)."""
    channel_columns = weights(CHANNELS, w13=(E, 2 * INTER, 1), w2=(E, H, 1))
    out = gg_runtime.moe_experts(**args(CHANNELS, **channel_columns, b13=meta(E, 2 * INTER),
                                        b2=meta(E, H), topk_ids=meta(T, K, dtype=torch.int32)),
                                 gate_up="interleaved", activation="gpt_oss")
    assert out.shape == (T, H)
    out = gg_runtime.moe_experts(**args(b13=meta(E, 2 * INTER, dtype=torch.float32),
                                        b2=meta(E, H, dtype=torch.float32)))
    assert out.shape == (T, H)
    out = gg_runtime.moe_experts(**args(
        w13=weight("w13", values=padded(E, 2 * INTER, H, columns=H + 32)),
        w2=weight("w2", values=padded(E, H, INTER, columns=INTER + 16))))
    assert out.shape == (T, H)


def ceil_message(name, want):
    return rf"{name} must be \[E, ceil\(N/128\), ceil\(K/128\)\] = {want}"


# (changes, error, message); changes are made in the test.
BAD = {
    "w13.scales floor": (lambda: weights(BLOCKS, w13=(E, 3, 2)), ValueError,
                         ceil_message(r"w13\.scales", r"\(4, 4, 3\)")),
    "w2.scales floor": (lambda: weights(BLOCKS, w2=(E, 2, 1)), ValueError,
                        ceil_message(r"w2\.scales", r"\(4, 3, 2\)")),
    "w2.scales experts": (lambda: weights(BLOCKS, w2=(E + 1, 3, 2)), ValueError,
                          r"w2\.scales must be \[E, ceil\(N/128\), ceil\(K/128\)\] = "
                          r"\(4, 3, 2\) .* 128 x 128 blocks .* got \(5, 3, 2\)"),
    "w2.scales experts, channels": (lambda: weights(CHANNELS, w2=(E + 1, H)), ValueError,
                                    r"w2\.scales must be \[E, N\] = \(4, 272\) .* per "
                                    r"output channel .* got \(5, 272\)"),
    "w13.scales per half": (lambda: weights(BLOCKS, w13=(E, INTER)), ValueError,
                            r"w13\.scales must be .* got \(4, 208\)"),
    "channel scale [E, N, 2]": (lambda: weights(CHANNELS, w13=(E, 2 * INTER, 2)), ValueError,
                                r"w13\.scales must be .* got \(4, 416, 2\)"),
    # Scales of the other format than the weights say: refused, not taken for it.
    "mixed kinds": (lambda: weights(BLOCKS, w2=SCALE_SHAPES[CHANNELS]["w2"]), ValueError,
                    r"w2\.scales must be \[E, ceil\(N/128\), ceil\(K/128\)\] = \(4, 3, 2\) .* "
                    r"\(w13\.scales and w2\.scales must both be 128 x 128 blocks or both per "
                    r"channel\), got \(4, 272\)"),
    "mixed kinds reversed": (lambda: weights(CHANNELS, w2=SCALE_SHAPES[BLOCKS]["w2"]),
                             ValueError, "must both be 128 x 128 blocks or both per channel"),
    "mixed formats": (lambda: {"w2": weight("w2", CHANNELS)}, ValueError,
                      "w13 and w2 must be in one format, got '128x128' and 'rowwise'"),
    "mixed formats reversed": (lambda: {**weights(CHANNELS), "w2": weight("w2", BLOCKS)},
                               ValueError, "w13 and w2 must be in one format, got 'rowwise' "
                                           "and '128x128'"),
    "unknown format": (lambda: {"w13": weight("w13")._replace(format="blockwise"),
                                "w2": weight("w2")._replace(format="blockwise")}, ValueError,
                       r"w13\.format must be one of \('128x128', 'rowwise', 'mxfp4', "
                       r"'int4'\) for the weights, got 'blockwise'"),
    "w13.scales float64": (lambda: {"w13": weight("w13", scales=meta(E, 4, 3,
                                                                    dtype=torch.float64))},
                           TypeError, r"w13\.scales must be float32, got torch.float64"),
    "w2.scales bfloat16": (lambda: {"w2": weight("w2", scales=meta(E, 3, 2))}, TypeError,
                           r"w2\.scales must be float32, got torch.bfloat16"),
    "w13 quantized alone": (lambda: {"w2": meta(E, H, INTER, dtype=FP8)}, TypeError,
                            r"w2 must be a gg_runtime\.Quantized \(values, scales, format\) "
                            r".* got Tensor"),
    "w2 quantized alone": (lambda: {"w13": meta(E, 2 * INTER, H, dtype=FP8)}, TypeError,
                           r"w13 must be a gg_runtime\.Quantized"),
    "w2.scales None": (lambda: {"w2": weight("w2")._replace(scales=None)}, TypeError,
                       r"w2\.scales must be a torch\.Tensor, got NoneType"),
    "w13.scales a list": (lambda: {"w13": weight("w13", scales=[1.0])}, TypeError,
                          r"w13\.scales must be a torch\.Tensor.* got list"),
    "fp8 weights, no scales": (lambda: {"w13": meta(E, 2 * INTER, H, dtype=FP8),
                                        "w2": meta(E, H, INTER, dtype=FP8)}, TypeError,
                               "w13 and w2 are torch.float8_e4m3fn and torch.float8_e4m3fn: "
                               "quantized weights are given as gg_runtime.Quantized values"),
    "bf16 w13 with scales": (lambda: {"w13": weight("w13", values=meta(E, 2 * INTER, H))},
                             TypeError, "w13 must be float8_e4m3fn with its scales given, got "
                                        "torch.bfloat16"),
    "bf16 w2 with scales": (lambda: {"w2": weight("w2", values=meta(E, H, INTER))}, TypeError,
                            "w2 must be float8_e4m3fn with its scales given"),
    "w13 transposed": (lambda: {"w13": weight("w13", values=meta(E, H, 2 * INTER,
                                                                 dtype=FP8).mT)}, ValueError,
                       r"w13 must be stored \[E, 2I, H\] with unit stride in its last "
                       r"dimension .* got strides \(113152, 1, 416\)"),
    "w2 transposed": (lambda: {"w2": weight("w2", values=meta(E, INTER, H, dtype=FP8).mT)},
                      ValueError, r"w2 must be stored \[E, H, I\] with unit stride .*K-major"),
    "w13 rows 8 bytes apart": (lambda: {"w13": weight("w13", values=padded(E, 2 * INTER, H,
                                                                           columns=H + 8))},
                               ValueError, r"w13 must be stored .* got strides "
                                           r"\(116480, 280, 1\)"),
    "H not 16n": (lambda: {"x": meta(T, H - 8),
                           "w13": weight("w13", values=padded(E, 2 * INTER, H - 8, columns=H)),
                           "w2": weight("w2", values=meta(E, H - 8, INTER, dtype=FP8))},
                  ValueError, "fp8 weights need H and I to be multiples of 16 .* got H=264, "
                              "I=208"),
    "I not 16n": (lambda: {"w13": weight("w13", values=meta(E, 2 * (INTER - 8), H, dtype=FP8),
                                         scales=meta(E, 4, 3, dtype=torch.float32)),
                           "w2": weight("w2", values=padded(E, H, INTER - 8, columns=INTER))},
                  ValueError, "fp8 weights need H and I to be multiples of 16 .* got H=272, "
                              "I=200"),
    # Contiguous, H = 264 puts w13's rows 264 bytes apart: refused for either reason.
    "H not 16n, contiguous": (lambda: {"x": meta(T, H - 8),
                                       "w13": weight("w13", values=meta(E, 2 * INTER, H - 8,
                                                                        dtype=FP8)),
                                       "w2": weight("w2", values=meta(E, H - 8, INTER,
                                                                      dtype=FP8))},
                              ValueError, "multiples of 16"),
    "x float32": (lambda: {"x": meta(T, H, dtype=torch.float32)}, TypeError,
                  "x must be float16 or bfloat16"),
    "b13 float16": (lambda: {"b13": meta(E, 2 * INTER, dtype=torch.float16)}, TypeError,
                    r"b13 must have the output's dtype \(torch.bfloat16\) or be float32"),
    "x fp8 not quantized": (lambda: {"x": meta(T, H, dtype=FP8)}, TypeError,
                            r"x is float8_e4m3fn: give its scales as x\.scales"),
    "x quantized, bf16 values": (lambda: {"x": tokens_quantized(T, (T, 3), dtype=torch.bfloat16)},
                                 TypeError, r"x must be float8_e4m3fn when x\.scales is given, "
                                            "got torch.bfloat16"),
    "x.scales bfloat16": (lambda: {"x": tokens_quantized(T, (T, 3),
                                                         scale_dtype=torch.bfloat16)},
                          TypeError, r"x\.scales must be float32, got torch.bfloat16"),
    "x rowwise, weights blocks": (lambda: {"x": tokens_quantized(T, (T,), CHANNELS)},
                                  ValueError, "x is quantized 'rowwise', but weights in format "
                                              "'128x128' ask for '1x128'"),
    "x 1x128, weights channels": (lambda: {**weights(CHANNELS),
                                           "x": tokens_quantized(T, (T, 3), BLOCKS)},
                                  ValueError, "x is quantized '1x128', but weights in format "
                                              "'rowwise' ask for 'rowwise'"),
    "x 128x128": (lambda: {"x": Quantized(meta(T, H, dtype=FP8), meta(1, 3, dtype=torch.float32),
                                          "128x128")},
                  ValueError, "x is quantized '128x128', but weights in format '128x128' ask "
                              "for '1x128'"),
    "x.scales per token, weights blocks": (lambda: {"x": tokens_quantized(T, (T,))},
                                           ValueError, r"x\.scales must be \[T, ceil\(H/128\)\] "
                                                       r"= \(10, 3\) .* got \(10,\)"),
    "x.scales floor": (lambda: {"x": tokens_quantized(T, (T, 2))},
                       ValueError, r"x\.scales must be \[T, ceil\(H/128\)\]"),
    "x.scales a list": (lambda: {"x": tokens_quantized(T, (T, 3))._replace(scales=[1.0])},
                        TypeError, r"x\.scales must be a torch\.Tensor, got list"),
    "x quantized, weights 16-bit": (lambda: {"x": tokens_quantized(T, (T, 3)),
                                             "w13": meta(E, 2 * INTER, H),
                                             "w2": meta(E, H, INTER)}, TypeError,
                                    r"w13 must be a gg_runtime\.Quantized .* got Tensor"),
    "x quantized, weights 4-bit": (lambda: {"x": tokens_quantized(T, (T, 3)),
                                            "w13": Quantized(meta(E, 2 * INTER, H // 2,
                                                                  dtype=torch.uint8),
                                                             meta(E, 2 * INTER, H // 32,
                                                                  dtype=torch.uint8), "mxfp4"),
                                            "w2": Quantized(meta(E, H, INTER // 2,
                                                                 dtype=torch.uint8),
                                                            meta(E, H, INTER // 32,
                                                                 dtype=torch.uint8), "mxfp4")},
                                   ValueError, r"x is quantized '1x128', but weights in format "
                                               r"'mxfp4' ask for none \(16-bit x\)"),
    "b2 shape": (lambda: {"b2": meta(E, INTER)}, ValueError, r"b2 must have shape \(4, 272\)"),
    "topk_ids float": (lambda: {"topk_ids": meta(T, K, dtype=torch.float32)}, TypeError,
                       "topk_ids must be int32 or int64"),
    "w2 shape": (lambda: {"w2": weight("w2", values=meta(E, H, INTER + 16, dtype=FP8))},
                 ValueError, r"w2 must have shape \(4, 272, 208\)"),
}


@pytest.mark.parametrize("kind, x_scale", [(BLOCKS, (T, 3)), (CHANNELS, (T,)),
                                           (CHANNELS, (T, 1)), (BLOCKS, (0, 3))],
                         ids=["blocks", "channels", "channels_column", "no_tokens"])
def test_tokens_given_quantized(kind, x_scale):
    """x given quantized, a Quantized in the layout the weights ask (per
    token per 128 columns, or per token): bfloat16 out; biases in bfloat16
    or float32."""
    tokens = x_scale[0]
    out = gg_runtime.moe_experts(**args(kind, x=tokens_quantized(tokens, x_scale, kind),
                                        topk_ids=meta(tokens, K, dtype=torch.int64),
                                        topk_weights=meta(tokens, K, dtype=torch.float32),
                                        b13=meta(E, 2 * INTER),
                                        b2=meta(E, H, dtype=torch.float32)))
    assert out.shape == (tokens, H) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("name", BAD)
def test_bad_arguments(name):
    changes, error, message = BAD[name]
    with pytest.raises(error, match=message):
        gg_runtime.moe_experts(**args(**changes()))


def tensor_named(given, name):
    """The tensor moe_experts' errors call `name` in its arguments `given`:
    a weight's values (`w13`) or scales (`w13.scales`), or an argument."""
    argument, _, field = name.partition(".")
    value = given[argument]
    return getattr(value, field or "values") if isinstance(value, Quantized) else value


def replaced(given, name, tensor):
    """`given` with the tensor called `name` (as tensor_named's) replaced."""
    argument, _, field = name.partition(".")
    value = given[argument]
    if isinstance(value, Quantized):
        tensor = value._replace(**{field or "values": tensor})
    return {**given, argument: tensor}


@pytest.mark.parametrize("name", ["w13.scales", "w2.scales", "w13", "w2", "topk_ids",
                                  "topk_weights", "b13", "b2"])
def test_tensors_on_other_devices_are_refused(name):
    """A CPU tensor among meta ones."""
    given = args(b13=meta(E, 2 * INTER), b2=meta(E, H))
    tensor = tensor_named(given, name)
    given = replaced(given, name, torch.zeros(tensor.shape, dtype=tensor.dtype))
    with pytest.raises(ValueError, match=f"{name} is on cpu but x is on meta"):
        gg_runtime.moe_experts(**given)


def test_cpu_tensors_are_refused():
    def on_cpu(value):
        if isinstance(value, Quantized):
            return value._replace(values=on_cpu(value.values), scales=on_cpu(value.scales))
        return torch.zeros(value.shape, dtype=value.dtype)

    given = {name: on_cpu(value) for name, value in args().items()}
    with pytest.raises(ValueError, match="x must be on a CUDA device, got cpu"):
        gg_runtime.moe_experts(**given)


GRAD_NAMES = ["x", "topk_weights", "w13", "w2", "b13", "b2", "w13.scales", "w2.scales"]


@pytest.mark.parametrize("name", GRAD_NAMES)
def test_inference_only(name):
    """An input that requires grad is refused with gradients enabled, and
    runs under torch.no_grad() and torch.inference_mode()."""
    given = args(b13=meta(E, 2 * INTER), b2=meta(E, H))
    tensor_named(given, name).requires_grad_()
    with pytest.raises(ValueError, match=f"inference-only, but {name} requires grad"):
        gg_runtime.moe_experts(**given)
    with torch.no_grad():
        assert gg_runtime.moe_experts(**given).shape == (T, H)
    with torch.inference_mode():
        assert gg_runtime.moe_experts(**given).shape == (T, H)


def test_tokens_given_quantized_are_inference_only():
    x = tokens_quantized(T, (T, 3))
    x.scales.requires_grad_()
    given = args(x=x)
    with pytest.raises(ValueError, match=r"inference-only, but x\.scales requires grad"):
        gg_runtime.moe_experts(**given)
    with torch.no_grad():
        assert gg_runtime.moe_experts(**given).shape == (T, H)


def test_gate_up_and_activation_names():
    with pytest.raises(ValueError, match="gate_up must be one of"):
        gg_runtime.moe_experts(**args(), gate_up="split")
    with pytest.raises(ValueError, match="activation must be one of"):
        gg_runtime.moe_experts(**args(), activation="gelu")


def test_operator_checks_its_arguments():
    """torch.ops.gg_runtime.moe_experts itself with fp8 weights, for callers
    that skip moe_experts: the same messages."""
    op = torch.ops.gg_runtime.moe_experts.default
    given = args()
    tensors = [given["x"], given["topk_ids"], given["topk_weights"], given["w13"].values,
               given["w2"].values]
    scales = [given["w13"].scales, given["w2"].scales]

    def run(weight_format, gate_up="concatenated", activation="swiglu", w13_scale=scales[0]):
        return call(op, *tensors, None, None, gate_up, activation, weight_format, w13_scale,
                    scales[1])

    with pytest.raises(ValueError, match="gate_up must be 'concatenated' or 'interleaved'"):
        run("128x128", gate_up="split")
    with pytest.raises(ValueError, match="activation must be 'swiglu' or 'gpt_oss'"):
        run("128x128", activation="gelu")
    with pytest.raises(TypeError, match=r"w13\.scales must be float32"):
        run("128x128", w13_scale=meta(E, 4, 3))
    with pytest.raises(TypeError, match=r"w13\.scales must be a tensor with fp8 weights "
                                        r"\(weight_format '128x128' or 'rowwise'\), got None"):
        run("128x128", w13_scale=None)
    with pytest.raises(ValueError, match="weight_format must be 'unquantized', '128x128', "
                                         "'rowwise', 'mxfp4' or 'int4', got '1x128'"):
        run("1x128")
    # The old names of the formats are no longer the operator's.
    for old in ("blockwise", "channelwise"):
        with pytest.raises(ValueError, match=f"weight_format must be .* got '{old}'"):
            run(old)
    # The format is the caller's: scales of the other one are refused, not taken for it.
    with pytest.raises(ValueError, match=r"w13\.scales must be \[E, N\] = \(4, 416\) for its "
                                         "weight .* per output channel"):
        run("rowwise")
    # fp8 weights named unquantized are refused by dtype, their scales by being given.
    with pytest.raises(TypeError, match="w13 must have x's dtype"):
        run("unquantized")
    assert run("128x128").shape == (T, H)


def fused_args(kind=BLOCKS, **changes):
    """fused_experts' arguments (vLLM's names) with fp8 weights."""
    given = args(kind)
    fused = {"hidden_states": given["x"], "w1": given["w13"].values, "w2": given["w2"].values,
             "topk_weights": given["topk_weights"], "topk_ids": given["topk_ids"],
             "use_fp8_w8a8": True, "w1_scale": given["w13"].scales,
             "w2_scale": given["w2"].scales}
    fused.update(changes)
    return fused


def test_fused_experts_shapes():
    for kind, options in ((BLOCKS, {"block_shape": [128, 128]}), (BLOCKS, {}),
                          (CHANNELS, {"per_channel_quant": True})):
        assert gg_runtime.fused_experts(**fused_args(kind, **options)).shape == (T, H)
    expert_map = meta(3 * E, dtype=torch.int32)
    out = gg_runtime.fused_experts(**fused_args(expert_map=expert_map, global_num_experts=3 * E))
    assert out.shape == (T, H)
    x = meta(T, H)
    assert gg_runtime.fused_experts(**fused_args(hidden_states=x, inplace=True)) is x


FUSED_BAD = {
    "activation": ({"activation": "gelu"}, "activation must be 'silu', got 'gelu'"),
    "router weight on input": ({"apply_router_weight_on_input": True},
                               "apply_router_weight_on_input=True is not supported"),
    "a1_scale": ({"a1_scale": meta(1, dtype=torch.float32)},
                 "a1_scale and a2_scale must be None: activations are quantized dynamically"),
    "a2_scale": ({"a2_scale": meta(1, dtype=torch.float32)}, "a1_scale and a2_scale must be None"),
    "block_shape 128x64": ({"block_shape": [128, 64]},
                           r"block_shape must be \[128, 128\] .* got \[128, 64\]"),
    "block_shape with per_channel_quant": ({"block_shape": [128, 128],
                                            "per_channel_quant": True},
                                           r"block_shape must be \[128, 128\] \(or None with "
                                           "per_channel_quant\\)"),
    "use_fp8_w8a8 False with scales": ({"use_fp8_w8a8": False},
                                       "use_fp8_w8a8=True or use_int4_w4a16=True goes with "
                                       "w1_scale and w2_scale .* got use_fp8_w8a8=False"),
    "use_fp8_w8a8 without scales": ({"w1_scale": None, "w2_scale": None},
                                    "got use_fp8_w8a8=True"),
    # The scales' shape against the format per_channel_quant says: the
    # operator's check, naming w13.scales (w1_scale).
    "blocks, per_channel_quant": ({"per_channel_quant": True},
                                  r"w13\.scales must be \[E, N\] = \(4, 416\) .* per output "
                                  r"channel .* got \(4, 4, 3\)"),
    "expert_map length": ({"expert_map": meta(3 * E, dtype=torch.int32),
                           "global_num_experts": 2 * E},
                          "expert_map must have global_num_experts = 8 entries, got 12"),
    "global_num_experts without expert_map": ({"global_num_experts": 3 * E},
                                              "global_num_experts = 12 needs an expert_map"),
}


@pytest.mark.parametrize("name", FUSED_BAD)
def test_fused_experts_refuses(name):
    changes, message = FUSED_BAD[name]
    with pytest.raises(ValueError, match=message):
        gg_runtime.fused_experts(**fused_args(**changes))


FUSED_WRONG_TYPES = {
    "hidden_states": ({"hidden_states": None},
                      "hidden_states must be a torch.Tensor, got NoneType"),
    "w1_scale": ({"w1_scale": 1.0}, "w1_scale must be a torch.Tensor or None, got float"),
    "expert_map": ({"expert_map": [0, 1, 2, 3]},
                   "expert_map must be a torch.Tensor or None, got list"),
    "expert_map dtype": ({"expert_map": meta(E, dtype=torch.float32)},
                         "expert_map must be int32 or int64, got torch.float32"),
    "topk_ids with expert_map": ({"expert_map": meta(E, dtype=torch.int32),
                                  "topk_ids": meta(T, K, dtype=torch.float32)},
                                 "topk_ids must be int32 or int64, got torch.float32"),
    "inplace": ({"inplace": 1}, "inplace must be a bool, got int"),
    "global_num_experts": ({"global_num_experts": 4.0},
                           "global_num_experts must be an int, got float"),
    "block_shape": ({"block_shape": 128}, "block_shape must be a list or None, got int"),
}


@pytest.mark.parametrize("name", FUSED_WRONG_TYPES)
def test_fused_experts_names_a_wrong_type(name):
    changes, message = FUSED_WRONG_TYPES[name]
    with pytest.raises(TypeError, match=message):
        gg_runtime.fused_experts(**fused_args(**changes))


def test_fused_experts_refuses_an_expert_map_not_1d():
    with pytest.raises(ValueError, match=r"expert_map must be 1-D, got shape \(2, 4\)"):
        gg_runtime.fused_experts(**fused_args(expert_map=meta(2, E, dtype=torch.int32)))


def test_fused_experts_channel_scales_need_per_channel_quant():
    with pytest.raises(ValueError, match=r"w13\.scales must be \[E, ceil\(N/128\), "
                                         r"ceil\(K/128\)\] = \(4, 4, 3\) .* got \(4, 416\)"):
        gg_runtime.fused_experts(**fused_args(CHANNELS))


def test_fused_experts_one_scale_is_named():
    with pytest.raises((TypeError, ValueError), match="w1_scale"):
        gg_runtime.fused_experts(**fused_args(w1_scale=None))


def training_args(**changes):
    """moe_experts' keyword arguments for fp8 training (16-bit weights)."""
    given = {"x": meta(T, H), "topk_ids": meta(T, K, dtype=torch.int64),
             "topk_weights": meta(T, K, dtype=torch.float32), "w13": meta(E, 2 * INTER, H),
             "w2": meta(E, H, INTER)}
    given.update(changes)
    return given


@pytest.mark.parametrize("recipe", ["blockwise", "rowwise"])
@pytest.mark.parametrize("grad", [False, True])
def test_training_output_shape(recipe, grad):
    """The weights quantized and the fp8 forward run on meta tensors; with
    a gradient wanted, through the autograd function (gu kept)."""
    given = training_args()
    if grad:
        given["w13"].requires_grad_()
    out = gg_runtime.moe_experts(**given, fp8=recipe)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16 and out.requires_grad == grad


@pytest.mark.parametrize("recipe", ["blockwise", "rowwise"])
def test_training_float32_weights(recipe):
    """float32 master weights and biases with bfloat16 tokens: the output in
    x's dtype, through the autograd function, and quantized once too."""
    given = training_args(w13=meta(E, 2 * INTER, H, dtype=torch.float32).requires_grad_(),
                          w2=meta(E, H, INTER, dtype=torch.float32),
                          b13=meta(E, 2 * INTER, dtype=torch.float32), b2=meta(E, H))
    out = gg_runtime.moe_experts(**given, fp8=recipe)
    assert out.shape == (T, H) and out.dtype == torch.bfloat16 and out.requires_grad
    quantized = gg_runtime.quantize_expert_weights(given["w13"], given["w2"], fp8=recipe)
    assert gg_runtime.moe_experts(**given, fp8=quantized).dtype == torch.bfloat16


def test_training_forward_keeps_gu():
    given = training_args()
    q13, s13, _ = gg_runtime.quantize_fp8(given["w13"], "128x128")
    q2, s2, _ = gg_runtime.quantize_fp8(given["w2"], "128x128")
    out, gu, order, offs, inverse, gathered = torch.ops.gg_runtime.moe_experts_for_backward(
        given["x"], given["topk_ids"], given["topk_weights"], q13, q2,
        weight_format="128x128", w13_scale=s13, w2_scale=s2)
    assert out.shape == (T, H) and gu.shape == (T * K, 2 * INTER) and gathered
    assert gu.dtype == torch.bfloat16 and order.shape == inverse.shape == (T * K,)
    assert offs.shape == (E,)


@pytest.mark.parametrize("changes, error, match", [
    ({"fp8": "1x128"}, ValueError, "fp8 must be None, one of"),
    ({"fp8": "blockwise", **weights(BLOCKS)}, ValueError,
     "fp8='blockwise' is a training recipe that quantizes 16-bit weights itself; w13 and w2 "
     "are given quantized: give one or the other"),
    ({"fp8": "rowwise", "w2": meta(E, H, INTER, dtype=torch.float16)}, TypeError,
     "both of its dtype or both float32"),
    ({"fp8": "rowwise", "w2": meta(E, H, INTER, dtype=torch.float32)}, TypeError,
     "both of its dtype or both float32"),
    ({"fp8": "rowwise", "x": meta(T, H, dtype=torch.float32),
      "w13": meta(E, 2 * INTER, H, dtype=torch.float32),
      "w2": meta(E, H, INTER, dtype=torch.float32)}, TypeError, "float16 or bfloat16"),
    ({"fp8": "blockwise", "b2": meta(E, H, dtype=torch.float16)}, TypeError,
     "b2 must have x's or the weights' dtype"),
    ({"fp8": "blockwise", "w13": meta(2 * INTER, H)}, ValueError, "w13 must be 3-D"),
    ({"fp8": "blockwise", "w13": meta(E, 400, H), "w2": meta(E, H, 200)}, ValueError,
     "multiples of 16"),
    ({"fp8": "blockwise", "w13": meta(E, 2 * INTER, H + 16)}, ValueError, "w13"),
], ids=["recipe", "scales", "weight_dtype", "one_float32", "float32_x", "bias_dtype",
        "weight_dims", "alignment", "shape"])
def test_training_refuses(changes, error, match):
    fp8 = changes.pop("fp8")
    with pytest.raises(error, match=match):
        gg_runtime.moe_experts(**training_args(**changes), fp8=fp8)


@pytest.mark.parametrize("recipe", ["blockwise", "rowwise"])
@pytest.mark.parametrize("grad", [False, True])
def test_quantized_weights_run(recipe, grad):
    """Weights quantized once (both orientations) serve calls with and
    without a gradient wanted, views of the same weights included."""
    given = training_args()
    if grad:
        given["w13"].requires_grad_()
    quantized = gg_runtime.quantize_expert_weights(given["w13"], given["w2"], fp8=recipe)
    assert quantized.recipe == recipe
    (q13, _, layout), (q2, _, _) = quantized.forward
    (q13_t, _, _), (q2_t, _, layout_t) = quantized.backward
    assert layout == layout_t == SCALINGS[recipe].weights
    assert q13.shape == (E, 2 * INTER, H) and q13_t.shape == (E, H, 2 * INTER)
    assert q2.shape == (E, H, INTER) and q2_t.shape == (E, INTER, H)
    assert q13.dtype == q2_t.dtype == FP8
    out = gg_runtime.moe_experts(**given, fp8=quantized)
    assert out.shape == (T, H) and out.requires_grad == grad
    view = given["w13"][:]  # another tensor object over the same weight
    assert gg_runtime.moe_experts(**{**given, "w13": view}, fp8=quantized).shape == (T, H)


def test_quantized_weights_refuse_changed_weights():
    given = training_args()
    quantized = gg_runtime.quantize_expert_weights(given["w13"], given["w2"])
    with pytest.raises(ValueError, match="quantize them again"):
        gg_runtime.moe_experts(**{**given, "w2": meta(E, H, INTER)}, fp8=quantized)
    with pytest.raises(ValueError, match="quantize them again"):
        gg_runtime.moe_experts(**{**given, "w13": given["w13"].mT.contiguous().mT},
                               fp8=quantized)
    with torch.no_grad():
        given["w13"].mul_(0.5)  # as an optimizer's step writes it
    with pytest.raises(ValueError, match="quantize them again"):
        gg_runtime.moe_experts(**given, fp8=quantized)


@pytest.mark.parametrize("changes, error, match", [
    ({"fp8": "128x128"}, ValueError, "fp8 must be one of"),
    ({"w13": [1.0]}, TypeError, "w13 must be a torch.Tensor"),
    ({"w2": "w2"}, TypeError, "w2 must be a torch.Tensor, got str"),
    ({"w2": meta(E, H, INTER, dtype=torch.float16)}, TypeError, "one dtype"),
    ({"w13": meta(E, 2 * INTER, H, dtype=torch.float64),
      "w2": meta(E, H, INTER, dtype=torch.float64)}, TypeError, "float16, bfloat16 or float32"),
    ({"w2": meta(H, INTER)}, ValueError, "w2 must be 3-D"),
    ({"w2": meta(E, H, INTER + 16)}, ValueError, r"\[E, 2I, H\] and \[E, H, I\]"),
    ({"w13": meta(E, 400, H), "w2": meta(E, H, 200)}, ValueError, "multiples of 16"),
], ids=["recipe", "type", "type of w2", "dtypes", "float64", "dims", "shapes", "alignment"])
def test_quantize_expert_weights_refuses(changes, error, match):
    given = {"w13": meta(E, 2 * INTER, H), "w2": meta(E, H, INTER), "fp8": "blockwise",
             **changes}
    with pytest.raises(error, match=match):
        gg_runtime.quantize_expert_weights(given["w13"], given["w2"], fp8=given["fp8"])


def test_module_quantizes_its_weights_once_per_change():
    """MoEExperts(fp8=recipe) reuses its quantized weights until they change."""
    experts = gg_runtime.MoEExperts(E, H, INTER, fp8="rowwise", device="meta",
                                    dtype=torch.bfloat16)
    x, ids, weights = meta(T, H), meta(T, K, dtype=torch.int64), meta(T, K, dtype=torch.float32)
    assert experts(x, ids, weights).shape == (T, H)
    first = experts._fp8_weights
    assert first is not None and first.recipe == "rowwise"
    experts(x, ids, weights)
    assert experts._fp8_weights is first
    with torch.no_grad():
        experts.down_proj.add_(1.0)  # as an optimizer's step writes it
    experts(x, ids, weights)
    assert experts._fp8_weights is not first and experts._fp8_weights.matches(
        experts.gate_up_proj, experts.down_proj)


def test_module_refuses_unknown_recipe():
    with pytest.raises(ValueError, match="fp8 must be None or one of"):
        gg_runtime.MoEExperts(E, H, INTER, fp8="1x128", device="meta")


@pytest.mark.parametrize("sizes, error, message", [
    ((0, H, INTER), ValueError, "num_experts must be at least 1, got 0"),
    ((E, H, -2), ValueError, "intermediate_size must be at least 1, got -2"),
    ((E, 2.5, INTER), TypeError, "hidden_size must be an int, got float"),
    ((True, H, INTER), TypeError, "num_experts must be an int, got bool"),
])
def test_module_refuses_bad_sizes(sizes, error, message):
    with pytest.raises(error, match=message):
        gg_runtime.MoEExperts(*sizes, device="meta")
