"""Where the warp-specialised fp8 decode kernel's time goes at a token or two
(aot/kernels/experts_decode_ws.py, scaled_experts_decode's `few_units`
kernel), alone, JIT-compiled by the host's Triton (each version a compile of
its own: TRITON_ALWAYS_COMPILE), replayed from a CUDA graph with the L2
flushed, on the vllm_fp8 section's shapes (128 x 128 blocks, bf16 tokens,
random routing):

- `wheel`: the kernel as it is;
- `no_scale_loads`: every weight scale 1, none loaded (its output is wrong:
  a bound on what the MMA partition's per-step scale loads cost, each a
  global load whose value the step's scaling waits for);
- `batched` (`batched_up`: the up projection only): each ring slot's two
  128-deep blocks at once (their scales loaded before the slot's wait, both
  token blocks quantized, all MMAs issued, one wait), where the wheel's
  kernel waits for each block's MMAs in turn.

    cd build && TRITON_ALWAYS_COMPILE=1 PYTHONPATH=<wheel>:.. \
        python -m lab.decode_ws_probe [--filter NAME] [--tokens T ...]
"""
from __future__ import annotations

import argparse

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier,
                                                               warpgroup_mma, warpgroup_mma_wait)

import aot.kernels.experts_decode_ws as ws
from aot.families.scaled_experts_decode import CONFIGS
from aot.kernels.glu import CONCATENATED
from aot.kernels.loader_ws import gather_layout
from aot.kernels.scaled import BLOCKWISE, SCALE_BLOCK
from bench.measure import graphed
from gg_runtime.testing import rel_error
from gg_runtime.testing.timing import time_ms
from lab.decode_split_probe import SHAPES, make_case


@gluon.jit
def up_projection_unscaled(boxes, x_bufs, xq_bufs, ready, empty, count, w_scales, j_ok, H,
                           SCALING: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                           acc_layout: gl.constexpr):
    """ws.up_projection (BLOCKWISE) with every weight scale 1, none loaded."""
    BM: gl.constexpr = x_bufs.shape[1]
    UNIT: gl.constexpr = boxes.shape[1]
    SUB: gl.constexpr = BK // SCALE_BLOCK
    x_layout: gl.constexpr = gather_layout(BM, SCALE_BLOCK, gl.num_warps(), x_bufs.dtype)
    gate = gl.zeros([UNIT, BM], gl.float32, acc_layout)
    up = gl.zeros([UNIT, BM], gl.float32, acc_layout)
    for _k0 in range(0, H, BK):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        fence_async_shared()
        for sub in gl.static_range(SUB):
            x_scale = ws.quantized_x(x_bufs.index(slot * SUB + sub), xq_bufs.index(sub), x_layout)
            fence_async_shared()
            x = xq_bufs.index(sub).permute((1, 0))
            gate_step = warpgroup_mma(boxes.index(2 * slot * SUB + sub), x, gate, use_acc=False,
                                      is_async=True)
            up_step = warpgroup_mma(boxes.index((2 * slot + 1) * SUB + sub), x, up,
                                    use_acc=False, is_async=True)
            gate_step, up_step = warpgroup_mma_wait(0, deps=(gate_step, up_step))
            x_scale = gl.expand_dims(gl.convert_layout(x_scale, gl.SliceLayout(0, acc_layout)), 0)
            gate += gate_step * x_scale
            up += up_step * x_scale
        mbarrier.arrive(empty.index(slot))
        count += 1
    return gate, up, count


@gluon.jit
def down_projection_unscaled(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, b2, h_scale,
                             parts, row_ok, g, column, chunks, H, SCALING: gl.constexpr,
                             BOXES: gl.constexpr, STAGES: gl.constexpr,
                             acc_layout: gl.constexpr):
    """ws.down_projection (no b2) with every weight scale 1, none loaded."""
    BN: gl.constexpr = w2_boxes.shape[1]
    BM: gl.constexpr = h_buf.shape[1]
    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    column_scale = gl.expand_dims(h_scale, 0)
    for n0 in range(0, H, BN * BOXES):
        slot = count % STAGES
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        for part in gl.static_range(BOXES):
            ns = n0 + part * BN + gl.arange(0, BN, gl.SliceLayout(1, acc_layout))
            acc = warpgroup_mma(w2_boxes.index(slot * BOXES + part), h_buf, acc, use_acc=False,
                                is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc, ))
            gl.store(parts + gl.expand_dims(ns, 1), acc * column_scale,
                     mask=gl.expand_dims(ns < H, 1) & gl.expand_dims(row_ok, 0))
        mbarrier.arrive(empty.index(slot))
        count += 1
    return count


@gluon.jit
def up_projection_batched(boxes, x_bufs, xq_bufs, ready, empty, count, w_scales, j_ok, H,
                          SCALING: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr,
                          acc_layout: gl.constexpr):
    """ws.up_projection (BLOCKWISE, BK 256) with a slot's two blocks batched:
    their four scale loads issued before the slot's wait, both token blocks
    quantized, the four MMAs issued, then one wait (the wheel's kernel waits
    for each block's two in turn)."""
    gl.static_assert(BK == 2 * SCALE_BLOCK, "two blocks a slot")
    BM: gl.constexpr = x_bufs.shape[1]
    UNIT: gl.constexpr = boxes.shape[1]
    x_layout: gl.constexpr = gather_layout(BM, SCALE_BLOCK, gl.num_warps(), x_bufs.dtype)
    columns: gl.constexpr = gl.SliceLayout(0, acc_layout)
    gate = gl.zeros([UNIT, BM], gl.float32, acc_layout)
    up = gl.zeros([UNIT, BM], gl.float32, acc_layout)
    for k0 in range(0, H, BK):
        slot = count % STAGES
        block = k0 // SCALE_BLOCK
        first_ok = j_ok & (block * SCALE_BLOCK < H)
        second_ok = j_ok & ((block + 1) * SCALE_BLOCK < H)
        gate_scale0 = gl.expand_dims(gl.load(w_scales[0] + block, mask=first_ok, other=0.0), 1)
        up_scale0 = gl.expand_dims(gl.load(w_scales[1] + block, mask=first_ok, other=0.0), 1)
        gate_scale1 = gl.expand_dims(gl.load(w_scales[0] + block + 1, mask=second_ok,
                                             other=0.0), 1)
        up_scale1 = gl.expand_dims(gl.load(w_scales[1] + block + 1, mask=second_ok, other=0.0),
                                   1)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        fence_async_shared()
        x_scale0 = ws.quantized_x(x_bufs.index(slot * 2), xq_bufs.index(0), x_layout)
        x_scale1 = ws.quantized_x(x_bufs.index(slot * 2 + 1), xq_bufs.index(1), x_layout)
        fence_async_shared()
        x0 = xq_bufs.index(0).permute((1, 0))
        x1 = xq_bufs.index(1).permute((1, 0))
        gate0 = warpgroup_mma(boxes.index(4 * slot), x0, gate, use_acc=False, is_async=True)
        up0 = warpgroup_mma(boxes.index(4 * slot + 2), x0, up, use_acc=False, is_async=True)
        gate1 = warpgroup_mma(boxes.index(4 * slot + 1), x1, gate, use_acc=False, is_async=True)
        up1 = warpgroup_mma(boxes.index(4 * slot + 3), x1, up, use_acc=False, is_async=True)
        gate0, up0, gate1, up1 = warpgroup_mma_wait(0, deps=(gate0, up0, gate1, up1))
        x_scale0 = gl.expand_dims(gl.convert_layout(x_scale0, columns), 0)
        x_scale1 = gl.expand_dims(gl.convert_layout(x_scale1, columns), 0)
        gate += gate0 * x_scale0 * gate_scale0 + gate1 * x_scale1 * gate_scale1
        up += up0 * x_scale0 * up_scale0 + up1 * x_scale1 * up_scale1
        mbarrier.arrive(empty.index(slot))
        count += 1
    return gate, up, count


@gluon.jit
def down_projection_batched(w2_boxes, h_buf, ready, empty, count, w2_scale_ptr, b2, h_scale,
                            parts, row_ok, g, column, chunks, H, SCALING: gl.constexpr,
                            BOXES: gl.constexpr, STAGES: gl.constexpr,
                            acc_layout: gl.constexpr):
    """ws.down_projection (BLOCKWISE, no b2, two boxes a slot) batched: both
    boxes' scales loaded before the slot's wait, both MMAs issued, one wait."""
    gl.static_assert(BOXES == 2, "two boxes a slot")
    BN: gl.constexpr = w2_boxes.shape[1]
    BM: gl.constexpr = h_buf.shape[1]
    g64 = g.to(gl.int64)
    acc = gl.zeros([BN, BM], gl.float32, acc_layout)
    column_scale = gl.expand_dims(h_scale, 0)
    h_blocks = (H + SCALE_BLOCK - 1) // SCALE_BLOCK
    rows = gl.arange(0, BN, gl.SliceLayout(1, acc_layout))
    for n0 in range(0, H, 2 * BN):
        slot = count % STAGES
        ns0 = n0 + rows
        ns1 = n0 + BN + rows
        scale0 = gl.load(w2_scale_ptr + (g64 * h_blocks + ns0 // SCALE_BLOCK) * chunks + column,
                         mask=ns0 < H, other=0.0)
        scale1 = gl.load(w2_scale_ptr + (g64 * h_blocks + ns1 // SCALE_BLOCK) * chunks + column,
                         mask=ns1 < H, other=0.0)
        mbarrier.wait(ready.index(slot), count // STAGES & 1)
        part0 = warpgroup_mma(w2_boxes.index(2 * slot), h_buf, acc, use_acc=False,
                              is_async=True)
        part1 = warpgroup_mma(w2_boxes.index(2 * slot + 1), h_buf, acc, use_acc=False,
                              is_async=True)
        part0, part1 = warpgroup_mma_wait(0, deps=(part0, part1))
        gl.store(parts + gl.expand_dims(ns0, 1),
                 part0 * column_scale * gl.expand_dims(scale0, 1),
                 mask=gl.expand_dims(ns0 < H, 1) & gl.expand_dims(row_ok, 0))
        gl.store(parts + gl.expand_dims(ns1, 1),
                 part1 * column_scale * gl.expand_dims(scale1, 1),
                 mask=gl.expand_dims(ns1 < H, 1) & gl.expand_dims(row_ok, 0))
        mbarrier.arrive(empty.index(slot))
        count += 1
    return count


# name -> {module function: its replacement}
VERSIONS = {"wheel": {},
            "no_scale_loads": {"up_projection": up_projection_unscaled,
                               "down_projection": down_projection_unscaled},
            "batched": {"up_projection": up_projection_batched,
                        "down_projection": down_projection_batched},
            "batched_up": {"up_projection": up_projection_batched}}
ORIGINALS = {name: getattr(ws, name) for name in ("up_projection", "down_projection")}
(FEW_UNITS,) = [c for c in CONFIGS if c.ws]  # the warp-specialised kernel's config


def launcher(kernel, case):
    """fn() running the decode kernel at the family's few-unit config on
    case's call; the parts it writes."""
    w13, w2, ids = case["w13"], case["w2"], case["topk_ids"]
    experts, n, hidden = w13.values.shape
    slots, k = ids.numel(), ids.shape[1]
    parts = torch.empty(slots, triton.cdiv(n // 2, SCALE_BLOCK), hidden, device="cuda")
    units = (triton.cdiv(slots, FEW_UNITS.BM) + min(slots, experts)) * triton.cdiv(n, FEW_UNITS.BN)
    grid = (min(units, torch.cuda.get_device_properties(0).multi_processor_count),)
    flat_ids = ids.flatten().contiguous()
    bias = torch.empty(1, dtype=torch.bfloat16, device="cuda")
    args = (case["x"], w13.values, w13.scales, flat_ids, k, w13.values, w13.scales, w2.values,
            w2.scales, bias, 0, bias, 0, 0, parts, slots, hidden, n, experts,
            w13.values.stride(0), w13.values.stride(1), w2.values.stride(0), w2.values.stride(1))
    options = dict(SCALING=BLOCKWISE, GLU=CONCATENATED, USE_TMA=True, BM=FEW_UNITS.BM,
                   BN=FEW_UNITS.BN, BK=FEW_UNITS.BK, CHUNK=64, PRECISION="bf16",
                   STAGES=FEW_UNITS.num_stages, num_warps=FEW_UNITS.num_warps)
    return (lambda: kernel[grid](*args, **options)), parts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="qwen3")
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--versions", nargs="*", default=list(VERSIONS), choices=list(VERSIONS))
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    for name, shape in SHAPES.items():
        if args.filter not in name:
            continue
        for tokens in args.tokens:
            torch.manual_seed(tokens)
            case = make_case(*shape, tokens)
            found = {}
            for version in args.versions:
                for function, original in ORIGINALS.items():
                    setattr(ws, function, VERSIONS[version].get(function, original))
                kernel = gluon.jit(ws.scaled_experts_decode_ws_kernel.fn)
                fn, parts = launcher(kernel, case)
                fn()
                found[version] = (parts.sum(1).clone(), 1e3 * time_ms(graphed(fn)))
            for function, original in ORIGINALS.items():
                setattr(ws, function, original)
            first = next(iter(found.values()))[0]
            print(f"{name} T={tokens}: " + ", ".join(
                f"{label} {us:.1f} µs (vs the first {rel_error(out, first):.0e})"
                for label, (out, us) in found.items()), flush=True)


if __name__ == "__main__":
    with torch.no_grad():
        main()
