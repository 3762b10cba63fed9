"""Expert parallelism with gg_runtime: an MoE layer whose experts are spread
over the GPUs of a torch.distributed (NCCL) group, checked against the same
layer on one GPU.

    torchrun --nproc-per-node 2 examples/expert_parallel.py

Each rank holds experts/world of the experts and its own tokens.  Forward:
route (top-1), sort the tokens by expert, send each to the rank that owns its
expert (all-to-all), one grouped_mm over the rank's experts with device
offsets, send the results back, undo the sort, scale by the gate.  Backward
runs through the same all-to-alls (torch.distributed.nn) and grouped_mm's
autograd.  The check: outputs, token gradients and expert-weight gradients
equal those of the single-GPU layer (all experts on every rank, weight
gradients summed over ranks) within bf16 tolerance.  Prints one line per rank
and exits non-zero on a mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.nn.functional import all_to_all_single

import gg_runtime
from gg_runtime.testing import rel_error

DIM, HIDDEN, EXPERTS, TOKENS = 256, 512, 8, 1000
TOLERANCE = 2e-2  # bf16 inputs and outputs, gradients through two products


def route(x, router):
    """(gate [T], expert [T]) of top-1 routing."""
    probs = torch.softmax(x.float() @ router, dim=-1)
    gate, expert = probs.max(dim=-1)
    return gate.to(x.dtype), expert


def moe_one_gpu(x, weights, router):
    """The layer with every expert here: y = gate * x @ weights[expert]^T."""
    gate, expert = route(x, router)
    order = expert.argsort()
    offs = torch.bincount(expert, minlength=weights.shape[0]).cumsum(0).to(torch.int32)
    y = gg_runtime.grouped_mm(x[order], weights.transpose(1, 2), offs)
    return torch.empty_like(y).index_copy(0, order, y) * gate[:, None]


def moe_expert_parallel(x, local_weights, router, group):
    """The same layer with this rank's experts local_weights [experts / world, N, K]."""
    world = dist.get_world_size(group)
    local = local_weights.shape[0]
    gate, expert = route(x, router)
    order = expert.argsort()
    counts = torch.bincount(expert, minlength=local * world)  # per expert, sorted order
    # How many tokens go to each rank, and how many come from each: all-to-all sizes are host ints.
    send = counts.view(world, local).sum(1)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)  # counts from each rank
    recv_counts = recv_counts.view(world, local)
    send_sizes, recv_sizes = send.tolist(), recv_counts.sum(1).tolist()
    received = all_to_all_single(x.new_empty(sum(recv_sizes), x.shape[1]), x[order],
                                 recv_sizes, send_sizes, group=group)
    # Received rows are grouped by source rank, then expert: regroup them by expert.
    local_expert = torch.repeat_interleave(
        torch.arange(local, device=x.device).repeat(world), recv_counts.flatten())
    by_expert = local_expert.argsort(stable=True)
    offs = recv_counts.sum(0).cumsum(0).to(torch.int32)
    y = gg_runtime.grouped_mm(received[by_expert], local_weights.transpose(1, 2), offs)
    y = torch.empty_like(y).index_copy(0, by_expert, y)
    back = all_to_all_single(y.new_empty(x.shape[0], y.shape[1]), y, send_sizes, recv_sizes,
                             group=group)
    return torch.empty_like(back).index_copy(0, order, back) * gate[:, None]


def main() -> int:
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)  # the same experts and router on every rank
    weights = (torch.randn(EXPERTS, HIDDEN, DIM, device="cuda") * DIM ** -0.5).to(torch.bfloat16)
    router = torch.randn(DIM, EXPERTS, device="cuda")
    torch.manual_seed(1 + rank)  # this rank's tokens
    x = torch.randn(TOKENS + 37 * rank, DIM, device="cuda").to(torch.bfloat16)
    local = EXPERTS // world

    x_ep = x.clone().requires_grad_()
    w_ep = weights[rank * local:(rank + 1) * local].clone().requires_grad_()
    y_ep = moe_expert_parallel(x_ep, w_ep, router, dist.group.WORLD)
    grad = torch.randn_like(y_ep)
    y_ep.backward(grad)

    x_ref = x.clone().requires_grad_()
    w_ref = weights.clone().requires_grad_()
    y_ref = moe_one_gpu(x_ref, w_ref, router)
    y_ref.backward(grad)
    w_grad = w_ref.grad.float()
    dist.all_reduce(w_grad)  # every rank's tokens reach every expert's gradient

    errors = {"out": rel_error(y_ep, y_ref.float()),
              "grad_x": rel_error(x_ep.grad, x_ref.grad.float()),
              "grad_w": rel_error(w_ep.grad, w_grad[rank * local:(rank + 1) * local])}
    ok = all(e < TOLERANCE for e in errors.values())
    print(f"rank {rank}/{world}: {'ok' if ok else 'MISMATCH'} "
          + " ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
