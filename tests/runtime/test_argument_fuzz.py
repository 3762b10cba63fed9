"""Random arguments, mostly wrong, to the public entry points on meta tensors:
every refusal is a TypeError or ValueError (never an AttributeError, an
IndexError or torch's own RuntimeError from inside the dispatcher), and no
message names a dtype as torch.dtype(N).  Seeded: the same calls every run.
Runs on CPU (meta tensors run each operator's checks and launch nothing)."""
import random

import pytest
import torch

import gg_runtime
from gg_runtime import Quantized

FP8 = torch.float8_e4m3fn
U8 = torch.uint8
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, FP8, torch.float8_e5m2,
          torch.float4_e2m1fn_x2, torch.float8_e8m0fnu, torch.int32, torch.int64, U8,
          torch.bool)
JUNK = (None, 0, -1, 3, 2.5, "x", True, [128, 128], (1,), torch.float32, object())
T, H, I, E, K = 7, 256, 128, 4, 2  # noqa: E741 (the experts' intermediate size, as elsewhere)


class Arguments:
    """Random arguments near the valid ones: a tensor of the expected shape and
    dtype, or one with a size, dimension or dtype changed, or no tensor at all."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def tensor(self, *shape, dtype=torch.bfloat16, transposed=False):
        """transposed: made as shape, then seen through .mT (a K-major operand)."""
        rng = self.rng
        if rng.random() < 0.08:
            return rng.choice(JUNK)
        shape = [s if rng.random() < 0.85 else rng.choice((0, 1, 17, 128)) for s in shape]
        if shape and rng.random() < 0.1:
            shape.pop()
        if rng.random() < 0.2:
            dtype = rng.choice(DTYPES)
        t = torch.empty(shape, dtype=dtype, device="meta")
        return t.mT if t.dim() >= 2 and (transposed != (rng.random() < 0.1)) else t

    def value(self, valid):
        return self.rng.choice(JUNK) if self.rng.random() < 0.15 else valid

    def quantized(self, values, scales, format):
        """A gg_runtime.Quantized of values and scales (random arguments
        themselves) in `format`; rarely (each weight is one of two) with
        another format, or no Quantized at all."""
        rng = self.rng
        if rng.random() < 0.04:
            return rng.choice(JUNK)
        return Quantized(values, scales, rng.choice(JUNK) if rng.random() < 0.04 else format)


def served_fp8(args: Arguments):
    """moe_experts with fp8 weights, each a Quantized of random arguments
    (drawn in the order of the call's arguments before weights were one
    value: x, the routing, w13, w2, then their scales)."""
    t, f32 = args.tensor, torch.float32
    x, ids, weights = t(T, H), t(T, K, dtype=torch.int64), t(T, K, dtype=f32)
    w13, w2 = t(E, 2 * I, H, dtype=FP8), t(E, H, I, dtype=FP8)
    w13_scale, w2_scale = t(E, 2 * I // 128, H // 128, dtype=f32), t(E, H // 128, I // 128,
                                                                      dtype=f32)
    return gg_runtime.moe_experts(x, ids, weights, Quantized(w13, w13_scale, "128x128"),
                                  Quantized(w2, w2_scale, "128x128"))


def served_w4(args: Arguments, group, scale, weight_format):
    """moe_experts with 4-bit weights (MXFP4 or INT4), each a Quantized of
    random arguments, and now and then x given quantized too (scales of any
    kind: refused, 4-bit weights take 16-bit tokens); drawn as served_fp8."""
    t, v, f32 = args.tensor, args.value, torch.float32
    x, ids, weights = t(T, H), t(T, K, dtype=torch.int64), t(T, K, dtype=f32)
    w13, w2 = t(E, 2 * I, H // 2, dtype=U8), t(E, H, I // 2, dtype=U8)
    w13_scale, w2_scale = t(E, 2 * I, H // group, dtype=scale), t(E, H, I // group, dtype=scale)
    options = {"gate_up": v("interleaved"), "activation": v("gpt_oss"), "b13": v(None)}
    x_scale = v(None)
    return gg_runtime.moe_experts(x if x_scale is None else Quantized(x, x_scale, "1x128"), ids,
                                  weights, Quantized(w13, w13_scale, weight_format),
                                  Quantized(w2, w2_scale, weight_format), **options)


def calls(args: Arguments):
    """One call of each entry point, with args' random arguments."""
    t, v = args.tensor, args.value
    ids, f32 = torch.int64, torch.float32
    yield lambda: gg_runtime.grouped_mm(t(T, H), t(E, H, I), t(E, dtype=torch.int32),
                                        out_dtype=v(None))
    yield lambda: gg_runtime.gmm(t(T, H), t(E, H, I), t(E, dtype=ids), trans_b=v(False))
    yield lambda: gg_runtime.scaled_grouped_mm(
        t(T, H, dtype=FP8), t(E, I, H, dtype=FP8, transposed=True), t(T, dtype=f32),
        t(E, I, dtype=f32), t(E, dtype=torch.int32), out_dtype=v(torch.bfloat16),
        use_fast_accum=v(False))
    yield lambda: gg_runtime.quantize_fp8(t(T, H), v("1x128"))
    yield lambda: gg_runtime.fp8_grouped_mm(t(T, H), t(E, H, I), t(E, dtype=torch.int32),
                                            recipe=v("blockwise"))
    yield lambda: gg_runtime.moe_experts(
        t(T, H), t(T, K, dtype=ids), t(T, K, dtype=f32), t(E, 2 * I, H), t(E, H, I),
        gate_up=v("concatenated"), activation=v("swiglu"), b13=v(None), fp8=v(None))
    yield lambda: served_fp8(args)
    for group, scale, weight_format in ((32, U8, "mxfp4"), (32, torch.bfloat16, "int4"),
                                        (128, torch.bfloat16, "int4")):
        yield lambda group=group, scale=scale, weight_format=weight_format: served_w4(
            args, group, scale, weight_format)
    yield lambda: gg_runtime.mxfp4_expert_weights(t(E, I, H // 32, 16, dtype=U8),
                                                  t(E, I, H // 32, dtype=U8))
    yield lambda: gg_runtime.int4_expert_weights(t(E, I, H // 8, dtype=torch.int32),
                                                 t(E, I, H // 128), encoding=v("signed"))
    yield lambda: gg_runtime.gptq_expert_weights(
        t(E, H // 8, I, dtype=torch.int32), t(E, H // 128, I, dtype=torch.float16),
        qzeros=v(None), g_idx=v(None))
    yield lambda: gg_runtime.fused_experts(
        t(T, H), t(E, 2 * I, H, dtype=FP8), t(E, H, I, dtype=FP8), t(T, K, dtype=f32),
        t(T, K, dtype=ids), inplace=v(False), use_fp8_w8a8=v(True),
        expert_map=v(None), global_num_experts=v(-1),
        w1_scale=t(E, 2 * I // 128, H // 128, dtype=f32),
        w2_scale=t(E, H // 128, I // 128, dtype=f32), block_shape=v([128, 128]))
    yield lambda: gg_runtime.moe_experts(
        t(T, H), t(T, K, dtype=ids), t(T, K, dtype=f32), t(E, 2 * I, H, dtype=f32),
        t(E, H, I, dtype=f32), b13=t(E, 2 * I), b2=t(E, H, dtype=f32), fp8=v("blockwise"))
    for recipe in ("rowwise", "blockwise"):
        yield lambda recipe=recipe: gg_runtime.quantize_expert_weights(
            t(E, 2 * I, H), t(E, H, I), fp8=v(recipe))
    yield lambda: gg_runtime.MoEExperts(v(E), v(H), v(I), device="meta")(
        t(T, H), t(T, K, dtype=ids), t(T, K, dtype=f32))
    yield lambda: gg_runtime.transformers_experts_forward(
        v(gg_runtime.MoEExperts(E, H, I, device="meta")), t(T, H), t(T, K, dtype=ids),
        t(T, K, dtype=f32))


def quantized_calls(args: Arguments):
    """The calls that take Quantized values, each value a wrong one or of a
    wrong format now and then: moe_experts with fp8 weights and tokens given
    quantized (per token), with 128 x 128 blocks, with 4-bit weights (their
    own random stream, apart from calls(): it leaves calls()' draws as they
    were)."""
    t, v, q = args.tensor, args.value, args.quantized
    ids, f32 = torch.int64, torch.float32
    yield lambda: gg_runtime.moe_experts(
        q(t(T, H, dtype=FP8), t(T, dtype=f32), "rowwise"), t(T, K, dtype=ids),
        t(T, K, dtype=f32), q(t(E, 2 * I, H, dtype=FP8), t(E, 2 * I, dtype=f32), "rowwise"),
        q(t(E, H, I, dtype=FP8), t(E, H, dtype=f32), "rowwise"), fp8=v(None))
    yield lambda: gg_runtime.moe_experts(
        t(T, H), t(T, K, dtype=ids), t(T, K, dtype=f32),
        q(t(E, 2 * I, H, dtype=FP8), t(E, 2 * I // 128, H // 128, dtype=f32), "128x128"),
        q(t(E, H, I, dtype=FP8), t(E, H // 128, I // 128, dtype=f32), "128x128"))
    yield lambda: gg_runtime.moe_experts(
        t(T, H), t(T, K, dtype=ids), t(T, K, dtype=f32),
        q(t(E, 2 * I, H // 2, dtype=U8), t(E, 2 * I, H // 32, dtype=U8), "mxfp4"),
        q(t(E, H, I // 2, dtype=U8), t(E, H, I // 32, dtype=U8), "mxfp4"))


@pytest.mark.parametrize("seed", range(8))
def test_refusals_are_type_or_value_errors(seed):
    args, quantized = Arguments(seed), Arguments(seed + 1000)
    for _ in range(20):
        for call in (*calls(args), *quantized_calls(quantized)):
            try:
                call()
            except (TypeError, ValueError) as error:
                assert "torch.dtype(" not in str(error), error
