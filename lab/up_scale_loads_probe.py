"""What the blockwise scale loads and the two K loops cost the fp8 up
projection's transposed tiles (scaled_ragged_glu's 32 x 256 config, kernels/scaled.py
scaled_columns): each K step loads its 32 tokens' scales (one float a token,
K / 128 floats apart) and the weight block's, after the step's product.
Three versions of scaled_columns, JIT-compiled into the same kernel by the
host's Triton (each its own compile: TRITON_ALWAYS_COMPILE), on
lab/fp8_routed_probe.py's inputs, timed replayed with the L2 flushed:

- `wheel`: scaled_columns as it is;
- `no_loads`: every scale 1 (its output is wrong: a bound on what the loads cost);
- `ahead`: the next step's scales loaded before this step's product;
- `one_loop`: (gathered_scaled_tile) the gate's and the up's 128 rows in one
  K loop, each step's token block read once, where the wheel's goes over K
  twice, a half at a time;
- `wheel_s3`: the wheel's at three stages;
- `--grids`: each version again over other program counts than the resident
  wave's (`tiles`: a program a tile, the hardware's scheduler balancing them;
  `even`: the fewest programs that walk the wave's rounds, as many tiles
  each; `sms`: a program an SM).

    cd build && TRITON_ALWAYS_COMPILE=1 PYTHONPATH=<wheel>:.. \
        python -m lab.up_scale_loads_probe [--filter NAME] [--tokens T ...]
        [--versions NAME ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

import aot.kernels.ragged as ragged
import aot.kernels.scaled as scaled
from aot.kernels.glu import CONCATENATED
from aot.kernels.scaled import SCALE_BLOCK, gathered_block, oriented_dot, scaled_by
from bench.measure import graphed
from gg_runtime.testing import rel_error, time_ms
from lab.fp8_routed_probe import persistent, quantized_rows, routed_slots, up_args, up_kernel
from lab.vllm_kernel_split import served_cases

TILE = (32, 256, 128, 4, 4)  # scaled_ragged_glu's SWAPPED config (the versions' stages apart)


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


@triton.jit
def half_scales(scale_b_ptr, g, first, limit, N, K, block):
    """The weight-block scale of `first`'s 128 rows (a half's columns start on
    a block) for K block `block`, 0 past limit, [128]."""
    k_blocks = tl.cdiv(K, SCALE_BLOCK)
    cols = first + tl.arange(0, 128)
    scale = tl.load(scale_b_ptr + (g.to(tl.int64) * tl.cdiv(N, SCALE_BLOCK)
                                   + first // SCALE_BLOCK) * k_blocks + block)
    return tl.where(cols < limit, scale, 0.0)


@triton.jit
def tile_in_one_loop(gather, scales, b_desc, g, off_m, off_n, end, N, K, k_end,
                     SCALING: tl.constexpr, GLU: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr):
    tl.static_assert(GLU == CONCATENATED and BN == 256 and BM < 64, "the transposed tiles")
    a_ptr, lda, rows_ptr, rows_div = gather
    scale_a_ptr, scale_b_ptr = scales
    rows = off_m + tl.arange(0, BM)
    row_ok = rows < end
    tokens = tl.load(rows_ptr + rows, mask=row_ok, other=0) // rows_div
    a_rows = tl.multiple_of(a_ptr + tokens * lda, 16)
    a_scales = scale_a_ptr + tokens * tl.cdiv(K, SCALE_BLOCK)
    gate_first = off_n // 2
    up_first = N // 2 + off_n // 2
    rk = tl.arange(0, BK)
    gate = tl.zeros((128, BM), dtype=tl.float32)
    up = tl.zeros((128, BM), dtype=tl.float32)
    for k0 in range(0, k_end, BK):
        a = gathered_block(a_rows, row_ok, k0 + rk, k_end)
        gate_product = oriented_dot(a, b_desc.load([g, gate_first, k0]).reshape(128, BK), None,
                                    True)
        up_product = oriented_dot(a, b_desc.load([g, up_first, k0]).reshape(128, BK), None,
                                  True)
        block = k0 // SCALE_BLOCK
        scale_a = tl.load(a_scales + block, mask=row_ok, other=0.0)
        gate += scaled_by(gate_product, scale_a,
                          half_scales(scale_b_ptr, g, gate_first, N // 2, N, K, block), True)
        up += scaled_by(up_product, scale_a,
                        half_scales(scale_b_ptr, g, up_first, N, N, K, block), True)
    return tl.reshape(tl.permute(tl.join(gate.T, up.T), (0, 2, 1)), (BM, BN))


# name -> (the replaced function, its replacement, stages)
VERSIONS = {"wheel": ("scaled_columns", scaled.scaled_columns, 4),
            "no_loads": ("scaled_columns", columns_without_scale_loads, 4),
            "ahead": ("scaled_columns", columns_scales_ahead, 4),
            "one_loop": ("gathered_scaled_tile", tile_in_one_loop, 4),
            "one_loop_s3": ("gathered_scaled_tile", tile_in_one_loop, 3),
            "one_loop_s2": ("gathered_scaled_tile", tile_in_one_loop, 2),
            "wheel_s3": ("scaled_columns", scaled.scaled_columns, 3)}
# name -> programs from (tiles, the resident wave, SMs)
GRIDS = {"wave": lambda tiles, wave, sms: min(tiles, wave),
         "tiles": lambda tiles, wave, sms: tiles,
         "even": lambda tiles, wave, sms: triton.cdiv(tiles, triton.cdiv(tiles, wave)),
         "sms": lambda tiles, wave, sms: min(tiles, sms)}
MODULES = {"scaled_columns": scaled, "gathered_scaled_tile": ragged}
ORIGINALS = {"scaled_columns": scaled.scaled_columns,
             "gathered_scaled_tile": scaled.gathered_scaled_tile}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[64, 256])
    parser.add_argument("--versions", nargs="*", default=list(VERSIONS), choices=list(VERSIONS),
                        help="the first (at the first grid) is the others' reference")
    parser.add_argument("--grids", nargs="*", default=["wave"], choices=list(GRIDS))
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
        for name in args.versions:
            replaced, version, stages = VERSIONS[name]
            for function, original in ORIGINALS.items():
                setattr(MODULES[function], function, version if function == replaced else original)
            kernel = triton.jit(up_kernel.fn)  # a compile of its own
            for grid in args.grids:
                fn, _ = persistent(kernel, constexprs, tiles, up, (*TILE[:4], stages), GRIDS[grid])
                fn()
                label = name if grid == "wave" else f"{name}@{grid}"
                found[label] = ([o.float().clone() for o in outputs], 1e3 * time_ms(graphed(fn)))
        for function, original in ORIGINALS.items():
            setattr(MODULES[function], function, original)
        wheel_out = next(iter(found.values()))[0]
        print(f"{model} T={tokens}: " + ", ".join(
            f"{name} {us:.1f} µs (error {max(rel_error(o, r) for o, r in zip(out, wheel_out)):.1e})"
            for name, (out, us) in found.items()), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
