"""The MoE experts as torch computes them without gg_runtime, expert by
expert: the reference of moe_experts' tests (in float32 or float64 for the
truth, in the inputs' dtype for torch's own error)."""
import torch
from gg_runtime.testing import gated_activation


def layer_ref(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None, interleaved=False,
              activation="swiglu", gu_dtype=None):
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) in x's dtype;
    ids outside [0, E) add nothing.  gu_dtype: the up projection rounded to it
    before the activation, as the implementations store it."""
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gu = x[token] @ w13[e].T + (0 if b13 is None else b13[e])
        gu = gu if gu_dtype is None else gu.to(gu_dtype).to(x.dtype)
        y = gated_activation(gu, interleaved, activation) @ w2[e].T + (0 if b2 is None else b2[e])
        out = out.index_add(0, token, y * topk_weights[token, slot, None].to(x.dtype))
    return out


def combine_ref(rows, index, weights, offs):
    """torch.ops.gg_runtime.combine's contract, in float32 (float64 for float64
    rows): sum_j weights[t, j] * rows[index[t, j]] over the slots whose row lies
    within the groups (below offs[-1]); the others add nothing, whatever their weight."""
    dtype = torch.promote_types(rows.dtype, torch.float32)
    end = min(int(offs[-1]), rows.shape[0]) if len(offs) else 0
    kept = (index >= 0) & (index < end)
    picked = rows.to(dtype)[index.clamp(0, max(rows.shape[0] - 1, 0))]
    # where, not a product: a row past the groups' may hold anything (NaN too).
    return torch.where(kept[..., None], weights.to(dtype)[..., None] * picked, 0).sum(1)


def route_by_sort(topk_ids, experts):
    """torch.ops.gg_runtime.route's contract by torch's sort (any device): the
    token slots sorted by expert, stably, ids outside [0, experts) last; the
    groups' int32 end offsets; the inverse permutation."""
    # Ids outside [0, experts) become `experts`: clamped into [-1, experts], then
    # -1 wraps to experts.
    expert = topk_ids.reshape(-1).clamp(-1, experts).remainder_(experts + 1)
    sorted_expert, order = expert.sort(stable=True)
    ends = torch.arange(1, experts + 1, dtype=expert.dtype, device=expert.device)
    offs = torch.searchsorted(sorted_expert, ends, out_int32=True)
    slots = torch.arange(order.numel(), device=order.device)
    inverse = torch.empty_like(order).scatter_(0, order, slots)
    return order, offs, inverse


def dispatch_plan_ref(topk_ids, topk_weights, world, rank, experts_per_rank, capacity):
    """torch.ops.gg_runtime.dispatch_plan's contract: (dest, index, meta)."""
    kept = (topk_ids >= 0) & (topk_ids < world * experts_per_rank)
    owner = torch.where(kept, topk_ids // experts_per_rank, -1)
    goes = (owner[:, :, None] == torch.arange(world, device=topk_ids.device)).any(1)  # [T, W]
    tokens = torch.arange(topk_ids.shape[0], device=topk_ids.device)[:, None]
    dest = torch.where(goes, rank * capacity + tokens, -1)
    index = torch.where(goes, torch.arange(world, device=goes.device) * capacity + tokens, -1)
    meta = torch.cat([torch.where(kept, topk_ids, -1).int(),
                      topk_weights.float().view(torch.int32)], 1)
    return dest, index, meta


def received_slots_ref(meta, world, rank, experts_per_rank, capacity):
    """torch.ops.gg_runtime.received_slots' contract: (ids, weights), meta left
    all -1."""
    k = meta.shape[1] // 2
    local = meta[:, :k].long() - rank * experts_per_rank
    here = (meta[:, :k] >= 0) & (local >= 0) & (local < experts_per_rank)
    weights = torch.where(here, meta[:, k:].contiguous().view(torch.float32), 0.0)
    meta.fill_(-1)
    return torch.where(here, local, -1), weights
