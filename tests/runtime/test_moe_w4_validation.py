"""moe_experts with 4-bit weights (MXFP4, INT4), mxfp4_expert_weights,
int4_expert_weights and gptq_expert_weights (whose conversions are checked
against float64 here too) refuse bad input with a message naming the argument
before anything launches, and give the output's shape and dtype on meta
tensors (the operator's Meta kernel runs every check without launching).
Runs on CPU."""
import pytest
import torch

import gg_runtime
from gg_runtime import Quantized
from gg_runtime._native import call
from gg_runtime.testing.w4 import dequantize_int4, dequantize_mxfp4, random_mxfp4, widened_fp8

FP4, E8M0, U8 = torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.uint8
# H and I multiples of 32, not of 64 or 128.
T, H, INTER, E, K = 10, 96, 160, 4, 2


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def w13(**fields):
    """MXFP4 w13, `fields` replacing some of the Quantized's."""
    return Quantized(meta(E, 2 * INTER, H // 2, dtype=FP4), meta(E, 2 * INTER, H // 32, dtype=E8M0),
                     "mxfp4")._replace(**fields)


def w2(**fields):
    """MXFP4 w2, `fields` replacing some of the Quantized's."""
    return Quantized(meta(E, H, INTER // 2, dtype=FP4), meta(E, H, INTER // 32, dtype=E8M0),
                     "mxfp4")._replace(**fields)


def args(**changes):
    """moe_experts' keyword arguments with MXFP4 weights, `changes` replacing some."""
    given = {"x": meta(T, H), "topk_ids": meta(T, K, dtype=torch.int64),
             "topk_weights": meta(T, K, dtype=torch.float32), "w13": w13(), "w2": w2()}
    given.update(changes)
    return given


@pytest.mark.parametrize("tokens", [T, 0])
def test_output_shape_and_dtype(tokens):
    out = gg_runtime.moe_experts(**args(x=meta(tokens, H),
                                        topk_ids=meta(tokens, K, dtype=torch.int64),
                                        topk_weights=meta(tokens, K)))
    assert out.shape == (tokens, H) and out.dtype == torch.bfloat16 and out.device.type == "meta"


def test_accepted_variants():
    """Bytes for values and scales; biases; int32 ids; both layouts and
    activations; rows padded to 16-byte multiples; no experts."""
    out = gg_runtime.moe_experts(**args(w13=Quantized(meta(E, 2 * INTER, H // 2, dtype=U8),
                                                      meta(E, 2 * INTER, H // 32, dtype=U8),
                                                      "mxfp4"),
                                        w2=w2(values=meta(E, H, INTER // 2 + 16,
                                                          dtype=U8)[..., :INTER // 2]),
                                        b13=meta(E, 2 * INTER), b2=meta(E, H),
                                        topk_ids=meta(T, K, dtype=torch.int32)),
                                 gate_up="interleaved", activation="gpt_oss")
    assert out.shape == (T, H)
    none = args(w13=Quantized(meta(0, 2 * INTER, H // 2, dtype=FP4),
                              meta(0, 2 * INTER, H // 32, dtype=E8M0), "mxfp4"),
                w2=Quantized(meta(0, H, INTER // 2, dtype=FP4),
                             meta(0, H, INTER // 32, dtype=E8M0), "mxfp4"))
    assert gg_runtime.moe_experts(**none).shape == (T, H)


BAD = {
    "w13 unpacked": (lambda: {"w13": w13(values=meta(E, 2 * INTER, H, dtype=FP4))}, ValueError,
                     r"w13 must be \[E, 2I, H/2\] with H = 96"),
    "w2 unpacked": (lambda: {"w2": w2(values=meta(E, H, INTER, dtype=FP4))}, ValueError,
                    r"w2 must have shape \(4, 96, 80\) \(from w13 \[E, 2I, H/2\]"),
    "w13.scales per 16": (lambda: {"w13": w13(scales=meta(E, 2 * INTER, H // 16, dtype=E8M0))},
                          ValueError, r"w13.scales must be \[E, N, K/32\] = \(4, 320, 3\)"),
    "w2.scales float32": (lambda: {"w2": w2(scales=meta(E, H, INTER // 32, dtype=torch.float32))},
                          TypeError, "w2.scales must be float8_e8m0fnu or uint8"),
    "w2 fp8 beside fp4 w13": (lambda: {"w2": w2(values=meta(E, H, INTER // 2,
                                                            dtype=torch.float8_e4m3fn))},
                              TypeError, "w2 must be float4_e2m1fn_x2 or uint8 .* got "
                                         "torch.float8_e4m3fn"),
    "w13 transposed": (lambda: {"w13": w13(values=meta(E, H // 2, 2 * INTER, dtype=FP4).mT)},
                       ValueError, r"w13 must be stored \[E, 2I, H/2\] with unit stride"),
    "w2 rows 8 bytes apart": (lambda: {"w2": w2(values=meta(E, H, INTER // 2 + 8,
                                                            dtype=FP4)[..., :80])},
                              ValueError, r"w2 must be stored .* got strides \(8448, 88, 1\)"),
    "H not 32n": (lambda: {"x": meta(T, H - 16),
                           "w13": w13(values=meta(E, 2 * INTER, 40, dtype=FP4),
                                      scales=meta(E, 2 * INTER, 2, dtype=E8M0)),
                           "w2": w2(values=meta(E, H - 16, INTER // 2, dtype=FP4),
                                    scales=meta(E, H - 16, INTER // 32, dtype=E8M0))}, ValueError,
                  r"4-bit weights need H and I to be multiples of their scale group \(32: whole "
                  r"groups\), got H=80, I=160"),
    "x float16": (lambda: {"x": meta(T, H, dtype=torch.float16)}, TypeError,
                  "x must be bfloat16"),
    "b13 float32": (lambda: {"b13": meta(E, 2 * INTER, dtype=torch.float32)}, TypeError,
                    r"b13 must have x's dtype \(torch.bfloat16\)"),
    "w13.scales missing": (lambda: {"w13": w13(scales=None)}, TypeError,
                           "w13.scales must be a torch.Tensor"),
    "w13 and w2 plain 4-bit tensors": (
        lambda: {"w13": w13().values, "w2": w2().values}, TypeError,
        "w13 and w2 are torch.float4_e2m1fn_x2 and torch.float4_e2m1fn_x2: quantized weights "
        r"are given as gg_runtime.Quantized values"),
    "w2 not Quantized": (lambda: {"w2": w2().values}, TypeError,
                         r"w2 must be a gg_runtime.Quantized \(values, scales, format\)"),
    "w13 in an unknown format": (lambda: {"w13": w13(format="mxfp8")}, ValueError,
                                 r"w13.format must be one of \(.*\) for the weights, got "
                                 "'mxfp8'"),
    "w13 and w2 in two formats": (lambda: {"w2": w2(format="int4")}, ValueError,
                                  "w13 and w2 must be in one format, got 'mxfp4' and 'int4'"),
    "x quantized": (lambda: {"x": Quantized(meta(T, H, dtype=torch.float8_e4m3fn),
                                            meta(T, 3, dtype=torch.float32), "1x128")},
                    ValueError, r"x is quantized '1x128', but weights in format 'mxfp4' ask for "
                                r"none \(16-bit x\)"),
    "w2 on cpu": (lambda: {"w2": w2(values=torch.empty(E, H, INTER // 2, dtype=U8))}, ValueError,
                  "w2 is on cpu but x is on meta"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_refused(case):
    changes, error, message = BAD[case]
    with pytest.raises(error, match=message):
        gg_runtime.moe_experts(**args(**changes()))


def test_gradients_refused():
    x = torch.empty(T, H, dtype=torch.bfloat16, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="inference-only, but x requires grad"):
        gg_runtime.moe_experts(**args(x=x))


def test_operator_checks_its_arguments():
    """torch.ops.gg_runtime.moe_experts itself with 4-bit weights (the
    weights and scales as bytes): the same messages."""
    op = torch.ops.gg_runtime.moe_experts.default
    given = args()
    tensors = [given[n] for n in ("x", "topk_ids", "topk_weights")] + [
        given[n].values.view(U8) for n in ("w13", "w2")]
    scales = [given[n].scales.view(U8) for n in ("w13", "w2")]

    def run(weight_format, gate_up="concatenated", activation="swiglu", x_scale=None):
        return call(op, *tensors, None, None, gate_up, activation, weight_format, *scales,
                    x_scale)

    with pytest.raises(ValueError, match="gate_up must be 'concatenated' or 'interleaved'"):
        run("mxfp4", gate_up="split")
    with pytest.raises(ValueError, match="activation must be 'swiglu' or 'gpt_oss'"):
        run("mxfp4", activation="gelu")
    with pytest.raises(ValueError, match="weight_format must be 'unquantized', '128x128', "
                                         "'rowwise', 'mxfp4' or 'int4', got 'int8'"):
        run("int8")
    # The format is the caller's: MXFP4's byte scales are refused as INT4's.
    with pytest.raises(TypeError, match="w13.scales must be bfloat16 with INT4 weights"):
        run("int4")
    with pytest.raises(ValueError, match="x.scales must be None with 4-bit weights"):
        run("mxfp4", x_scale=meta(T, dtype=torch.float32))
    with pytest.raises(TypeError, match="w2.scales must be a tensor with 4-bit weights"):
        call(op, *tensors, None, None, "concatenated", "swiglu", "mxfp4", scales[0], None)
    with pytest.raises(ValueError, match="4-bit weights are for inference only"):
        call(torch.ops.gg_runtime.moe_experts_for_backward.default, *tensors, None, None,
             "concatenated", "swiglu", "mxfp4", *scales)
    assert run("mxfp4").shape == (T, H)


def int4(values, scales):
    return Quantized(values, scales, "int4")


def int4_args(group=32, **changes):
    """moe_experts' keyword arguments with INT4 weights (groups of `group`)."""
    given = args(w13=int4(meta(E, 2 * INTER, H // 2, dtype=U8), meta(E, 2 * INTER, H // group)),
                 w2=int4(meta(E, H, INTER // 2, dtype=U8), meta(E, H, INTER // group)))
    given.update(changes)
    return given


def test_int4_shapes_and_refusals():
    assert gg_runtime.moe_experts(**int4_args()).shape == (T, H)
    wide = int4_args(128, x=meta(T, 256), w13=int4(meta(E, 256, 128, dtype=U8), meta(E, 256, 2)),
                     w2=int4(meta(E, 256, 64, dtype=U8), meta(E, 256, 1)))
    assert gg_runtime.moe_experts(**wide).shape == (T, 256)
    values13 = meta(E, 2 * INTER, H // 2, dtype=U8)
    with pytest.raises(TypeError, match="w13.scales must be bfloat16 with INT4 weights, got "
                                        "torch.float16"):
        gg_runtime.moe_experts(**int4_args(w13=int4(values13, meta(E, 2 * INTER, 3,
                                                                   dtype=torch.float16))))
    with pytest.raises(ValueError, match=r"w13.scales must be \[E, N, K/32\] = \(4, 320, 3\) .*"
                                         "INT4 takes groups of 32 or 128"):
        gg_runtime.moe_experts(**int4_args(w13=int4(values13, meta(E, 2 * INTER, 6))))
    with pytest.raises(ValueError, match=r"w13.scales and w2.scales must have the same group"):
        gg_runtime.moe_experts(**dict(wide, w2=wide["w2"]._replace(scales=meta(E, 256, 4))))
    with pytest.raises(ValueError, match=r"multiples of their scale group \(128: whole groups\), "
                                         "got H=256, I=160"):
        gg_runtime.moe_experts(**int4_args(128, x=meta(T, 256),
                                           w13=int4(meta(E, 320, 128, dtype=U8), meta(E, 320, 2)),
                                           w2=int4(meta(E, 256, 80, dtype=U8), meta(E, 256, 1))))


def test_int4_checkpoint_layouts():
    """compressed-tensors' int32 words are the same bytes; signed nibbles are
    stored offset by 8; bad groups, dtypes and encodings are refused."""
    packed = torch.randint(-2 ** 31, 2 ** 31 - 1, (E, 8, 16), dtype=torch.int32)
    scales = torch.rand(E, 8, 4).bfloat16()
    values, scale, weight_format = gg_runtime.int4_expert_weights(packed, scales)
    assert values.dtype == U8 and values.shape == (E, 8, 64) and scale.dtype == torch.bfloat16
    assert weight_format == "int4" and torch.equal(values, packed.view(U8))
    signed = gg_runtime.int4_expert_weights(packed.view(U8), scales, encoding="signed").values
    for shift in (0, 4):  # q from either nibble: two's complement -> q + 8
        q = ((packed.view(U8) >> shift) & 15).to(torch.int16)
        assert torch.equal(((signed >> shift) & 15).to(torch.int16), (q - 16 * (q >= 8) + 8))
    with pytest.raises(ValueError, match=r"scales must be \[E, N, K/32\] or \[E, N, K/128\]"):
        gg_runtime.int4_expert_weights(packed, scales[..., :3])
    with pytest.raises(TypeError, match="scales must be bfloat16, got torch.float16"):
        gg_runtime.int4_expert_weights(packed, scales.half())
    with pytest.raises(ValueError, match="encoding must be one of"):
        gg_runtime.int4_expert_weights(packed, scales, encoding="zero_point")
    with pytest.raises(TypeError, match="packed must be uint8 or int32"):
        gg_runtime.int4_expert_weights(packed.float(), scales)


def test_checkpoint_layout():
    """gpt-oss's [E, N, K/32, 16] blocks become [E, N, K/2] values, the same bytes."""
    blocks = torch.randint(0, 256, (E, 2 * INTER, H // 32, 16), dtype=U8)
    scales = torch.randint(100, 140, (E, 2 * INTER, H // 32), dtype=U8)
    values, scale, weight_format = gg_runtime.mxfp4_expert_weights(blocks, scales)
    assert values.dtype == FP4 and scale.dtype == E8M0 and weight_format == "mxfp4"
    assert values.shape == (E, 2 * INTER, H // 2) and scale.shape == scales.shape
    assert torch.equal(values.view(U8), blocks.flatten(2)) and torch.equal(scale.view(U8), scales)
    strided = torch.randint(0, 256, (E, H // 32, 2 * INTER, 16), dtype=U8).transpose(1, 2)
    assert torch.equal(gg_runtime.mxfp4_expert_weights(strided, scales).values.view(U8),
                       strided.reshape(E, 2 * INTER, H // 2))
    with pytest.raises(ValueError, match=r"blocks must be \[E, N, K/32, 16\] or \[E, N, K/2\]"):
        gg_runtime.mxfp4_expert_weights(blocks[..., :8], scales)
    with pytest.raises(TypeError, match="scales must be uint8 or float8_e8m0fnu"):
        gg_runtime.mxfp4_expert_weights(blocks, scales.float())
    with pytest.raises(TypeError, match="blocks must be a torch.Tensor"):
        gg_runtime.mxfp4_expert_weights([1], scales)


def fused_int4_args(group=32, **changes):
    """fused_experts' arguments (vLLM's names) with INT4 weights."""
    given = int4_args(group)
    fused = {"hidden_states": given["x"], "w1": given["w13"].values, "w2": given["w2"].values,
             "topk_weights": given["topk_weights"], "topk_ids": given["topk_ids"],
             "w1_scale": given["w13"].scales, "w2_scale": given["w2"].scales,
             "use_int4_w4a16": True, "block_shape": [0, group]}
    fused.update(changes)
    return fused


def test_fused_experts_int4():
    """vLLM's int4 w4a16 arguments (uint4b8, block_shape [0, group])."""
    assert gg_runtime.fused_experts(**fused_int4_args()).shape == (T, H)
    refusals = {
        "block_shape [0, 64]": ({"block_shape": [0, 64]}, "needs block_shape \\[0, group\\]"),
        "no block_shape": ({"block_shape": None}, "needs block_shape"),
        "group against scales": ({"block_shape": [0, 128]},
                                 r"takes w1 uint8 \[E, 2I, H/2\] and w1_scale bfloat16 "
                                 r"\[E, 2I, H/128\]"),
        "zero points": ({"w1_zp": meta(E, 2 * INTER, 3, dtype=U8)}, "w1_zp and w2_zp must be None"),
        "both": ({"use_fp8_w8a8": True}, "cannot both be True"),
        "no scales": ({"w1_scale": None, "w2_scale": None}, "got use_fp8_w8a8=False, "
                                                            "use_int4_w4a16=True"),
    }
    for changes, message in refusals.values():
        with pytest.raises(ValueError, match=message):
            gg_runtime.fused_experts(**fused_int4_args(**changes))


def gptq_checkpoint(q: torch.Tensor, scales: torch.Tensor, zero_stored: int):
    """GPTQ's tensors of weights q [E, N, K] (-8 .. 7) and scales [E, N,
    K/group]: qweight [E, K/8, N] int32 with K's eight values a word, lowest
    bits first, each q + 8; scales transposed; qzeros of the symmetric zero
    point 8 stored as zero_stored in every nibble."""
    experts, n, k = q.shape
    stored = (q + 8).transpose(1, 2).reshape(experts, k // 8, 8, n).long()
    words = sum(stored[:, :, j] << (4 * j) for j in range(8))
    qweight = torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)
    nibbles = sum(zero_stored << (4 * j) for j in range(8))
    qzeros = torch.full((experts, scales.shape[2], n // 8),
                        nibbles - 2 ** 32 if nibbles >= 2 ** 31 else nibbles, dtype=torch.int32)
    return qweight, scales.transpose(1, 2).contiguous(), qzeros


@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("zero_stored", [7, 8], ids=["gptq_v1", "gptq_v2"])
def test_gptq_checkpoint_layout(group, zero_stored):
    """GPTQ's qweight and scales become the values and scales that stand for
    the same weights: q * scale, the scales rounded once to bfloat16."""
    gen = torch.Generator().manual_seed(group + zero_stored)
    n, k = 24, 2 * group
    q = torch.randint(-8, 8, (E, n, k), generator=gen)
    scales = (torch.rand(E, n, k // group, generator=gen) + 0.5).half()
    qweight, gptq_scales, qzeros = gptq_checkpoint(q, scales, zero_stored)
    g_idx = torch.arange(k, dtype=torch.int32) // group
    values, scale, weight_format = gg_runtime.gptq_expert_weights(qweight, gptq_scales,
                                                                  qzeros=qzeros, g_idx=g_idx)
    assert weight_format == "int4" and values.dtype == U8 and values.shape == (E, n, k // 2)
    assert values.is_contiguous()
    assert scale.dtype == torch.bfloat16 and scale.shape == (E, n, k // group)
    want = q.double() * scales.bfloat16().double().repeat_interleave(group, dim=-1)
    assert torch.equal(dequantize_int4(values, scale), want)
    # and as the same bytes int4_expert_weights takes
    assert torch.equal(gg_runtime.int4_expert_weights(values, scale).values, values)


def test_gptq_checkpoint_refusals():
    q = torch.zeros(E, 16, 64, dtype=torch.long)
    qweight, scales, qzeros = gptq_checkpoint(q, torch.ones(E, 16, 2).half(), 8)
    with pytest.raises(ValueError, match="asymmetric GPTQ"):
        gg_runtime.gptq_expert_weights(qweight, scales, qzeros=qzeros - 1)
    act_order = torch.arange(64).flip(0) // 32
    with pytest.raises(ValueError, match="act-order"):
        gg_runtime.gptq_expert_weights(qweight, scales, g_idx=act_order)
    with pytest.raises(ValueError, match=r"scales must be \[E, K/32, N\] or \[E, K/128, N\]"):
        gg_runtime.gptq_expert_weights(qweight, scales[:, :1, :8])
    with pytest.raises(TypeError, match="qweight must be int32"):
        gg_runtime.gptq_expert_weights(qweight.view(torch.float32), scales)
    with pytest.raises(TypeError, match="scales must be float16 or bfloat16"):
        gg_runtime.gptq_expert_weights(qweight, scales.float())
    with pytest.raises(ValueError, match=r"qzeros must be \[E, K/group, N/8\]"):
        gg_runtime.gptq_expert_weights(qweight, scales, qzeros=qzeros[:, :1])
    with pytest.raises(TypeError, match="g_idx must be a torch.Tensor or None"):
        gg_runtime.gptq_expert_weights(qweight, scales, g_idx=[0, 1])


def test_4bit_and_e8m0_tensors_elsewhere_are_refused_by_name():
    """torch's stable ABI cannot pass float4_e2m1fn_x2 or float8_e8m0fnu
    tensors to an operator: where they reach one unconverted (not as
    moe_experts' 4-bit weights or scales) the error names the argument."""
    with pytest.raises(TypeError, match="x must not be torch.float4_e2m1fn_x2"):
        gg_runtime.moe_experts(**args(x=meta(T, H // 2, dtype=FP4)))
    with pytest.raises(TypeError, match="mat_a must not be torch.float8_e8m0fnu"):
        gg_runtime.grouped_mm(meta(T, H, dtype=E8M0), meta(E, H, 32),
                              offs=meta(E, dtype=torch.int32))


@pytest.mark.parametrize("exponents", [(118, 124), (0, 14), (240, 254)])
def test_widened_fp8_stands_for_the_mxfp4_values(exponents):
    """testing.w4.widened_fp8, the GPU tests' model of the fp8 weights
    moe_experts' W4A8 prefill makes, stands for the MXFP4 values exactly
    where a block's scales lie within 14 binades (the smallest scales, the
    largest; N and K not whole blocks)."""
    w = random_mxfp4(2, 200, 320, exponents, device="cpu")
    q = widened_fp8(w)
    assert q.values.dtype == torch.float8_e4m3fn and q.scales.shape == (2, 2, 3)
    scales = q.scales.double().repeat_interleave(128, 1).repeat_interleave(128, 2)
    assert torch.equal(q.values.double() * scales[:, :200, :320],
                       dequantize_mxfp4(w.values, w.scales))
