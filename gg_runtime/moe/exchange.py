"""Expert parallelism's exchange between the ranks: the group's buffer laid
out for a configuration (its sizes agreed by every rank on its first call),
and one call's Plan, all on the GPU: where each token goes and its row
there, the transfer out (the tokens, 16-bit or quantized, and their
metadata) and the sums back (each token's outputs, written by the ranks
that made them into their `home` regions and summed by the token's rank
from there), and both ways again for the backward (Dispatch and Return, the
autograd).  The tokens and the outputs have regions of their own, and each
call reads what a transfer brought before the next one starts: so no
transfer waits for the ranks to finish reading (transport.Buffer)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .._native import OPS, call
from ..formats import ROWWISE
from .transport import TRANSPORTS, Buffer, Region, aligned_bytes, words

# One buffer a group (by name) and transport, grown when a call needs more.
_BUFFERS: dict[tuple, Buffer] = {}
# The layouts whose sizes every rank of the group has agreed on.
_LAYOUTS: dict[tuple, Layout] = {}
# What the ranks must agree on, in the order they are compared.
AGREED = ("experts per rank", "hidden size", "k", "max_tokens", "element size",
          "token scales", "chunks")


@dataclass
class Layout:
    """One configuration's sizes and its regions of the group's buffer (one
    chunk's, where the tokens go in chunks), each W blocks of `capacity`
    rows, row t of block s rank s's token t (where sent).  Out to the
    experts' ranks: `rows` (rows of H words: tokens, the output's
    gradients) and `meta` (rows of 2k int32: a token's global ids and its
    weights' bits); with fp8 dispatch (`token_scales` float32 scales a
    token), `fp8_rows` (the rows region's bytes as rows of H fp8 values) and
    `scales`.  Back home: `home` (rows of H words: outputs, the tokens'
    gradients) and `home_weights` (rows of k float32: the weights'
    gradients)."""
    world: int
    rank: int
    experts_per_rank: int
    capacity: int  # max_tokens / chunks
    k: int
    buffer: Buffer
    rows: Region
    meta: Region
    home: Region
    home_weights: Region
    token_scales: int = 0
    scales: Region | None = None

    def __post_init__(self):
        """The index tensors every call reads, made once (fewer launches a call)."""
        device = self.buffer.tensor.device
        # Token t's rows go to ranks 0 .. W - 1 (Plan.dest: where to, if at all).
        self.ranks = torch.arange(self.world, dtype=torch.int32,
                                  device=device).expand(self.capacity, self.world).contiguous()
        self.fp8_rows = Region(self.buffer, self.rows.offset, self.planes,
                               self.rows.local.shape[1] // 2, 0)

    @property
    def planes(self) -> int:
        return self.world * self.capacity


def layout_for(group, x, topk_ids, w13, max_tokens, transport="symmetric_memory",
               granularity=None, chunks=1) -> list[Layout]:
    """This configuration's Layouts, one a chunk of the tokens (each with its
    own regions of the buffer, holding max_tokens / chunks tokens a rank),
    agreed by every rank on its first call (max_tokens None: the group's
    largest T of that call; granularity: the tokens' quantization for fp8
    dispatch, None for 16-bit)."""
    if not isinstance(w13, torch.Tensor) or w13.dim() != 3 or w13.shape[0] < 1:
        raise ValueError("w13 must be [E/W, 2I, H]: this rank's experts")
    agreed = (w13.shape[0], x.shape[1], topk_ids.shape[1], max_tokens or 0, x.element_size(),
              token_scales(x.shape[1], granularity), chunks)
    key = (group.group_name, transport, agreed)
    if key not in _LAYOUTS:
        largest = _agree(group, agreed, x.shape[0], x.device)
        capacity = -(-(max_tokens or max(largest, 1)) // chunks)
        _LAYOUTS[key] = _new_layouts(group, transport, *agreed[:3], capacity, agreed[5], chunks,
                                     x.device)
    lanes = _LAYOUTS[key]
    if x.shape[0] > chunks * lanes[0].capacity:
        raise ValueError(f"x has {x.shape[0]} tokens, more than the {chunks * lanes[0].capacity} "
                         "a rank's share of the buffer holds (the largest T of the first call, "
                         "without max_tokens): pass max_tokens, the same on every rank")
    return lanes


def _agree(group, agreed, tokens, device) -> int:
    """Every rank's `agreed` the same, or a ValueError on every rank; the
    largest rank's `tokens` (one host sync, on a configuration's first call)."""
    mine = torch.tensor((*agreed, tokens), dtype=torch.int64, device=device)
    every = torch.empty(group.size(), len(mine), dtype=torch.int64, device=device)
    dist.all_gather_into_tensor(every, mine, group=group)
    every = every.tolist()
    differ = [i for i in range(len(AGREED)) if len({row[i] for row in every}) > 1]
    if differ:
        def shown(i, value):
            return "None" if AGREED[i] == "max_tokens" and value == 0 else value
        table = "; ".join(f"rank {r}: " + ", ".join(f"{AGREED[i]} {shown(i, row[i])}"
                                                    for i in differ)
                          for r, row in enumerate(every))
        raise ValueError(f"expert_parallel: the ranks disagree on "
                         f"{', '.join(AGREED[i] for i in differ)} ({table})")
    return max(row[-1] for row in every)


def _new_layouts(group, transport, experts_per_rank, hidden, k, capacity, scales, chunks,
                 device) -> list[Layout]:
    world = group.size()
    # The rows a rank does not send: stale rows and scales (zeros on NCCL),
    # and metadata of all-ones words (ids -1).
    planes = world * capacity
    shapes = ((planes, hidden, 0), (planes, 2 * meta_width(k), -1), (planes, hidden, 0),
              (planes, 2 * k, 0))
    shapes += ((planes, 2 * scales, 0),) if scales else ()
    lane_bytes = sum(aligned_bytes(rows, width) for rows, width, _ in shapes)
    key = (group.group_name, transport)
    buffer = _BUFFERS.get(key)
    if buffer is None or buffer.nbytes < chunks * lane_bytes:
        _BUFFERS.pop(key, None)
        buffer = _BUFFERS[key] = TRANSPORTS[transport](group, chunks * lane_bytes, device)
    lanes = []
    for chunk in range(chunks):
        rows, meta, home, home_weights, *scaled = buffer.regions(*shapes,
                                                                 start=chunk * lane_bytes)
        lanes.append(Layout(world, group.rank(), experts_per_rank, capacity, k, buffer, rows,
                            meta, home, home_weights, scales, *scaled))
    return lanes


def meta_width(k: int) -> int:
    """The int32 words of a token's metadata: k ids and k weights' bits."""
    return 2 * k


def token_scales(hidden: int, granularity: str | None) -> int:
    """The float32 scales a token travels with: none in 16 bits, one per
    token (ROWWISE), one per 128 columns."""
    if granularity is None:
        return 0
    return 1 if granularity == ROWWISE else -(-hidden // 128)


class Plan:
    """One call's routing between ranks, all on the GPU: which ranks each of
    this rank's tokens goes to and its row there (dispatch), and which ranks
    made each token's outputs (the return's sums)."""

    def __init__(self, layout: Layout, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
        """Token t goes to row t of this rank's block of each rank that holds
        one of its experts (dest, -1 where not), its outputs are summed from
        row t of this rank's block of those ranks' home regions (index: >= 0
        where sent), and its ids and weights travel as its metadata (meta)."""
        self.layout, self.tokens = layout, topk_ids.shape[0]
        self.ranks = layout.ranks[:self.tokens]
        self.dest, self.index, self.meta = call(
            OPS.dispatch_plan.default, topk_ids.long(), topk_weights.detach().float(),
            layout.world, layout.rank, layout.experts_per_rank, layout.capacity)

    def dispatch(self, x, private=False):
        """(rows [W * max_tokens, H], weights [.., k] float32) received by this
        rank: its blocks of the rows region, read in place until the return
        (a copy where `private`: autograd keeps the rows), the rows no rank
        sent stale, their ids -1; sets local_ids (-1 but for this rank's
        experts)."""
        layout = self.layout
        weights = self._delivered((layout.rows,), lambda meta: layout.buffer.transfer(
            ((layout.rows, words(x)), meta), self.ranks, self.dest))
        rows = layout.rows.local.view(x.dtype)
        return (rows.clone() if private else rows), weights

    def dispatch_quantized(self, x, granularity):
        """dispatch's (rows, weights) with the tokens quantized before they
        travel (quantize_fp8 at `granularity`), and the rows' scales
        [W * max_tokens, scales a token]: read in place (no gradient)."""
        layout = self.layout
        weights = self._delivered(
            (layout.fp8_rows, layout.scales),
            lambda meta: layout.buffer.transfer_quantized(x, granularity, layout.fp8_rows,
                                                          layout.scales, (meta,), self.ranks,
                                                          self.dest))
        return (layout.fp8_rows.local.view(torch.float8_e4m3fn), weights,
                layout.scales.local.view(torch.float32))

    def _delivered(self, regions, transfer):
        """transfer(meta), the tokens' rows into `regions` and their metadata
        (meta: a row set) as the tokens go; the received rows' weights [.., k]
        float32.  Sets local_ids (-1 but for this rank's experts)."""
        layout, buffer = self.layout, self.layout.buffer
        buffer.cleared(layout.meta)  # rows no rank sends: no ids
        self.delivered = list(regions)
        transfer((layout.meta, words(self.meta)))
        self.local_ids, weights = call(
            OPS.received_slots.default, layout.meta.local.view(torch.int32), layout.world,
            layout.rank, layout.experts_per_rank, layout.capacity)
        buffer.blanked(layout.meta)  # by received_slots, before the next barrier: no wait for it
        buffer.claimed(layout.home)  # the experts write their outputs there
        return weights

    def read(self):
        """The received rows' reads are issued (the experts'): the regions may
        take the next dispatch's rows once the ranks meet again."""
        self.layout.buffer.consumed(*self.delivered)

    def home_rows(self, dtype: torch.dtype) -> torch.Tensor:
        """[W * max_tokens, H] of dtype: where the received rows' outputs go
        (the experts write them there: the dispatch claimed the region), to
        be summed at their tokens' ranks."""
        return self.layout.home.local.view(dtype)

    def returned(self, out):
        """Each token's output: its received rows' outputs (out, best
        written into home_rows) summed over the ranks that made them."""
        layout = self.layout
        self.read()
        _placed(self.home_rows(out.dtype), out)
        summed, = layout.buffer.summed(((layout.home, out.dtype),), self.index, self.first_row)
        return summed

    @property
    def first_row(self) -> int:
        """The row of this rank's block in every rank's regions."""
        return self.layout.rank * self.layout.capacity

    def dispatch_gradient(self, grad):
        """The output's gradient [T, H] to the received rows, as the tokens
        went (a copy: autograd may run another transfer before it is read)."""
        layout = self.layout
        layout.buffer.transfer(((layout.rows, words(grad)),), self.ranks, self.dest)
        rows = layout.rows.local.view(grad.dtype).clone()
        layout.buffer.consumed(layout.rows)
        return rows

    def returned_gradients(self, grad_rows, grad_weights):
        """The received rows' and weights' gradients summed at their tokens'
        ranks ([T, H] and [T, k] float32), as the outputs were."""
        layout = self.layout
        layout.buffer.claimed(layout.home)
        layout.buffer.claimed(layout.home_weights)
        _placed(self.home_rows(grad_rows.dtype), grad_rows)
        _placed(layout.home_weights.local.view(torch.float32), grad_weights)
        return layout.buffer.summed(((layout.home, grad_rows.dtype),
                                     (layout.home_weights, torch.float32)),
                                    self.index, self.first_row)


def _placed(region_rows: torch.Tensor, rows: torch.Tensor):
    """rows into region_rows, unless they were written there."""
    if rows.data_ptr() != region_rows.data_ptr():
        region_rows.copy_(rows)


class Dispatch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, topk_weights, plan):
        """topk_weights travel in the plan's metadata: an input here so that
        their gradient comes back."""
        ctx.plan, ctx.weights_dtype = plan, topk_weights.dtype
        return plan.dispatch(x, private=True)

    @staticmethod
    def backward(ctx, grad_rows, grad_weights):
        grad_x, grad_w = ctx.plan.returned_gradients(grad_rows.contiguous(),
                                                     grad_weights.float().contiguous())
        return grad_x, grad_w.to(ctx.weights_dtype), None


class Return(torch.autograd.Function):
    @staticmethod
    def forward(ctx, out, plan):
        ctx.plan = plan
        return plan.returned(out)

    @staticmethod
    def backward(ctx, grad):
        return ctx.plan.dispatch_gradient(grad.contiguous()), None
