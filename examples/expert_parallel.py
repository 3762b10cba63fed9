"""Expert parallelism with gg_runtime: an MoE layer's experts spread over the
GPUs of one host with gg_runtime.moe.ExpertParallelExperts, checked against
the same experts on one GPU (gg_runtime.MoEExperts).

    torchrun --nproc-per-node 2 examples/expert_parallel.py

Each rank holds EXPERTS / world of the experts and routes its own tokens
(top-k over all the experts).  The layer sends each token to the ranks that
hold its experts and brings the outputs back, forward and backward, with no
host sync.  Prints one line per rank; exits non-zero on a mismatch.
"""
import os
import sys

import torch
import torch.distributed as dist

from gg_runtime import MoEExperts
from gg_runtime.moe import ExpertParallelExperts
from gg_runtime.testing import rel_error

HIDDEN, INTER, EXPERTS, TOP_K, TOKENS = 512, 256, 16, 4, 1000
TOLERANCE = 2e-2  # bf16 inputs and outputs, each rank's part rounded before the sum


def main() -> int:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)  # every rank makes the same experts and router
    factory = {"device": "cuda", "dtype": torch.bfloat16}
    everything = MoEExperts(EXPERTS, HIDDEN, INTER, **factory)
    router = torch.randn(HIDDEN, EXPERTS, device="cuda")
    layer = ExpertParallelExperts(EXPERTS, HIDDEN, INTER, max_tokens=TOKENS, **factory)
    mine = slice(rank * EXPERTS // world, (rank + 1) * EXPERTS // world)
    with torch.no_grad():  # this rank's share of the same experts
        layer.gate_up_proj.copy_(everything.gate_up_proj[mine])
        layer.down_proj.copy_(everything.down_proj[mine])

    torch.manual_seed(1 + rank)  # each rank its own tokens
    x = torch.randn(TOKENS, HIDDEN, **factory, requires_grad=True)
    weights, ids = torch.softmax(x.detach().float() @ router, dim=-1).topk(TOP_K, dim=-1)
    out = layer(x, ids, weights)
    out.backward(torch.ones_like(out))

    reference_x = x.detach().clone().requires_grad_()
    reference = everything(reference_x, ids, weights)
    reference.backward(torch.ones_like(reference))
    # The reference's expert gradients come from this rank's tokens only, the
    # layer's from every rank's: compare them once the reference's are summed.
    for weight in (everything.gate_up_proj, everything.down_proj):
        dist.all_reduce(weight.grad)
    errors = {"out": rel_error(out, reference), "x.grad": rel_error(x.grad, reference_x.grad),
              "gate_up_proj.grad": rel_error(layer.gate_up_proj.grad,
                                             everything.gate_up_proj.grad[mine]),
              "down_proj.grad": rel_error(layer.down_proj.grad, everything.down_proj.grad[mine])}
    ok = all(e <= TOLERANCE for e in errors.values())
    print(f"rank {rank}/{world}: {'ok' if ok else 'MISMATCH'} "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
