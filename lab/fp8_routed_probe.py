"""fp8 moe_experts' routed products at the vllm_fp8 section's decode token
counts past the decode path (T = 64, 256): where their tiles lose to vLLM's.
On the section's inputs (its weights, softmax top-k routing), each side
replayed from a CUDA graph with the L2 flushed before each replay:

- `--forced`: the whole forward under torch.profiler, as dispatched and with
  each compiled scaled_ragged_glu (up) and scaled_ragged_m (down) variant
  that runs the call forced; each kernel's µs a call (`--scales channelwise`:
  on per-channel weights);
- default: each product alone, JIT-compiled by the host's Triton, at the
  wheel's config and at candidate tiles and stage counts (the persistent
  grid sized to the resident programs, as csrc/registry.cc sizes it), each
  output against the wheel's config's.

    cd build && PYTHONPATH=<wheel>:.. python -m lab.fp8_routed_probe [--forced
        [--scales channelwise]] [--filter NAME] [--tokens T ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import gg_runtime
from aot.kernels.glu import CONCATENATED
from aot.kernels.ragged import scaled_ragged_glu_kernel, scaled_ragged_m_kernel
from aot.kernels.scaled import BLOCKWISE
from aot.variants import GROUP_CHUNK
from bench.measure import graphed
from gg_runtime import _C
from gg_runtime.testing import forced, rel_error, time_ms
from lab.vllm_kernel_split import kernel_us, served_cases

# (BM, BN, BK, warps, stages) of the Triton kernels: each list's first, the
# wheel's decode config at e66e931 (aot/families/; the down projection's
# before it moved to the warp-specialised kernel).
DOWN_TILES = [(64, 128, 128, 4, 4), (64, 128, 128, 4, 1), (64, 128, 128, 4, 2),
              (64, 128, 128, 4, 3), (64, 64, 128, 4, 2), (64, 64, 128, 4, 3),
              (64, 64, 128, 4, 4), (64, 256, 128, 8, 2), (64, 256, 128, 8, 3)]
UP_TILES = [(32, 256, 128, 4, 4), (32, 256, 128, 4, 5), (16, 256, 128, 4, 3),
            (16, 256, 128, 4, 4), (16, 256, 128, 4, 5)]
SMEM_PER_SM = 233472  # an H100's or H200's, with the 1 KiB each block reserves
REGISTERS_PER_SM = 65536


def resident(compiled) -> int:
    """Programs of `compiled` an SM holds at once (shared memory, registers, warps)."""
    warps = compiled.metadata.num_warps
    by_smem = SMEM_PER_SM // (compiled.metadata.shared + 1024)
    per_warp = -(-compiled.n_regs * 32 // 256) * 256
    by_regs = (REGISTERS_PER_SM // per_warp) // warps
    return max(1, min(by_smem, by_regs, 64 // warps, 32))


def routed_slots(topk_ids, experts):
    """(order int32 [S]: each slot's index into topk_ids.flatten(), by expert;
    offs int32 [E]: the experts' cumulative slot counts)."""
    flat = topk_ids.flatten()
    order = torch.argsort(flat, stable=True).to(torch.int32)
    offs = torch.cumsum(torch.bincount(flat, minlength=experts), 0).to(torch.int32)
    return order, offs


def quantized_rows(rows, columns):
    """(q float8_e4m3fn [rows, columns], scales [rows, cdiv(columns, 128)]):
    random values and scales, as a 1 x 128 quantization's."""
    q = torch.randn(rows, columns, device="cuda").to(torch.float8_e4m3fn)
    return q, torch.rand(rows, triton.cdiv(columns, 128), device="cuda") + 0.5


def persistent(kernel, constexprs, tiles, args, tile, grid_of=None):
    """(fn() launching kernel over `tiles` with the family's `constexprs` and
    `tile`'s, its grid the resident wave or the tiles if fewer (grid_of:
    grid_of(tiles, wave, SMs) programs instead); the programs an SM holds)."""
    BM, BN, BK, warps, stages = tile
    options = dict(constexprs, USE_TMA=True, BM=BM, BN=BN, BK=BK, CHUNK=GROUP_CHUNK,
                   PRECISION="tf32", num_warps=warps, num_stages=stages)
    compiled = kernel[(1,)](*args, **options)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    wave, count = sms * resident(compiled), tiles(BM, BN)
    grid = (grid_of(count, wave, sms) if grid_of else min(count, wave),)
    return (lambda: kernel[grid](*args, **options)), resident(compiled)


# The kernels with their row strides widened to 64 bits: the JIT types an
# integer argument by its value, the wheel's signature (aot/families/) types
# strides i64, and the ragged descriptors' arithmetic needs it.
@triton.jit
def down_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G, lda,
                b_group_stride, ldb, ldc, bias_ptr, has_bias, SCALING: tl.constexpr,
                FAST_ACCUM: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    scaled_ragged_m_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, T, N, K, G,
                           lda.to(tl.int64), b_group_stride.to(tl.int64), ldb.to(tl.int64),
                           ldc.to(tl.int64), bias_ptr, has_bias, SCALING, FAST_ACCUM, USE_TMA,
                           BM, BN, BK, CHUNK, PRECISION)


@triton.jit
def up_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr, c_scale_ptr, T, N, K, G,
              lda, b_group_stride, ldb, ldc, bias_ptr, has_bias, activation, gu_ptr, rows_ptr,
              rows_div, SCALING: tl.constexpr, GLU: tl.constexpr, SAVE_GU: tl.constexpr,
              USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    scaled_ragged_glu_kernel(a_ptr, b_ptr, c_ptr, offs_ptr, scale_a_ptr, scale_b_ptr,
                             c_scale_ptr, T, N, K, G, lda.to(tl.int64),
                             b_group_stride.to(tl.int64), ldb.to(tl.int64), ldc.to(tl.int64),
                             bias_ptr, has_bias, activation, gu_ptr, rows_ptr, rows_div, SCALING,
                             GLU, SAVE_GU, USE_TMA, BM, BN, BK, CHUNK, PRECISION)


def down_args(case):
    """The down projection's arguments (scaled_ragged_m_kernel) and its tile count."""
    (hidden, inter, experts, _), h, h_scale, offs, w2 = case
    slots = h.shape[0]
    out = torch.empty(slots, hidden, dtype=torch.bfloat16, device="cuda")
    args = (h, w2.values, out, offs, h_scale, w2.scales, slots, hidden, inter, experts,
            h.stride(0), w2.values.stride(0), w2.values.stride(1), out.stride(0), out, 0)
    constexprs = dict(SCALING=BLOCKWISE, FAST_ACCUM=True)
    return args, constexprs, out, lambda BM, BN: (triton.cdiv(slots, BM) + experts + 1) \
        * triton.cdiv(hidden, BN)


def up_args(case, xq, x_scale, order, k, w13):
    (hidden, inter, experts, _), slots, offs = case
    h = torch.empty(slots, inter, dtype=torch.float8_e4m3fn, device="cuda")
    h_scale = torch.empty(slots, triton.cdiv(inter, 128), device="cuda")
    dummy = torch.empty(1, dtype=torch.bfloat16, device="cuda")
    args = (xq, w13.values, h, offs, x_scale, w13.scales, h_scale, slots, 2 * inter, hidden,
            experts, xq.stride(0), w13.values.stride(0), w13.values.stride(1), inter, dummy, 0,
            0, dummy, order, k)
    constexprs = dict(SCALING=BLOCKWISE, GLU=CONCATENATED, SAVE_GU=False)
    return args, constexprs, (h, h_scale), lambda BM, BN: (triton.cdiv(slots, BM) + experts + 1) \
        * triton.cdiv(2 * inter, BN)


def sweep(kernel, tiles_of, args, constexprs, outputs, tiles):
    """{tile: {us, resident, error}} for each tile, errors against the first's."""
    found, reference = {}, None
    for tile in tiles:
        fn, programs = persistent(kernel, constexprs, tiles_of, args, tile)
        fn()
        values = [o.float().clone() for o in outputs]
        if reference is None:
            reference = values
        error = max(rel_error(v, r) for v, r in zip(values, reference))
        us = 1e3 * time_ms(graphed(fn))
        name = "x".join(map(str, tile[:3])) + f"_w{tile[3]}_s{tile[4]}"
        found[name] = {"us": us, "resident": programs, "error": error}
        print(f"    {name:22s} {us:7.1f} µs  {programs} an SM  error {error:.1e}", flush=True)
    return found


def jit(args):
    rows = []
    for model, shape, tokens, (x, topk_ids, _), w13, w2 in served_cases(args.filter,
                                                                          args.tokens):
        hidden, inter, experts, k = shape
        order, offs = routed_slots(topk_ids, experts)
        xq, x_scale = quantized_rows(*x.shape)
        slots = order.numel()
        h, h_scale = quantized_rows(slots, inter)
        print(f"\n{model} T={tokens}", flush=True)
        up, up_const, up_out, up_tiles = up_args((shape, slots, offs), xq, x_scale, order, k,
                                                 w13)
        print("  up", flush=True)
        row = {"model": model, "T": tokens,
               "up": sweep(up_kernel, up_tiles, up, up_const, up_out, UP_TILES)}
        down, down_const, down_out, down_tiles = down_args((shape, h, h_scale, offs, w2))
        print("  down", flush=True)
        row["down"] = sweep(down_kernel, down_tiles, down, down_const, (down_out,),
                            DOWN_TILES)
        wheel = lambda: gg_runtime.scaled_grouped_mm(  # noqa: E731
            h, w2.values.transpose(1, 2), h_scale, w2.scales, offs, out_dtype=torch.bfloat16,
            use_fast_accum=True)
        row["down_wheel_us"] = 1e3 * time_ms(graphed(wheel))
        row["down_wheel_error"] = rel_error(wheel(), down_out)
        print(f"    wheel's {row['down_wheel_us']:7.1f} µs error {row['down_wheel_error']:.1e}")
        rows.append(row)
    return rows


def routed_variants(family: str) -> list:
    """The sm90 variants of `family` with the forward's output dtypes (each
    forced in turn: those whose axes do not fit the call refuse it)."""
    return [v["key"] for v in _C.variants() if v["family"] == family and v["arch"] == 90
            and v["out_dtype"] in ("float8_e4m3fn", "bfloat16")]


def forced_runs(args):
    rows = []
    for model, _, tokens, (x, topk_ids, topk_weights), w13, w2 in served_cases(
            args.filter, args.tokens, args.scales):
        def forward():
            return gg_runtime.moe_experts(x, topk_ids, topk_weights, w13, w2)
        reference = forward()
        row = {"model": model, "T": tokens, "dispatched": kernel_us(graphed(forward)),
               "forced": {}}
        print(f"\n{model} T={tokens}: dispatched {sum(row['dispatched'].values()):7.1f} µs",
              flush=True)
        for name, us in row["dispatched"].items():
            print(f"      {us:7.1f}  {name}")
        for family in args.families:
            for key in routed_variants(family):
                try:
                    with forced(key):
                        out = forward()
                        replay = graphed(forward)
                except (ValueError, RuntimeError):
                    continue  # not this call's axes, or its condition fails
                table = kernel_us(replay)
                row["forced"][key] = {"kernels": table, "error": rel_error(out, reference)}
                print(f"  {key.split('.')[0]} {key.split('.', 3)[3]:60s} total "
                      f"{sum(table.values()):7.1f} µs, error {row['forced'][key]['error']:.1e}")
                for name, us in list(table.items())[:2]:
                    print(f"      {us:7.1f}  {name}")
        rows.append(row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forced", action="store_true")
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=[64, 256])
    parser.add_argument("--scales", default="blockwise", help="--forced: the weights' scales "
                        "(bench/sections/fp8_experts.py SCALES' name)")
    parser.add_argument("--families", nargs="*", default=["scaled_ragged_glu", "scaled_ragged_m"],
                        help="--forced: the families whose variants are forced")
    parser.add_argument("--json")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = forced_runs(args) if args.forced else jit(args)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    with torch.no_grad():
        main()
