"""What a process's first symmetric allocation costs under each of torch's
SymmetricMemory backends, and whether expert_parallel's transport runs on
it: the time of the first `symmetric_memory.empty` + `rendezvous` (and of a
second), peers' addresses and a barrier, then expert_parallel's first call
on a small layer, checked against the same call over NCCL's all-to-all.

    cd build && PYTHONPATH=WHEEL_SITE:.. torchrun --nproc-per-node 2 -m lab.symmetric_backends \
        [NCCL | NVSHMEM | default]
"""
from __future__ import annotations

import sys
import time

import torch
import torch.distributed as dist
from torch.distributed import _symmetric_memory as symmetric_memory

from bench.expert_parallel_worker import join_group


def wall_ms(fn):
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, out


def main():
    join_group()
    dist.all_reduce(torch.ones(1, device="cuda"))  # NCCL's communicator up, as in a model's run
    rank, world = dist.get_rank(), dist.get_world_size()
    backend = sys.argv[1] if len(sys.argv) > 1 else "default"
    if backend != "default":
        symmetric_memory.set_backend(backend)
    name = dist.group.WORLD.group_name

    def allocate():
        device = torch.device("cuda", torch.cuda.current_device())
        t = symmetric_memory.empty(1 << 24, dtype=torch.uint8, device=device)
        return t, symmetric_memory.rendezvous(t, name)

    first, (buffer, handle) = wall_ms(allocate)
    second, _ = wall_ms(allocate)
    if rank == 0:
        print(f"{backend}: first empty+rendezvous {first:.1f} ms, second {second:.1f} ms, "
              f"{len(handle.buffer_ptrs)} peers' addresses", flush=True)
    peer = (rank + 1) % world
    mine = torch.full((1024,), rank + 1, dtype=torch.int32, device="cuda")
    try:
        handle.get_buffer(peer, (1024,), torch.int32).copy_(mine)  # into the peer's buffer
        handle.barrier(channel=0, timeout_ms=60000)
        got = buffer.view(torch.int32)[:1024]
        landed = str(bool((got == (rank - 1) % world + 1).all()))
    except RuntimeError as error:
        landed = f"get_buffer refused ({error})"
    if rank == 0:
        print(f"{backend}: a peer's store through get_buffer landed: {landed}", flush=True)

    from gg_runtime.moe import expert_parallel
    tokens, hidden, inter, experts, k = 256, 1024, 512, 16, 4
    generator = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(tokens, hidden, device="cuda", generator=generator).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=generator).topk(k, -1).indices
    weights = torch.rand(tokens, k, device="cuda", generator=generator).softmax(-1)
    w13 = torch.randn(experts // world, 2 * inter, hidden, device="cuda").bfloat16() / 32
    w2 = torch.randn(experts // world, hidden, inter, device="cuda").bfloat16() / 32
    call_ms, out = wall_ms(lambda: expert_parallel(x, ids, weights, w13, w2))
    again_ms, _ = wall_ms(lambda: expert_parallel(x, ids, weights, w13, w2))
    over_nccl = expert_parallel(x, ids, weights, w13, w2, transport="nccl")
    error = ((out.float() - over_nccl.float()).norm() / over_nccl.float().norm()).item()
    if rank == 0:
        print(f"{backend}: expert_parallel's first call {call_ms:.1f} ms, second {again_ms:.1f} "
              f"ms, against the NCCL transport {error:.1e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
