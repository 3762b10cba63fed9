"""Does compute-sanitizer's racecheck report the shared-memory handoffs that
every warp-specialised kernel of gg_runtime is made of, when they are written
the canonical way?  Three minimal Gluon kernels (sm90, JIT-compiled by the
GPU host's Triton), each correct by the PTX memory model:

- `tma_read`: TMA fills a buffer, completing an mbarrier's transaction
  count; the program's threads wait on the barrier, then read the buffer.
- `ring`: a loader warp and a consumer warpgroup (gl.warp_specialize) share
  a ring of buffers: the loader waits for a slot's `empty` barrier and has TMA
  fill it (`ready`); the consumer waits for `ready`, reads the slot, arrives
  on `empty`.  Over more blocks than slots, so slots are refilled.  The
  worker's registers set (setmaxnreg, 40).  `ring_plain_registers`: the
  same without setmaxnreg; `ring_stores`: the loader's threads fill the
  slots by stores (fence, the warp's barrier, one arrive) instead of TMA.
- `store_ring`: the consumer writes a staging buffer from its registers,
  fences (fence.proxy.async), has TMA store it, waits for the store's reads
  (store_wait) and writes the buffer again for the next block.

Each kernel checks its result; run it under the tool:

    compute-sanitizer --tool racecheck --racecheck-report all \
        python lab/racecheck_probe.py tma_read

A kernel with no race that still draws hazard reports shows the tool's model,
not the code, behind reports of the same handoff in gg_runtime's kernels
(docs/notes/2026-11-28-the-sanitizers-over-the-whole-suite.md).
"""
from __future__ import annotations

import inspect
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from aot.kernels.gluon_api import tma_load, tma_store

BM, BK = 64, 64
# warp_specialize's register counts: a required argument in Triton 3.6.
OPTIONAL_REGISTERS = inspect.signature(gl.warp_specialize).parameters["worker_num_regs"]

BLOCKS, STAGES = 8, 2


@gluon.constexpr_function
def tile_layout(warps):
    return gl.BlockedLayout([1, 8], [4, 8], [warps, 1], [1, 0])


@gluon.jit
def tile_offsets(BM: gl.constexpr, BK: gl.constexpr, layout: gl.constexpr):
    rows = gl.arange(0, BM, gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, gl.SliceLayout(0, layout))
    return gl.expand_dims(rows, 1) * BK + gl.expand_dims(cols, 0)


@gluon.jit
def tma_read_kernel(desc, out_ptr, BM: gl.constexpr, BK: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.bfloat16, [BM, BK], desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, BM * BK * 2)
    tma_load(desc, [0, 0], bar, buf)
    mbarrier.wait(bar, 0)
    layout: gl.constexpr = tile_layout(gl.num_warps())
    gl.store(out_ptr + tile_offsets(BM, BK, layout), buf.load(layout))
    mbarrier.invalidate(bar)


@gluon.jit
def ring_consumer(bufs, ready, empty, out_ptr, BM: gl.constexpr, BK: gl.constexpr,
                  BLOCKS: gl.constexpr, STAGES: gl.constexpr):
    layout: gl.constexpr = tile_layout(gl.num_warps())
    acc = gl.zeros([BM, BK], gl.float32, layout)
    for i in range(BLOCKS):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), i // STAGES & 1)
        acc += bufs.index(slot).load(layout).to(gl.float32)
        mbarrier.arrive(empty.index(slot))
    gl.store(out_ptr + tile_offsets(BM, BK, layout), acc)


@gluon.jit
def ring_loader(desc, bufs, ready, empty, BM: gl.constexpr, BK: gl.constexpr,
                BLOCKS: gl.constexpr, STAGES: gl.constexpr):
    for i in range(BLOCKS):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), (i // STAGES & 1) ^ 1)
        mbarrier.expect(ready.index(slot), BM * BK * 2)
        tma_load(desc, [i * BM, 0], ready.index(slot), bufs.index(slot))


@gluon.jit
def ring_storer(x_ptr, bufs, ready, empty, BM: gl.constexpr, BK: gl.constexpr,
                BLOCKS: gl.constexpr, STAGES: gl.constexpr):
    """ring_loader's work without TMA: the warp's threads copy each block
    through their registers, fence, synchronise, and one arrive completes
    `ready`."""
    layout: gl.constexpr = tile_layout(gl.num_warps())
    offsets = tile_offsets(BM, BK, layout)
    for i in range(BLOCKS):
        slot = i % STAGES
        mbarrier.wait(empty.index(slot), (i // STAGES & 1) ^ 1)
        bufs.index(slot).store(gl.load(x_ptr + i * BM * BK + offsets))
        fence_async_shared()
        # One thread arrives: the warp's barrier orders every lane's stores
        # before its arrive (without it the other lanes' stores race the
        # consumer's reads, and racecheck says so).
        gl.thread_barrier()
        mbarrier.arrive(ready.index(slot))


@gluon.jit
def ring_kernel(desc, x_ptr, out_ptr, BM: gl.constexpr, BK: gl.constexpr,
                BLOCKS: gl.constexpr, STAGES: gl.constexpr, BY_TMA: gl.constexpr,
                WORKER_REGISTERS: gl.constexpr):
    """The ring; the loader fills slots by TMA (BY_TMA) or by its threads'
    stores; WORKER_REGISTERS 0 (TMA only) leaves the worker's register count
    to the compiler (no setmaxnreg)."""
    bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BM, BK], desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    # Each branch spelled out: a partition list is a literal of warp_specialize's call.
    if not BY_TMA:
        gl.warp_specialize(
            [(ring_consumer, (bufs, ready, empty, out_ptr, BM, BK, BLOCKS, STAGES)),
             (ring_storer, (x_ptr, bufs, ready, empty, BM, BK, BLOCKS, STAGES))],
            [1], [WORKER_REGISTERS])
    elif WORKER_REGISTERS:
        gl.warp_specialize(
            [(ring_consumer, (bufs, ready, empty, out_ptr, BM, BK, BLOCKS, STAGES)),
             (ring_loader, (desc, bufs, ready, empty, BM, BK, BLOCKS, STAGES))],
            [1], [WORKER_REGISTERS])
    else:
        gl.warp_specialize(
            [(ring_consumer, (bufs, ready, empty, out_ptr, BM, BK, BLOCKS, STAGES)),
             (ring_loader, (desc, bufs, ready, empty, BM, BK, BLOCKS, STAGES))], [1])


@gluon.jit
def store_ring_kernel(x_ptr, desc, BM: gl.constexpr, BK: gl.constexpr, BLOCKS: gl.constexpr):
    buf = gl.allocate_shared_memory(gl.bfloat16, [BM, BK], desc.layout)
    layout: gl.constexpr = tile_layout(gl.num_warps())
    offsets = tile_offsets(BM, BK, layout)
    for i in range(BLOCKS):
        x = gl.load(x_ptr + i * BM * BK + offsets)
        buf.store(x * 2.0)
        fence_async_shared()
        tma_store(desc, [i * BM, 0], buf)
        tma.store_wait(0)


def descriptor(t: torch.Tensor) -> TensorDescriptor:
    layout = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    return TensorDescriptor.from_tensor(t, [BM, BK], layout)


def run(name: str) -> None:
    x = torch.randn(BLOCKS * BM, BK, device="cuda", dtype=torch.bfloat16)
    if name == "tma_read":
        out = torch.full((BM, BK), float("nan"), device="cuda", dtype=torch.bfloat16)
        tma_read_kernel[(1,)](descriptor(x), out, BM, BK, num_warps=4)
        want = x[:BM]
    elif name in RINGS:
        out = torch.full((BM, BK), float("nan"), device="cuda", dtype=torch.float32)
        by_tma, registers = RINGS[name]
        if not registers and OPTIONAL_REGISTERS.default is inspect.Parameter.empty:
            raise SystemExit(f"{name}: this Triton's warp_specialize takes register counts "
                             "only (3.6); leaving them out needs a later one")
        ring_kernel[(1,)](descriptor(x), x, out, BM, BK, BLOCKS, STAGES, by_tma, registers,
                          num_warps=4)
        want = x.float().view(BLOCKS, BM, BK).sum(0)
    elif name == "store_ring":
        out = torch.full_like(x, float("nan"))
        store_ring_kernel[(1,)](x, descriptor(out), BM, BK, BLOCKS, num_warps=4)
        want = x * 2
    else:
        raise SystemExit(f"unknown probe {name!r}: {', '.join(PROBES)}")
    torch.cuda.synchronize()
    error = (out.float() - want.float()).abs().max().item()
    print(f"{name}: max abs error {error:.3g}", "OK" if error < 1e-2 else "WRONG")


# The rings: (the loader fills slots by TMA, the worker's registers; 0: the
# compiler's, no setmaxnreg).
RINGS = {"ring": (True, 40), "ring_plain_registers": (True, 0), "ring_stores": (False, 40)}
PROBES = ("tma_read", *RINGS, "store_ring")

if __name__ == "__main__":
    for probe in sys.argv[1:] or PROBES:
        run(probe)
