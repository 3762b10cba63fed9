"""What the blockwise scale loads cost the fp8 up projection's transposed
tiles (scaled_ragged_glu's 32 x 256 config, kernels/scaled.py
scaled_columns): each K step loads its 32 tokens' scales (one float a token,
K / 128 floats apart) and the weight block's, after the step's product.
Three versions of scaled_columns, JIT-compiled into the same kernel by the
host's Triton (each its own compile: TRITON_ALWAYS_COMPILE), on
lab/fp8_routed_probe.py's inputs, timed replayed with the L2 flushed:

- `wheel`: scaled_columns as it is;
- `no_loads`: every scale 1 (its output is wrong: a bound on what the loads cost);
- `ahead`: the next step's scales loaded before this step's product.

    cd build && TRITON_ALWAYS_COMPILE=1 PYTHONPATH=<wheel>:.. \
        python -m lab.up_scale_loads_probe [--filter NAME] [--tokens T ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import aot.kernels.scaled as scaled
from aot.kernels.scaled import SCALE_BLOCK, gathered_block, oriented_dot, scaled_by
from bench.measure import graphed
from gg_runtime.testing import rel_error, time_ms
from lab.fp8_routed_probe import persistent, quantized_rows, routed_slots, up_args, up_kernel
from lab.vllm_kernel_split import served_cases

TILE = (32, 256, 128, 4, 4)  # scaled_ragged_glu's SWAPPED config


@triton.jit
def block_scales(a_scales, b_scales, block, k_blocks, row_ok, in_second, second_exists,
                 col_ok):
    """(the tokens' scales, the columns' weight-block scales) of K block `block`."""
    scale_a = tl.load(a_scales + block, mask=row_ok, other=0.0)
    scale_b = tl.where(in_second,
                       tl.load(b_scales + k_blocks + block, mask=second_exists, other=0.0),
                       tl.load(b_scales + block))
    return scale_a, tl.where(col_ok, scale_b, 0.0)


@triton.jit
def columns_without_scale_loads(operand, scales, first, limit, N, K, k_end,
                                SCALING: tl.constexpr, BM: tl.constexpr, W: tl.constexpr,
                                BK: tl.constexpr):
    a_rows, row_ok, tokens, b_desc, g = operand
    SWAPPED: tl.constexpr = BM < 64
    tl.static_assert(SWAPPED, "the transposed tiles only")
    cols = first + tl.arange(0, W)
    col_ok = cols < limit
    rk = tl.arange(0, BK)
    scale_a = tl.where(row_ok, 1.0, 0.0)
    scale_b = tl.where(col_ok, 1.0, 0.0)
    acc = tl.zeros((W, BM), dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        product = oriented_dot(gathered_block(a_rows, row_ok, k0 + rk, k_end),
                               b_desc.load([g, first, k0]).reshape(W, BK), None, SWAPPED)
        acc += scaled_by(product, scale_a, scale_b, SWAPPED)
    return acc.T


@triton.jit
def columns_scales_ahead(operand, scales, first, limit, N, K, k_end, SCALING: tl.constexpr,
                         BM: tl.constexpr, W: tl.constexpr, BK: tl.constexpr):
    a_rows, row_ok, tokens, b_desc, g = operand
    scale_a_ptr, scale_b_ptr = scales
    SWAPPED: tl.constexpr = BM < 64
    tl.static_assert(SWAPPED, "the transposed tiles only")
    cols = first + tl.arange(0, W)
    col_ok = cols < limit
    rk = tl.arange(0, BK)
    k_blocks = tl.cdiv(K, SCALE_BLOCK)
    n_blocks = tl.cdiv(N, SCALE_BLOCK)
    a_scales = scale_a_ptr + tokens * k_blocks
    first_block = first // SCALE_BLOCK
    b_scales = scale_b_ptr + (g.to(tl.int64) * n_blocks + first_block) * k_blocks
    in_second = cols // SCALE_BLOCK != first_block
    second_exists = first_block + 1 < n_blocks
    scale_a, scale_b = block_scales(a_scales, b_scales, 0, k_blocks, row_ok, in_second,
                                    second_exists, col_ok)
    acc = tl.zeros((W, BM), dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        following = tl.minimum(k0 // SCALE_BLOCK + 1, k_blocks - 1)
        next_a, next_b = block_scales(a_scales, b_scales, following, k_blocks, row_ok,
                                      in_second, second_exists, col_ok)
        product = oriented_dot(gathered_block(a_rows, row_ok, k0 + rk, k_end),
                               b_desc.load([g, first, k0]).reshape(W, BK), None, SWAPPED)
        acc += scaled_by(product, scale_a, scale_b, SWAPPED)
        scale_a, scale_b = next_a, next_b
    return acc.T


VERSIONS = {"wheel": scaled.scaled_columns, "no_loads": columns_without_scale_loads,
            "ahead": columns_scales_ahead}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[64, 256])
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    for model, shape, tokens, (x, topk_ids, _), w13, _ in served_cases(args.filter, args.tokens):
        hidden, inter, experts, k = shape
        order, offs = routed_slots(topk_ids, experts)
        xq, x_scale = quantized_rows(*x.shape)
        up, constexprs, outputs, tiles = up_args((shape, order.numel(), offs), xq, x_scale,
                                                 order, k, w13)
        found = {}
        for name, columns in VERSIONS.items():
            scaled.scaled_columns = columns
            kernel = triton.jit(up_kernel.fn)  # a compile of its own
            fn, _ = persistent(kernel, constexprs, tiles, up, TILE)
            fn()
            found[name] = ([o.float().clone() for o in outputs], 1e3 * time_ms(graphed(fn)))
        scaled.scaled_columns = VERSIONS["wheel"]
        wheel_out = found["wheel"][0]
        print(f"{model} T={tokens}: " + ", ".join(
            f"{name} {us:.1f} µs (error {max(rel_error(o, r) for o, r in zip(out, wheel_out)):.1e})"
            for name, (out, us) in found.items()), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
