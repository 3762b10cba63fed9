"""One rank of the expert_parallel bench section (bench/sections/
expert_parallel.py starts W of them with torch.distributed.run): times
gg_runtime.moe.expert_parallel on one layer shape beside the NCCL baseline
(host-synced all_to_all_single of each slot's row, moe_experts as the local
experts, each token's k outputs gathered and summed with its weights) and
the local experts alone (moe_experts on the rows this rank received, gathered, no
communication), and prints rank 0's rows as one JSON line:

    torchrun --nproc-per-node 4 -m bench.expert_parallel_worker dsv3 7168 2048 256 8

Ours is checked against the baseline's output first (a wrong result is
reported instead of the times).  Forward rows at `TOKENS` tokens a rank
(eager; expert_parallel and the experts alone also replayed from CUDA
graphs) and forward + backward; decode rows at `DECODE` tokens a rank,
replayed from graphs (the NCCL baseline eager: its splits go through the
host).  At TOKENS, the overlap: the tokens in CHUNKS chunks with the
transfers on TRANSPORT_SMS SMs, forward graphed and (at the middle SM
count) forward + backward.  Dispatch and return are timed alone, replayed from graphs.  On
sm90, the same layer with fp8 weights (128 x 128 blocks, the tokens sent in
fp8) at the decode sizes and at `TOKENS`, from graphs."""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.cuda import green_contexts
from torch.distributed.nn.functional import all_to_all_single

from gg_runtime import Quantized, quantize_fp8, sm_limit
from gg_runtime.formats import FP8_WEIGHT_SCALINGS, SQUARE_BLOCKS
from gg_runtime.moe import expert_parallel, moe_experts
from gg_runtime.moe import exchange
from gg_runtime.testing import rel_error

from . import measure

TOKENS = 4096
DECODE = (1, 32, 128)
# The overlap's settings tried at TOKENS: chunks, and the SMs the transfers fill.
CHUNKS = (2, 4)
TRANSPORT_SMS = (8, 16, 32)
TRANSFER_SMS = (8, 16, 24, 32, 64, 0)  # the SMs a lone transfer's kernels may fill; 0: all
REPS = 10
TOLERANCE = 1e-2  # each rank's part rounded to bfloat16 before the parts are summed
_GREEN_CONTEXTS = []  # on_sms' contexts, kept alive with their streams


def timed(fn, reps=REPS) -> float:
    """Median ms of fn() over reps calls, every rank in step, warmed up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for i in range(reps):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in zip(events, events[1:]))[reps // 2]


def first_call_ms(fn) -> float:
    """Wall-clock ms of fn's call, every rank in step before it: a
    configuration's first call (its layout agreed by the ranks, the buffer
    made where it must grow, the kernels loaded)."""
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def graphed(fn) -> float:
    """timed() of fn captured in a CUDA graph (ms), on the current stream
    unless that is the default stream (which cannot capture)."""
    stream = torch.cuda.current_stream()
    replay = measure.graphed(fn, None if stream == torch.cuda.default_stream() else stream)
    if replay is None:
        raise ValueError("the call could not be captured in a CUDA graph")
    return timed(replay)


def nccl_experts(x, topk_ids, topk_weights, w13, w2):
    """The baseline: each slot's row sent to its expert's rank by
    all_to_all_single with splits read back to the host, moe_experts on the
    rows received (k = 1), the outputs sent back, each token's k gathered and
    summed with its weights; differentiable (torch.distributed.nn)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    tokens, k = topk_ids.shape
    per_rank = w13.shape[0]
    owner = (topk_ids // per_rank).flatten()
    order = owner.argsort(stable=True)
    send = torch.bincount(owner, minlength=world)
    receive = torch.empty_like(send)
    dist.all_to_all_single(receive, send)
    send_splits, receive_splits = send.tolist(), receive.tolist()  # the host sync
    rows = all_to_all_single(x.new_empty(sum(receive_splits), x.shape[1]),
                             x[order // k], receive_splits, send_splits)
    ids = torch.empty(sum(receive_splits), dtype=topk_ids.dtype, device=x.device)
    dist.all_to_all_single(ids, topk_ids.flatten()[order], receive_splits, send_splits)
    ones = torch.ones(len(ids), 1, device=x.device)
    outputs = moe_experts(rows, (ids - rank * per_rank)[:, None], ones, w13, w2)
    back = all_to_all_single(x.new_empty(tokens * k, x.shape[1]), outputs, send_splits,
                             receive_splits)
    slots = back[order.argsort()].view(tokens, k, -1)
    return (slots.float() * topk_weights[..., None].float()).sum(1).to(x.dtype)


class Vdev2d:
    """The baseline on torch's NVSHMEM all-to-all (`torch.ops.symm_mem`):
    each slot's row, sorted by its expert's rank, its global id in the row's
    last words, sent by `all_to_all_vdev_2d` (splits on the GPU), moe_experts
    on what came (k = 1), the outputs sent back by
    `all_to_all_vdev_2d_offset`, each token's k gathered and summed with its
    weights.  No host sync; buffers sized for every slot of every rank
    landing on one rank.  One split a rank, not an expert: torch's op takes
    at most 16 experts a rank (DeepSeek-V3 and Qwen3 have 32-128 at EP2-8),
    and the experts sort their rows themselves."""

    ALIGN = 16  # each rank's rows start on a multiple of this
    ID_WORDS = 8  # the id's int32 bits in two bf16 words, the row padded to 16 bytes

    def __init__(self, tokens, hidden, k, experts, dtype):
        from torch.distributed import _symmetric_memory as symm_mem

        world, self.hidden = dist.get_world_size(), hidden
        self.per_rank = experts // world
        slots = tokens * k
        self.received = world * slots + world * self.ALIGN

        device = torch.device("cuda", torch.cuda.current_device())  # not "cuda": NVSHMEM's teams

        def symmetric(*shape, dtype=dtype):
            t = symm_mem.empty(*shape, dtype=dtype, device=device)
            symm_mem.rendezvous(t, dist.group.WORLD.group_name)
            return t

        width = hidden + self.ID_WORDS
        self.inp, self.out = symmetric(slots, width), symmetric(self.received, width)
        self.outputs, self.back = symmetric(self.received, hidden), symmetric(slots, hidden)
        self.in_splits = symmetric(world, dtype=torch.int64)
        self.out_splits_offsets = symmetric(2, world, dtype=torch.int64)
        self.back_splits_offsets = symmetric(2, world, dtype=torch.int64)
        self.rows = torch.arange(self.received, device=device)

    def dispatch(self, x, topk_ids):
        """The slots' rows and ids to their experts' ranks; each received
        row's local expert (-1 in the padding)."""
        slots, k = topk_ids.numel(), topk_ids.shape[1]
        expert = topk_ids.flatten()
        self.order = expert.argsort(stable=True)
        self.inp[:slots, :self.hidden].copy_(x[self.order // k])
        self.inp[:slots, self.hidden:self.hidden + 2].copy_(
            expert[self.order].int()[:, None].view(torch.bfloat16))
        self.in_splits.copy_(torch.bincount(expert // self.per_rank,
                                            minlength=dist.get_world_size()))
        torch.ops.symm_mem.all_to_all_vdev_2d(self.inp, self.out, self.in_splits,
                                              self.out_splits_offsets,
                                              dist.group.WORLD.group_name,
                                              major_align=self.ALIGN)
        splits, offsets = self.out_splits_offsets
        source = torch.searchsorted(offsets, self.rows, right=True) - 1
        landed = self.rows < offsets[source] + splits[source]
        ids = self.out[:, self.hidden:self.hidden + 2].contiguous().view(torch.int32)[:, 0]
        return torch.where(landed, ids - dist.get_rank() * self.per_rank, -1)

    def __call__(self, x, topk_ids, topk_weights, w13, w2):
        local = self.dispatch(x, topk_ids)
        ones = torch.ones(self.received, 1, device=x.device)
        self.outputs.copy_(moe_experts(self.out[:, :self.hidden], local[:, None], ones, w13, w2))
        torch.ops.symm_mem.all_to_all_vdev_2d_offset(self.outputs, self.back,
                                                     self.out_splits_offsets,
                                                     self.back_splits_offsets,
                                                     dist.group.WORLD.group_name)
        slots = torch.empty_like(self.back[:topk_ids.numel()])
        slots[self.order] = self.back[:topk_ids.numel()]
        slots = slots.view(*topk_ids.shape, -1)
        return (slots.float() * topk_weights[..., None].float()).sum(1).to(x.dtype)


def vdev_rows(hidden, inter, experts, k) -> dict:
    """The Vdev2d baseline at TOKENS and at DECODE tokens a rank, forward
    (eager, and graphed where it captures) and its dispatch alone (eager),
    checked against the NCCL baseline first; in a process of its own
    (NVSHMEM's backend)."""
    from torch.distributed import _symmetric_memory as symm_mem

    symm_mem.set_backend("NVSHMEM")
    rows = []
    for tokens in (*DECODE, TOKENS):
        x, ids, weights, w13, w2 = layer(hidden, inter, experts, k, tokens, 1)
        baseline = Vdev2d(tokens, hidden, k, experts, x.dtype)
        with torch.no_grad():
            error = torch.tensor(rel_error(baseline(x, ids, weights, w13, w2),
                                           nccl_experts(x, ids, weights, w13, w2)),
                                 device="cuda")
            dist.all_reduce(error, dist.ReduceOp.MAX)
            if error > TOLERANCE:
                raise ValueError(f"vdev_2d baseline: relative error {float(error):.2e} against "
                                 "the NCCL baseline")
            replay = measure.graphed(lambda: baseline(x, ids, weights, w13, w2))
            rows.append({"tokens": tokens, "error_vs_nccl": float(error),
                         "eager_ms": timed(lambda: baseline(x, ids, weights, w13, w2)),
                         "graphed_ms": timed(replay) if replay else None,
                         "dispatch_ms": timed(lambda: baseline.dispatch(x, ids))})
    return rows


def layer(hidden, inter, experts, k, tokens, seed):
    """This rank's tokens, routing and experts (bf16)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    generator = torch.Generator(device="cuda").manual_seed(seed * 1000 + rank)
    x = torch.randn(tokens, hidden, device="cuda", generator=generator).bfloat16()
    ids = torch.rand(tokens, experts, device="cuda", generator=generator).topk(k, -1).indices
    weights = torch.rand(tokens, k, device="cuda", generator=generator).softmax(-1)
    w13 = (torch.randn(experts // world, 2 * inter, hidden, device="cuda", generator=generator)
           * hidden ** -0.5).bfloat16()
    w2 = (torch.randn(experts // world, hidden, inter, device="cuda", generator=generator)
          * inter ** -0.5).bfloat16()
    return x, ids, weights, w13, w2


def transfers(x, ids, weights, w13, w2, max_tokens=None, experts_alone=True) -> dict:
    """Dispatch and return alone (ms, graphed), the rows this rank sent, and
    (where `experts_alone`) the experts alone on the rows it received, gathered (ms,
    graphed); with fp8 weights (w13 and w2 Quantized), the tokens sent
    quantized as the weights ask (per 128 columns for 128 x 128 blocks), as
    expert_parallel sends them."""
    fp8 = isinstance(w13, Quantized)
    granularity = FP8_WEIGHT_SCALINGS[w13.format].rows if fp8 else None
    layout, = exchange.layout_for(dist.group.WORLD, x, ids, w13.values if fp8 else w13,
                                  max_tokens, granularity=granularity)

    def dispatched(plan):
        if granularity is None:
            return plan.dispatch(x)
        rows, received, scales = plan.dispatch_quantized(x, granularity)
        return Quantized(rows, scales, granularity), received

    plan = exchange.Plan(layout, ids, weights)
    rows, received = dispatched(plan)
    came = (plan.local_ids >= 0).any(1)
    kept = Quantized(rows.values[came].clone(), rows.scales[came].clone(), granularity) \
        if fp8 else rows[came].clone()
    alone = (kept, plan.local_ids[came].clone(), received[came].clone())
    out = moe_experts(rows, plan.local_ids, received, w13, w2,
                      out=plan.home_rows(torch.bfloat16))  # as expert_parallel's experts write
    times = {"dispatch_ms": graphed(lambda: dispatched(exchange.Plan(layout, ids, weights))),
             "return_ms": graphed(lambda: plan.returned(out)),
             "rows_sent": int((plan.index >= 0).sum())}
    if not experts_alone:
        return times
    return {**times, "alone_ms": graphed(lambda: moe_experts(*alone, w13, w2)),
            "alone_inputs": alone}


def transfers_by_sms(x, ids, weights, w13, w2) -> list:
    """Dispatch and return alone (graphed), run on each count of TRANSFER_SMS
    SMs: their kernels' grids that share of the GPU's (gg_runtime.sm_limit)
    and every kernel of the transfer, torch's barriers too, on a stream of a
    CUDA green context of that many SMs (a grid alone may spread over every
    SM).  None where torch has no green contexts."""
    if not green_contexts.SUPPORTED:
        return None
    rows = []
    for sms in TRANSFER_SMS:
        stream = on_sms(sms) if sms else torch.cuda.current_stream()
        with sm_limit(sms), torch.cuda.stream(stream):
            rows.append({"sms": sms, **transfers(x, ids, weights, w13, w2, experts_alone=False)})
    return rows


def on_sms(sms: int) -> torch.cuda.Stream:
    """A stream whose kernels run on `sms` SMs of this rank's GPU alone."""
    context = green_contexts.GreenContext.create(num_sms=sms,
                                                    device_id=torch.cuda.current_device())
    _GREEN_CONTEXTS.append(context)
    return context.Stream()


def forward_rows(hidden, inter, experts, k) -> dict:
    x, ids, weights, w13, w2 = layer(hidden, inter, experts, k, TOKENS, 0)
    with torch.no_grad():
        first = first_call_ms(lambda: expert_parallel(x, ids, weights, w13, w2))
        error = torch.tensor(rel_error(expert_parallel(x, ids, weights, w13, w2),
                                       nccl_experts(x, ids, weights, w13, w2)), device="cuda")
        dist.all_reduce(error, dist.ReduceOp.MAX)  # every rank refuses a wrong result alike
        if error > TOLERANCE:
            raise ValueError(f"wrong result: relative error {float(error):.2e} against the "
                             "NCCL baseline")
        row = {"tokens": TOKENS, "error_vs_nccl": float(error), "first_ms": first,
               "ours_ms": timed(lambda: expert_parallel(x, ids, weights, w13, w2)),
               "ours_graphed_ms": graphed(lambda: expert_parallel(x, ids, weights, w13, w2)),
               "nccl_ms": timed(lambda: nccl_experts(x, ids, weights, w13, w2)),
               **transfers(x, ids, weights, w13, w2),
               "by_sms": transfers_by_sms(x, ids, weights, w13, w2)}
    rows, local_ids, received = row.pop("alone_inputs")
    leaves = [t.clone().requires_grad_() for t in (x, weights, w13, w2)]
    grad = torch.ones_like(x)

    def backward(function):
        def step():
            function(leaves[0], ids, leaves[1], leaves[2], leaves[3]).backward(grad)
        return step

    def alone():
        r, w = rows.clone().requires_grad_(), received.clone().requires_grad_()
        moe_experts(r, local_ids, w, leaves[2], leaves[3]).backward(torch.ones_like(r))

    def chunked(function, chunks, sms):
        return lambda *args: function(*args, chunks=chunks, transport_sms=sms)

    with torch.no_grad():
        row["overlap"] = [{"chunks": c, "transport_sms": sms,
                           "graphed_ms": graphed(lambda: chunked(expert_parallel, c, sms)(
                               x, ids, weights, w13, w2)),
                           "backward_ms": None} for c in CHUNKS for sms in TRANSPORT_SMS]
        row["overlap"] += [{"chunks": c, "transport": "nccl",
                            "graphed_ms": graphed(lambda: expert_parallel(
                                x, ids, weights, w13, w2, transport="nccl", chunks=c)),
                            "backward_ms": None} for c in (1, *CHUNKS)]
    for entry in row["overlap"]:
        if entry.get("transport_sms") == TRANSPORT_SMS[1]:
            entry["backward_ms"] = timed(backward(chunked(
                expert_parallel, entry["chunks"], entry["transport_sms"])), 5)
    row.update(ours_backward_ms=timed(backward(expert_parallel), 5),
               nccl_backward_ms=timed(backward(nccl_experts), 5),
               alone_backward_ms=timed(alone, 5))
    return row


def decode_row(hidden, inter, experts, k, tokens) -> dict:
    x, ids, weights, w13, w2 = layer(hidden, inter, experts, k, tokens, 1)
    with torch.no_grad():  # a buffer sized for the step, as a server sizes it
        row = {"tokens": tokens,
               "first_ms": first_call_ms(lambda: expert_parallel(x, ids, weights, w13, w2,
                                                                 max_tokens=tokens)),
               "ours_graphed_ms": graphed(lambda: expert_parallel(x, ids, weights, w13, w2,
                                                                  max_tokens=tokens)),
               "nccl_ms": timed(lambda: nccl_experts(x, ids, weights, w13, w2)),
               **transfers(x, ids, weights, w13, w2, max_tokens=tokens)}
    row.pop("alone_inputs")
    return row


def fp8_row(hidden, inter, experts, k, tokens) -> dict:
    """The layer with fp8 weights (128 x 128 blocks; the tokens travel in
    fp8), replayed from graphs: ours, dispatch, return, the experts alone."""
    x, ids, weights, w13, w2 = layer(hidden, inter, experts, k, tokens, 2)
    q13, q2 = quantize_fp8(w13, SQUARE_BLOCKS), quantize_fp8(w2, SQUARE_BLOCKS)
    with torch.no_grad():
        row = {"tokens": tokens,
               "ours_graphed_ms": graphed(lambda: expert_parallel(x, ids, weights, q13, q2,
                                                                  max_tokens=tokens)),
               **transfers(x, ids, weights, q13, q2, max_tokens=tokens)}
    row.pop("alone_inputs")
    return row


def join_group() -> None:
    """This torchrun process's GPU (LOCAL_RANK) made current and the NCCL
    process group of all the ranks started on it."""
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))


def main(argv) -> None:
    name, hidden, inter, experts, k = argv[0], *map(int, argv[1:5])
    join_group()
    result = {"layer": name, "shape": [hidden, inter, experts, k], "world": dist.get_world_size()}
    try:
        if argv[5:] == ["vdev"]:
            result["vdev"] = vdev_rows(hidden, inter, experts, k)
        else:
            result.update(forward=forward_rows(hidden, inter, experts, k),
                          decode=[decode_row(hidden, inter, experts, k, t) for t in DECODE])
            if torch.cuda.get_device_capability() == (9, 0):
                result["fp8"] = [fp8_row(hidden, inter, experts, k, t)
                                 for t in (*DECODE, TOKENS)]
    except (ValueError, RuntimeError) as error:  # a wrong result or a failed baseline: reported
        result["error"] = f"{type(error).__name__}: {error}"
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
