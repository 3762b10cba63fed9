"""torchtitan's MoE layers with their routed experts spread over a process
group's ranks by expert_parallel (shard_torchtitan_experts).

torchtitan composes a layer's routed experts (`RoutedExperts`) from a token
dispatcher (reorder, all-to-all) and `GroupedExperts` (w1, w3, w2) as
siblings, so that each can be replaced.  expert_parallel is dispatch, experts
and combine in one, so it takes the place of the whole `RoutedExperts`
(TorchtitanExpertParallel), with the call torchtitan's `MoE` makes of it.
Its w13 is one tensor ([E/W, 2F, D], torchtitan's w1 then w3, as moe_experts
reads a concatenated gate and up); its state dict keeps torchtitan's names
(`inner_experts.w1_EFD`, `w3_EFD`, `w2_EDF`: this rank's share), so a
checkpoint's keys are unchanged."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._native import check_types
from . import expert_parallelism
from .expert_parallelism import expert_parallel

# torchtitan's GroupedExperts' parameters: [E, F, D] gate and up, [E, D, F] down.
GATE, UP, DOWN = "w1_EFD", "w3_EFD", "w2_EDF"
INNER = "inner_experts."


class TorchtitanExpertParallel(torch.nn.Module):
    """A torchtitan `RoutedExperts` replaced by `expert_parallel` over this
    rank's share of its experts (made by `shard_torchtitan_experts`).

    Parameters: `w13` `[E/W, 2F, D]` (torchtitan's w1 rows, then w3's) and
    `w2` `[E/W, D, F]`; in the state dict they are torchtitan's
    `inner_experts.w1_EFD`, `inner_experts.w3_EFD` and `inner_experts.w2_EDF`
    (this rank's experts), and those keys load back into them."""

    def __init__(self, w1: torch.Tensor, w3: torch.Tensor, w2: torch.Tensor, *,
                 group: dist.ProcessGroup, max_tokens: int | None, transport: str,
                 requires_grad: bool):
        super().__init__()
        self.w13 = torch.nn.Parameter(torch.cat([w1, w3], dim=1), requires_grad)
        self.w2 = torch.nn.Parameter(w2.clone(), requires_grad)
        self.options = {"group": group, "max_tokens": max_tokens, "transport": transport}
        self.register_state_dict_post_hook(_torchtitan_names)
        self.register_load_state_dict_pre_hook(_from_torchtitan_names)

    def forward(self, x_BLD: torch.Tensor, topk_scores_BLK: torch.Tensor,
                topk_expert_ids_BLK: torch.Tensor,
                num_local_tokens_per_expert_E: torch.Tensor | None = None) -> torch.Tensor:
        """torchtitan's `RoutedExperts.forward`: `[B, L, D]` tokens, their
        `[B, L, K]` scores and global expert ids (the counts, which
        expert_parallel does not need, are ignored) -> `[B, L, D]` in x's
        dtype.  float32 tokens and weights (torchtitan's parameters without
        a mixed-precision policy) run in bfloat16, as torchtitan's
        GroupedExperts runs them."""
        del num_local_tokens_per_expert_E
        dtype = x_BLD.dtype if x_BLD.dtype in (torch.float16, torch.bfloat16) else torch.bfloat16
        width, k = x_BLD.shape[-1], topk_expert_ids_BLK.shape[-1]
        out = expert_parallel(x_BLD.reshape(-1, width).to(dtype),
                              topk_expert_ids_BLK.reshape(-1, k), topk_scores_BLK.reshape(-1, k),
                              self.w13.to(dtype), self.w2.to(dtype), **self.options)
        return out.view(x_BLD.shape).to(x_BLD.dtype)


def _torchtitan_names(module, state, prefix, local_metadata):
    """The state dict's w13 as torchtitan's w1 and w3 (views), w2 as its w2."""
    del local_metadata
    w13 = state.pop(prefix + "w13")
    inter = w13.shape[1] // 2
    state[prefix + INNER + GATE] = w13[:, :inter]
    state[prefix + INNER + UP] = w13[:, inter:]
    state[prefix + INNER + DOWN] = state.pop(prefix + "w2")


def _from_torchtitan_names(module, state, prefix, *args):
    """torchtitan's keys (this rank's share) loaded into w13 and w2."""
    del args
    names = [prefix + INNER + name for name in (GATE, UP, DOWN)]
    if all(name in state for name in names):
        gate, up, down = (state.pop(name) for name in names)
        state[prefix + "w13"] = torch.cat([gate, up], dim=1)
        state[prefix + "w2"] = down


def shard_torchtitan_experts(model: torch.nn.Module, *,
                             group: dist.ProcessGroup | None = None,
                             max_tokens: int | None = None,
                             transport: str = "symmetric_memory") -> int:
    """Spread a torchtitan model's routed experts over a process group's
    ranks: each of its `RoutedExperts` (a token dispatcher and
    `GroupedExperts`) becomes a `TorchtitanExpertParallel` holding this
    rank's share (with W ranks and E experts, rank r keeps experts
    `r * E/W` to `(r + 1) * E/W - 1`, its other weights dropped), run by
    `expert_parallel`.

    Call it on the model as built and loaded (full experts, plain tensors),
    the same on every rank, before anything parallelizes it; with torchtitan's
    own expert parallelism off, since this replaces it.  Then every rank runs
    the model on its own tokens (data parallel outside the experts), every
    rank the same number of forwards and backwards, in the same order: the
    ranks meet in each MoE layer.  Each rank gets its own tokens' outputs;
    its experts' weight gradients sum every rank's tokens routed to them, and
    the router's gradient flows through the routing scores as in torchtitan.

    Args:
        model: a torchtitan model (or one `MoE`) whose routed experts are
            torchtitan's SwiGLU `GroupedExperts` (w1, w3, w2), the same on
            every rank.
        group: the process group (default: the default group).
        max_tokens: the most tokens (batch x sequence) a rank passes an MoE
            layer in one forward, as `expert_parallel`'s.
        transport: as `expert_parallel`'s.

    Returns:
        The number of routed-experts modules replaced.

    Raises:
        TypeError: max_tokens not an int.
        ValueError: no initialised process group; no torchtitan routed
            experts in the model; experts that are not w1 / w3 / w2 tensors
            (gpt-oss's, or weights already parallelized into DTensors); a
            number of experts that is not a multiple of W.
    """
    group = expert_parallelism.resolved_group(group)
    if max_tokens is not None:
        check_types(ints=(("max_tokens", max_tokens),))
    world, rank = group.size(), group.rank()
    places = [(parent, name, child) for parent in model.modules()
              for name, child in parent.named_children() if _is_routed_experts(child)]
    if not places:
        raise ValueError(f"model has no torchtitan routed experts (inner_experts and "
                         f"token_dispatcher): {type(model).__name__}")
    for _, _, routed in places:
        _check_experts(routed.inner_experts, world)
    for parent, name, routed in places:
        inner = routed.inner_experts
        share = slice(rank * (inner.w1_EFD.shape[0] // world),
                      (rank + 1) * (inner.w1_EFD.shape[0] // world))
        gate, up, down = (getattr(inner, weight).detach()[share] for weight in (GATE, UP, DOWN))
        replacement = TorchtitanExpertParallel(
            gate, up, down, group=group, max_tokens=max_tokens, transport=transport,
            requires_grad=inner.w1_EFD.requires_grad)
        setattr(parent, name, replacement)
    return len(places)


def _is_routed_experts(module) -> bool:
    return hasattr(module, "inner_experts") and hasattr(module, "token_dispatcher")


def _check_experts(inner, world: int) -> None:
    """A ValueError unless `inner` is torchtitan's SwiGLU GroupedExperts, plain
    tensors, its experts a multiple of `world`."""
    name = type(inner).__name__
    weights = [getattr(inner, weight, None) for weight in (GATE, UP, DOWN)]
    if not all(isinstance(w, torch.Tensor) for w in weights):
        raise ValueError(f"{name}: shard_torchtitan_experts runs torchtitan's SwiGLU "
                         f"GroupedExperts ({GATE}, {UP}, {DOWN}), not this module's weights")
    from torch.distributed.tensor import DTensor  # here: not at gg_runtime's import

    if any(isinstance(w, DTensor) for w in weights):
        raise ValueError(f"{name}'s weights are already parallelized (DTensors): shard the "
                         f"model before torchtitan parallelizes it, with its expert "
                         f"parallelism off")
    experts = weights[0].shape[0]
    if experts % world:
        raise ValueError(f"{name} has {experts} experts, not a multiple of the group's "
                         f"{world} ranks")
