"""What limits expert parallelism's dispatch on few SMs: the send_rows kernel
(aot/kernels/send_rows.py) JIT-compiled by the GPU host's Triton at several
tile shapes and warp counts, on a fixed number of SMs' worth of programs,
moving every rank's tokens to the other ranks two ways:

- push (the dispatch's way): each rank stores its rows into the peers'
  symmetric buffers;
- pull (the return's way, reads over NVLink): each rank's rows wait in its
  own symmetric buffer, and each rank reads the peers' rows into its own;
- push+own: push, each row also stored into the rank's own buffer by the
  same kernel (the layer's dispatch, where a rank's own experts take a row),
  with --meta a second row set of that many words beside each row (the
  layer's metadata), stored in 16-byte vectors or, with --scalar-meta, a
  word at a time as the wheel's kernel stores it;
- push|copy: push, the rank's own copy made by torch's copy_ (a device to
  device cudaMemcpyAsync) on a second stream at the same time;
- copy: that copy alone.

A launch of P programs may spread over every SM of the GPU whatever P is;
with --green, each SM count's launches run on a stream of a CUDA green
context of that many SMs (torch.cuda.green_contexts), so the count is the
SMs they had.

Every rank moves T rows of H bf16 words to each peer at once; a row's
destination is a row of the peer's buffer (push) or of its own (pull).
NVLink GB/s each way: the bytes a rank sends (push) or reads (pull) across,
over the time of one launch (the mean of REPLAYS launches, the ranks started
together).  Each launch's rows are checked against the source.

    cd build && PYTHONPATH=..:WHEEL_SITE torchrun --nproc-per-node 2 -m lab.send_probe \
        [--tokens 4096] [--hidden 7168] [--sms 16,24,32] [--ways push,pull] \
        [--shapes 0,4] [--per-sm 4,8]
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import triton
from torch.distributed import _symmetric_memory as symmetric_memory

from aot.kernels.send_rows import send_rows_kernel
from bench.expert_parallel_worker import join_group, on_sms

# (BM rows, BN words, warps) a program: the wheel's (8, 256, 4), and taller,
# wider and more warps.
SHAPES = ((8, 256, 4), (16, 256, 8), (8, 512, 8), (32, 256, 8), (4, 1024, 8), (16, 512, 16),
          (16, 512, 8), (16, 1024, 16), (32, 512, 16))
PROGRAMS_AN_SM = (1, 2, 4, 8)
REPLAYS = 20


def launch(rows, peers, ranks, dest, shape, programs, second=None, kernel=send_rows_kernel):
    """One launch; `second`: (rows2, peers2), a row set that goes where rows go."""
    bm, bn, warps = shape
    R, H = rows.shape
    rows2, peers2 = second if second is not None else (rows, peers)
    return kernel[(programs,)](rows, peers, ranks, dest, R, H, dest.shape[1], 1, rows2, peers2,
                               rows2.shape[1] if second is not None else 0, rows, peers, 0,
                               USE_TMA=False, BM=bm, BN=bn, BK=16, CHUNK=0, PRECISION=0,
                               num_warps=warps, num_stages=1)


# The kernel with H2 (the second row set's width) not specialized: its
# stores scalar whatever the width, as the wheel's are (H2 is not part of
# the aligned flavour's rule).
SCALAR_SECOND = triton.jit(send_rows_kernel.fn, do_not_specialize=["H2"])


def timed_ms(fn, repeats: int) -> float:
    """The median over `repeats` of the mean time of REPLAYS launches."""
    fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / REPLAYS)
    return sorted(times)[len(times) // 2]


def resident(rows, table, ranks, dest, shape) -> int:
    """The programs of `shape` an SM holds at once, by its registers and threads
    (the wheel's grid is the SMs' share of that)."""
    kernel = launch(rows, table, ranks, dest, shape, 1)
    threads = 32 * shape[2]
    registers = -(-kernel.n_regs * 32 // 256) * 256 * shape[2]  # allocated a warp at a time
    return min(2048 // threads, 65536 // registers, 32)


def in_stream(fn, stream):
    """fn() issued on `stream`, ordered after the current stream's work and
    before what the current stream does next."""
    def run():
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            fn()
        current.wait_stream(stream)
    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=7168)
    parser.add_argument("--sms", default="16,24,32")
    parser.add_argument("--ways", default="push,pull",
                        help="of push, pull, push+own, push|copy, copy")
    parser.add_argument("--shapes", default=",".join(map(str, range(len(SHAPES)))),
                        help="indices into SHAPES")
    parser.add_argument("--green", action="store_true",
                        help="run each SM count's launches in a green context of that many SMs")
    parser.add_argument("--per-sm", default=",".join(map(str, PROGRAMS_AN_SM)),
                        help="programs an SM (0: as many as an SM holds, the wheel's grid)")
    parser.add_argument("--meta", type=int, default=0,
                        help="words of a second row set (the layer's metadata) sent with "
                             "push+own's rows")
    parser.add_argument("--scalar-meta", action="store_true",
                        help="the second row set's width not specialized (scalar stores)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="timings a launch, the median reported")
    args = parser.parse_args()
    join_group()
    world, rank = dist.get_world_size(), dist.get_rank()
    T, H = args.tokens, args.hidden
    # Rows [W * T, H]: block s the rows rank s sent (push) or the rows it
    # waits to be read (pull: this rank's own block).
    buffer = symmetric_memory.empty(world * T * H, dtype=torch.bfloat16, device="cuda")
    handle = symmetric_memory.rendezvous(buffer, dist.group.WORLD.group_name)
    table = torch.tensor(handle.buffer_ptrs, dtype=torch.int64, device="cuda")
    mine = buffer.view(world, T, H)
    x = torch.randn(T, H, device="cuda").bfloat16()
    mine[rank].copy_(x)
    others = [r for r in range(world) if r != rank]
    tokens = torch.arange(T, device="cuda")
    # push: row t to row rank * T + t of every other rank
    push_ranks = torch.tensor(others, dtype=torch.int32, device="cuda").expand(T, -1).contiguous()
    push_dest = (rank * T + tokens)[:, None].expand(T, len(others)).contiguous()
    # pull: peer p's row t (read from its buffer) to row p * T + t of this rank's
    pulled = [handle.get_buffer(p, (world, T, H), torch.bfloat16)[p] for p in others]
    self_rank = torch.full((T, 1), rank, dtype=torch.int32, device="cuda")
    pull_dest = [(p * T + tokens)[:, None].contiguous() for p in others]
    sms_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    # push+own: this rank first, then the others, each row to row rank * T + t.
    own_ranks = torch.tensor([rank, *others], dtype=torch.int32,
                             device="cuda").expand(T, -1).contiguous()
    own_dest = (rank * T + tokens)[:, None].expand(T, world).contiguous()
    own_copy = torch.empty_like(x)
    side = torch.cuda.Stream()

    def push(shape, programs):
        return lambda: launch(x, table, push_ranks, push_dest, shape, programs)

    second = None
    if args.meta:
        meta_buffer = symmetric_memory.empty(world * T * args.meta, dtype=torch.bfloat16,
                                             device="cuda")
        meta_handle = symmetric_memory.rendezvous(meta_buffer, dist.group.WORLD.group_name)
        second = (torch.randn(T, args.meta, device="cuda").bfloat16(),
                  torch.tensor(meta_handle.buffer_ptrs, dtype=torch.int64, device="cuda"))
    kernel = SCALAR_SECOND if args.scalar_meta else send_rows_kernel

    def push_own(shape, programs):
        return lambda: launch(x, table, own_ranks, own_dest, shape, programs, second, kernel)

    def push_copy(shape, programs):
        def run():
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                own_copy.copy_(x)
            launch(x, table, push_ranks, push_dest, shape, programs)
            torch.cuda.current_stream().wait_stream(side)
        return run

    def copy(shape, programs):
        return lambda: own_copy.copy_(x)

    def pull(shape, programs):
        return lambda: [launch(src, table, self_rank, dest, shape, programs)
                        for src, dest in zip(pulled, pull_dest)]

    across = T * H * 2 * len(others)  # bytes each way a launch
    for sms in map(int, args.sms.split(",")):
        stream = on_sms(sms) if args.green else torch.cuda.current_stream()
        ways = {"push": push, "pull": pull, "push+own": push_own, "push|copy": push_copy,
                "copy": copy}
        for way in args.ways.split(","):
            make = ways[way]
            for shape in (SHAPES[int(i)] for i in args.shapes.split(",")):
                for per_sm in map(int, args.per_sm.split(",")):
                    per_sm = per_sm or resident(x, table, push_ranks, push_dest, shape)
                    programs = min(sms * per_sm, sms_count * per_sm)
                    fn = in_stream(make(shape, programs), stream)
                    try:
                        ms = timed_ms(fn, args.repeats)
                    except Exception as error:  # a shape this Triton or GPU refuses
                        if rank == 0:
                            print(f"{way} {shape} x{per_sm} on {sms} SMs: {error}", flush=True)
                        continue
                    torch.cuda.synchronize()
                    dist.barrier()
                    got = mine[others[0]] if way == "pull" else None
                    ok = True if got is None else bool(torch.equal(got, pulled[0]))
                    if rank == 0:
                        print(f"{sms:3d} SMs {way} BM {shape[0]:2d} BN {shape[1]:4d} "
                              f"warps {shape[2]:2d} x{per_sm}: {1e3 * ms:7.1f} us, "
                              f"{across / ms / 1e6:6.1f} GB/s{'' if ok else ' WRONG'}",
                              flush=True)
    # push's rows checked once, after every launch: each rank holds the others' x.
    torch.cuda.synchronize()
    dist.barrier()
    sent = torch.stack([torch.tensor(float(torch.equal(mine[p], handle.get_buffer(
        p, (world, T, H), torch.bfloat16)[p])), device="cuda") for p in others])
    if rank == 0:
        print(f"push rows equal to their source: {bool(sent.all())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
