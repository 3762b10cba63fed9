"""gg_runtime.moe.expert_parallel: the experts of an MoE layer spread over
the ranks of a process group (one host's GPUs, or several hosts' over
NCCL).  Each rank holds E / W experts (rank r experts r * E/W ..
(r + 1) * E/W - 1, or those a placement gives it: the ids are then mapped
to that order first, by one lookup).  A call is three stages:

1. dispatch: each token goes once to every rank that holds one of its
   experts (its row, its k global ids and its k weights), token t into row
   t of this rank's block of that rank's buffer (transport.py: stored
   straight into the peer's memory on one host, or by NCCL's all-to-all);
   a rank clears its metadata before the rows come, so that the rows no rank
   sent have no ids: no host sync;
2. the local experts: moe_experts on the received rows, the ids of other
   ranks' experts dropped, so that each row's output is the weighted sum of
   its slots on this rank;
3. return: each rank's experts write their rows' outputs into its buffer's
   home region, and each rank sums its tokens' rows there, read straight
   from the ranks that made them, in float32 (the sum_peer_rows operator;
   with NCCL, the regions' blocks moved by its all-to-all, then summed).

With `chunks` above 1 the tokens go in chunks, a chunk's dispatch and return
on a second stream while the experts of the chunks beside it run
(overlap.py).

With fp8 weights served, the tokens travel quantized (as moe_experts would
quantize them: per 128 columns, or per token), their scales beside them, and
the experts take them so: half the bytes of 16-bit rows.

The backward runs the same transfers the other way: the output's gradient
goes out as the tokens did, the received rows' and weights' gradients come
back as the outputs did.  The buffers are sized by the worst case, every
token of every rank sent to one rank (W * max_tokens rows each way), so no call
waits for the host and a decode step can be captured in a CUDA graph."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._native import check_types
from ..formats import FP8_WEIGHT_SCALINGS, WEIGHT_FORMATS, Quantized
from ..fp8_expert_weights import Fp8ExpertWeights
from .exchange import Dispatch, Plan, Return, layout_for
from .experts import check_quantized, moe_experts
from .module import MoEExperts
from .overlap import pipelined
from .stages import mapped_ids
from .transport import TRANSPORTS

# The SMs the transfers fill while the experts run (chunks > 1).
TRANSPORT_SMS = 16
# Where x must be (the CPU tests' simulated ranks change it).
DEVICE_TYPE = "cuda"
# Placements checked, by the tensor's id (kept alive, so that no other takes it) with its version.
_PLACEMENTS: dict[int, tuple[torch.Tensor, int]] = {}
_MAX_PLACEMENTS = 16


def expert_parallel(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    w13: torch.Tensor | Quantized, w2: torch.Tensor | Quantized, *,
                    group: dist.ProcessGroup | None = None,
                    max_tokens: int | None = None, transport: str = "symmetric_memory",
                    gate_up: str = "concatenated",
                    activation: str = "swiglu", b13: torch.Tensor | None = None,
                    b2: torch.Tensor | None = None,
                    fp8: str | Fp8ExpertWeights | None = None,
                    placement: torch.Tensor | None = None, chunks: int = 1,
                    transport_sms: int = TRANSPORT_SMS) -> torch.Tensor:
    """The experts of a token-choice MoE layer spread over a process group's
    ranks (expert parallelism): the GPUs of one host, or of several over NCCL.

    Every rank calls it with its own tokens and the router's choice for them
    (global expert ids) and its share of the experts: with W ranks and E
    experts in all, rank r holds experts `r * E/W` to `(r + 1) * E/W - 1`
    (w13 and w2 of E/W experts), or those `placement` gives it.  Each rank
    gets its tokens' outputs back:
    `out[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])`, as
    `moe_experts` on one GPU with all E experts would give (each rank's part
    rounded to x's dtype, the parts summed in float32).  An id outside
    `[0, E)` is a dropped slot, as in `moe_experts`.

    Tokens travel once to each rank that holds one of their experts, stored
    by gg_runtime's send_rows kernel straight into that rank's buffer (torch's
    SymmetricMemory, over NVLink; or, with `transport="nccl"`, by NCCL's
    all-to-all); each token's outputs are summed by its rank, read from the
    buffers of the ranks that made them.  No
    step waits for the host: a call can be captured in a CUDA graph and
    replayed with new tokens and routing.  The group's buffer is sized for
    the worst case, every token of every rank sent to one rank:
    `W * max_tokens` rows of H elements each way, plus their ids and weights; it is
    made (collectively) on the first call of each configuration, where the
    ranks also check that they agree on it.  With `chunks` above 1 the
    transfers of one chunk of the tokens run beside the experts of the
    others, on a second stream.

    Autograd: differentiable in x, topk_weights and this rank's expert
    weights and biases, once, as `moe_experts` is; the backward runs the
    same transfers the other way.  Every rank must run the forward and the
    backward, in the same order (they meet at each transfer).

    Args:
        x: `[T, H]`, this rank's tokens, float16 or bfloat16 on this rank's
            CUDA device (T may differ between ranks, and be 0).
        topk_ids: `[T, k]`, int32 or int64: each token's k experts, global
            ids in `[0, E)`.
        topk_weights: `[T, k]`, any floating dtype: the slots' weights.
        w13: `[E/W, 2I, H]`: this rank's experts' gate and up projections, as
            `moe_experts` takes w13 (16-bit, or a `Quantized`: fp8 or 4-bit).
        w2: `[E/W, H, I]`: their down projections, as `moe_experts`' w2.
        gate_up: as `moe_experts`' (`"concatenated"` or `"interleaved"`).
        activation: as `moe_experts`' (`"swiglu"` or `"gpt_oss"`).
        b13: None, or this rank's experts' `[E/W, 2I]` biases, as `moe_experts`'.
        b2: None, or `[E/W, H]`, as `moe_experts`'.
        fp8: None, or an fp8 training recipe (or `Fp8ExpertWeights` of this
            rank's experts), as `moe_experts`'.
        group: the process group (default: the default group); with the
            `"symmetric_memory"` transport, GPUs of one host, able to address
            each other's memory.
        max_tokens: the most tokens a rank passes in a call, the same on
            every rank (default: the largest T of the ranks' first call).
            The buffer is sized by it.
        transport: `"symmetric_memory"` (the GPUs of one host, each able to
            address the others' memory) or `"nccl"` (any ranks, across hosts
            too: every block of the buffer travels whole, the worst case's
            bytes whatever the routing).
        placement: None (contiguous shares), or an int tensor `[E]` on x's
            device, the same on every rank: where each global expert is
            held, as an index into the ranks' experts one after the other
            (expert e is rank `placement[e] // (E/W)`'s
            `w13[placement[e] % (E/W)]`), a permutation of `0 .. E-1` (each
            expert on one rank, no replicas).  Checked (a host sync) on the
            first call with that tensor, or after it changes in place; a CUDA
            graph keeps the placement it was captured with.
        chunks: the tokens in this many chunks (the same on every rank),
            each a pipeline step with its own share of the buffer: a chunk's
            dispatch and return run on a second stream while its neighbours'
            experts run on the caller's, so that only the first dispatch and
            the last return are not hidden; 1 (the default) runs the stages
            one after the other on the caller's stream.  The experts then
            run on `max_tokens / chunks` tokens a rank at a time: each chunk
            reads this rank's weights again, on fewer SMs, so chunks pay
            only where the transfers take longer than that (a slow
            transport, few weight bytes for the rows).
        transport_sms: with chunks above 1, the SMs the transfers' kernels
            fill (`gg_runtime.sm_limit`); the experts' kernels take the
            others.

    Returns:
        `[T, H]` in x's dtype.

    Raises:
        TypeError: an argument of the wrong type or dtype, naming it.
        ValueError: shapes that do not fit; T above max_tokens; chunks or
            transport_sms below 1; an unknown transport; a placement that
            is not a permutation of `0 .. E-1` (E = W * E/W); fp8 weights
            with H not a multiple of 16, or with an input that requires
            grad (inference only, refused before anything is sent); ranks
            that disagree on the experts per rank, H, k, max_tokens, x's
            element size, the scales the tokens travel with or chunks
            (raised on every rank, naming them).  An error raised on some
            ranks only (a bad argument, T above max_tokens) leaves the
            others waiting for them in their next transfer: on one host,
            for torch.distributed's default timeout (10 minutes), after
            which torch prints which rank was not heard from and the
            waiting ranks' CUDA work fails (a RuntimeError, CUDA unusable in
            that process); with `"nccl"`, for the group's NCCL timeout.
    """
    group = resolved_group(group)
    check_types(tensors=(("x", x), ("topk_ids", topk_ids), ("topk_weights", topk_weights)))
    _check_local(x, topk_ids, topk_weights, max_tokens)
    _check_overlap(chunks, transport_sms)
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {tuple(TRANSPORTS)}, got {transport!r}")
    for name, w in (("w13", w13), ("w2", w2)):
        if isinstance(w, Quantized):  # checked before any transfer, naming it
            check_quantized(name, w, WEIGHT_FORMATS, "the weights")
    granularity = _dispatch_granularity(x, topk_weights, w13, fp8)
    lanes = layout_for(group, x, topk_ids, w13.values if isinstance(w13, Quantized) else w13,
                       max_tokens, transport, granularity, chunks)
    if placement is not None:
        topk_ids = _placed_ids(topk_ids, placement, lanes[0])
    options = {"gate_up": gate_up, "activation": activation, "b13": b13, "b2": b2, "fp8": fp8}

    def dispatch(lane, part):
        plan = Plan(lane, topk_ids[part], topk_weights[part])
        return plan, _dispatched(plan, x[part], topk_weights[part], granularity)

    def experts(plan, operands):
        rows, weights = operands
        if torch.is_grad_enabled() and _wants_gradient(rows, weights, w13, w2, b13, b2) \
                or fp8 is not None:
            return moe_experts(rows, plan.local_ids, weights, w13, w2, **options)
        out = plan.home_rows(torch.bfloat16 if granularity is not None else x.dtype)
        return moe_experts(rows, plan.local_ids, weights, w13, w2, out=out, **options)

    def returned(plan, out):
        if torch.is_grad_enabled() and out.requires_grad:
            return Return.apply(out, plan)
        return plan.returned(out).to(x.dtype)

    if chunks == 1:
        plan, operands = dispatch(lanes[0], slice(None))
        return returned(plan, experts(plan, operands))
    return pipelined(x.shape[0], lanes, dispatch, experts, returned, transport_sms, x.device)


def _wants_gradient(*values) -> bool:
    """Whether a tensor among values (or a Quantized's values) requires grad."""
    return any((v.values if isinstance(v, Quantized) else v).requires_grad
               for v in values if v is not None)


def _dispatched(plan, x, topk_weights, granularity):
    """The received rows as moe_experts takes them (a Quantized where the
    tokens travel quantized) and their weights."""
    if granularity is not None:
        rows, weights, x_scale = plan.dispatch_quantized(x, granularity)
        return Quantized(rows, x_scale, granularity), weights
    if torch.is_grad_enabled() and (x.requires_grad or topk_weights.requires_grad):
        return Dispatch.apply(x, topk_weights, plan)
    # read in place unless autograd may keep the rows (the experts' weights' gradients)
    return plan.dispatch(x, private=torch.is_grad_enabled())


def _check_overlap(chunks, transport_sms):
    check_types(ints=(("chunks", chunks), ("transport_sms", transport_sms)))
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    if transport_sms < 1:
        raise ValueError(f"transport_sms must be at least 1, got {transport_sms}")


def _dispatch_granularity(x, topk_weights, w13, fp8) -> str | None:
    """How the tokens travel quantized (quantize_fp8's granularity, as the
    experts would quantize them), or None: 16-bit.  fp8 weights served (w13
    a Quantized in fp8) are inference only: refused here, before any
    transfer, where a gradient is wanted."""
    scaling = FP8_WEIGHT_SCALINGS.get(w13.format) if isinstance(w13, Quantized) else None
    if scaling is None or fp8 is not None or not isinstance(w13.values, torch.Tensor):
        return None  # 16-bit tokens (W4A16 too); moe_experts refuses what does not fit
    if x.shape[1] % 16:
        raise ValueError(f"fp8 weights need H to be a multiple of 16, got H={x.shape[1]}")
    if torch.is_grad_enabled() and (x.requires_grad or topk_weights.requires_grad
                                    or w13.values.requires_grad):
        raise ValueError("expert_parallel with fp8 weights is inference-only, but an input "
                         "requires grad (run it under torch.no_grad() or "
                         "torch.inference_mode(), or detach it)")
    return scaling.rows


def resolved_group(group):
    """`group`, or the default group where None; a ValueError where there is none."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("expert_parallel needs an initialised torch.distributed process group")
    group = group if group is not None else dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup, got "
                        f"{type(group).__name__}")
    return group


def _placed_ids(topk_ids, placement, layout):
    """topk_ids as indices into the ranks' experts one after the other:
    placement[id] for an id in [0, E), -1 (a dropped slot) for any other."""
    _check_placement(placement, layout.world * layout.experts_per_rank)
    return mapped_ids(topk_ids, placement)


def _check_placement(placement, experts):
    """A TypeError or ValueError unless placement is a permutation of
    0 .. experts - 1 on x's device type: checked once a tensor and version
    (a host sync)."""
    seen = _PLACEMENTS.get(id(placement))
    if seen is not None and seen[0] is placement and seen[1] == placement._version:
        return
    check_types(tensors=(("placement", placement),))
    if placement.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"placement must be int32 or int64, got {placement.dtype}")
    if placement.shape != (experts,):
        raise ValueError(f"placement must be [E] = [{experts}] (W times w13's experts), got "
                         f"shape {tuple(placement.shape)}")
    if placement.device.type != DEVICE_TYPE:
        raise ValueError(f"placement must be on a CUDA device, got {placement.device}")
    if not torch.equal(placement.long().sort().values,
                       torch.arange(experts, device=placement.device)):
        raise ValueError(f"placement must be a permutation of 0 .. {experts - 1} (each expert "
                         "held by one rank, once)")
    if len(_PLACEMENTS) >= _MAX_PLACEMENTS:
        _PLACEMENTS.clear()
    _PLACEMENTS[id(placement)] = (placement, placement._version)


def _check_local(x, topk_ids, topk_weights, max_tokens):
    """This rank's arguments, before anything is sent."""
    if x.dim() != 2:
        raise ValueError(f"x must be [T, H], got shape {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"x must be float16 or bfloat16, got {x.dtype}")
    if x.device.type != DEVICE_TYPE:
        raise ValueError(f"x must be on a CUDA device, got {x.device}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_ids.shape[1] < 1:
        raise ValueError(f"topk_ids must be [T, k] with T = {x.shape[0]} (x's) and k >= 1, "
                         f"got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights must have topk_ids' shape {tuple(topk_ids.shape)}, "
                         f"got {tuple(topk_weights.shape)}")
    if not topk_weights.is_floating_point():
        raise TypeError(f"topk_weights must be a floating dtype, got {topk_weights.dtype}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if t.device != x.device:
            raise ValueError(f"{name} must be on x's device {x.device}, got {t.device}")
    if max_tokens is not None:
        check_types(ints=(("max_tokens", max_tokens),))
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if x.shape[0] > max_tokens:
            raise ValueError(f"x has {x.shape[0]} tokens, more than max_tokens = {max_tokens}")


class ExpertParallelExperts(MoEExperts):
    """`expert_parallel` as a module: this rank's share of the experts of an
    MoE layer spread over a process group.

    Its parameters are `MoEExperts`' (transformers' names and layouts) for
    this rank's `num_experts / W` experts; `forward(hidden_states [T, H],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, H]` takes this rank's
    tokens and their global expert ids, as transformers calls its experts
    module, and gives their outputs.

    Args:
        num_experts: E, the experts of the whole layer (a multiple of the
            group's size W).
        hidden_size: H, as `MoEExperts`'.
        intermediate_size: I, as `MoEExperts`'.
        group: the process group (default: the default group).
        max_tokens: as `expert_parallel`'s.
        transport: as `expert_parallel`'s.
        placement: as `expert_parallel`'s: which experts this rank's
            parameters hold.
        chunks: as `expert_parallel`'s.
        transport_sms: as `expert_parallel`'s.
        **options: `MoEExperts`' keyword arguments: gate_up, activation,
            bias, fp8, device and dtype.

    Raises:
        TypeError: a size that is not an int.
        ValueError: as `MoEExperts`; no initialised process group; E not a
            multiple of W.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 group: dist.ProcessGroup | None = None, max_tokens: int | None = None,
                 transport: str = "symmetric_memory", placement: torch.Tensor | None = None,
                 chunks: int = 1, transport_sms: int = TRANSPORT_SMS, **options: object):
        self.group = resolved_group(group)
        check_types(ints=(("num_experts", num_experts),))
        world = self.group.size()
        if num_experts % world:
            raise ValueError(f"num_experts ({num_experts}) must be a multiple of the group's "
                             f"size ({world})")
        super().__init__(num_experts // world, hidden_size, intermediate_size, **options)
        _check_overlap(chunks, transport_sms)
        self.max_tokens, self.transport = max_tokens, transport
        self.chunks, self.transport_sms = chunks, transport_sms
        # A buffer, so that the module's .to() takes it along; not in the state dict.
        self.register_buffer("placement", placement, persistent=False)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """`expert_parallel(hidden_states, top_k_index, top_k_weights, ...)` with
        this module's parameters, group, max_tokens, placement, chunks and
        settings."""
        return expert_parallel(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                               self.down_proj, group=self.group, max_tokens=self.max_tokens,
                               transport=self.transport, placement=self.placement,
                               chunks=self.chunks, transport_sms=self.transport_sms,
                               **self._options())
