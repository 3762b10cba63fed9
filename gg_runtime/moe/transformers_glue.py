"""transformers' experts modules run by gg_runtime: on one GPU by moe_experts
(transformers_experts_forward), or spread over a process group's ranks by
expert_parallel (shard_transformers_experts)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._native import check_types
from .choices import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from . import expert_parallelism
from .expert_parallelism import expert_parallel
from .experts import moe_experts

# The name the expert-parallel forward is registered under in transformers' ExpertsInterface.
EXPERT_PARALLEL = "gg_runtime_expert_parallel"


def transformers_experts_forward(module: torch.nn.Module, hidden_states: torch.Tensor,
                                 top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
    """The forward of a transformers experts module, through `moe_experts`.

    An entry for transformers' `ExpertsInterface` (transformers 5): it runs
    the module's `gate_up_proj`, `down_proj` and their biases (where its
    `has_bias` says), in the layout its `is_transposed` and `is_concatenated`
    flags give, for SwiGLU experts (Qwen3-MoE, Mixtral, DeepSeek, OLMoE, ...)
    and gpt-oss's (`GptOssExperts` with its alpha 1.702 and limit 7.0, run with
    `activation="gpt_oss"`):

        from transformers.integrations.moe import ExpertsInterface
        ExpertsInterface.register("gg_runtime", gg_runtime.transformers_experts_forward)
        model.config._experts_implementation = "gg_runtime"

    Ids transformers uses as expert-parallel sentinels (>= the number of
    experts) are dropped slots, as in its grouped_mm implementation.

    Args:
        module: the model's experts module.
        hidden_states: `[T, H]` tokens.
        top_k_index: `[T, k]` expert ids.
        top_k_weights: `[T, k]` routing weights.

    Returns:
        `[T, H]` in hidden_states' dtype.

    Raises:
        TypeError: a module without `gate_up_proj` and `down_proj`.
        ValueError: experts without a gate, with their own gating, with an
            activation other than SiLU, or a GptOssExperts whose alpha and
            limit differ from 1.702 and 7.0.
    """
    w13, w2, options = _experts_arguments(module)
    return moe_experts(hidden_states, top_k_index, top_k_weights, w13, w2, **options)


def shard_transformers_experts(model: torch.nn.Module, *,
                               group: dist.ProcessGroup | None = None,
                               max_tokens: int | None = None,
                               transport: str = "symmetric_memory") -> int:
    """Spread a transformers model's experts over a process group's ranks:
    every experts module keeps this rank's share (with W ranks and E
    experts, rank r keeps experts `r * E/W` to `(r + 1) * E/W - 1`, its
    other weights dropped), and runs through `expert_parallel`, registered
    in transformers' `ExpertsInterface` and set as the model's experts
    implementation.

    Every rank loads the same model, calls this once, then runs the model on
    its own tokens (data parallel outside the experts), every rank the same
    number of forwards and backwards, in the same order: the ranks meet in
    each experts layer.  Each rank gets its own tokens' outputs; its experts'
    weight gradients sum every rank's tokens routed to them.

    Args:
        model: a transformers model whose experts modules
            `transformers_experts_forward` runs (SwiGLU experts and
            gpt-oss's), the same on every rank.
        group: the process group (default: the default group).
        max_tokens: the most tokens a rank passes an experts layer in one
            forward (batch x sequence), as `expert_parallel`'s.
        transport: as `expert_parallel`'s.

    Returns:
        The number of experts modules sharded.

    Raises:
        TypeError: max_tokens not an int.
        ValueError: no initialised process group; a module's number of
            experts not a multiple of W; experts `transformers_experts_forward`
            does not run; no experts module in the model.
    """
    group = expert_parallelism.resolved_group(group)
    if max_tokens is not None:
        check_types(ints=(("max_tokens", max_tokens),))
    from transformers.integrations.moe import ExpertsInterface

    world, rank = group.size(), group.rank()
    modules = [m for m in model.modules() if _is_experts(m)]
    if not modules:
        raise ValueError(f"model has no transformers experts module (gate_up_proj and "
                         f"down_proj): {type(model).__name__}")
    for module in modules:
        _activation_of(module)  # experts moe_experts does not run: refused before any change
        experts = module.gate_up_proj.shape[0]
        if experts % world:
            raise ValueError(f"{type(module).__name__} has {experts} experts, not a multiple "
                             f"of the group's {world} ranks")
    for module in modules:
        share = module.gate_up_proj.shape[0] // world
        for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
            weight = getattr(module, name, None)
            if isinstance(weight, torch.nn.Parameter):
                mine = weight.data[rank * share:(rank + 1) * share].clone()
                setattr(module, name, torch.nn.Parameter(mine, weight.requires_grad))
        module.expert_parallel = {"group": group, "max_tokens": max_tokens,
                                  "transport": transport}
    ExpertsInterface.register(EXPERT_PARALLEL, transformers_expert_parallel_forward)
    model.config._experts_implementation = EXPERT_PARALLEL
    return len(modules)


def transformers_expert_parallel_forward(module: torch.nn.Module, hidden_states: torch.Tensor,
                                         top_k_index: torch.Tensor,
                                         top_k_weights: torch.Tensor) -> torch.Tensor:
    """The forward of an experts module `shard_transformers_experts` sharded:
    `expert_parallel` with its share of the experts (transformers'
    `ExpertsInterface` signature: the module, `[T, H]` tokens, `[T, k]`
    global ids and weights)."""
    w13, w2, options = _experts_arguments(module)
    return expert_parallel(hidden_states, top_k_index, top_k_weights, w13, w2, **options,
                           **module.expert_parallel)


def _is_experts(module) -> bool:
    return hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")


def _experts_arguments(module) -> tuple:
    """(w13, w2, the other keyword arguments) of moe_experts for a transformers
    experts module, or a TypeError / ValueError."""
    activation = _activation_of(module)
    if not _is_experts(module):
        raise TypeError(f"module must be a transformers experts module (gate_up_proj and "
                        f"down_proj), got {type(module).__name__}")
    transposed = getattr(module, "is_transposed", False)
    w13, w2 = (w.mT if transposed else w for w in (module.gate_up_proj, module.down_proj))
    has_bias = getattr(module, "has_bias", False)
    return w13, w2, {"gate_up": "concatenated" if getattr(module, "is_concatenated", True)
                     else "interleaved", "activation": activation,
                     "b13": module.gate_up_proj_bias if has_bias else None,
                     "b2": module.down_proj_bias if has_bias else None}


def _activation_of(module) -> str:
    """moe_experts' activation for a transformers experts module, or a ValueError."""
    name = type(module).__name__
    apply_gate = getattr(type(module), "_apply_gate", None)
    own_gate = getattr(apply_gate, "__name__", "_default_apply_gate") != "_default_apply_gate"
    if name == "GptOssExperts":
        constants = (getattr(module, "alpha", None), getattr(module, "limit", None))
        if constants != (GPT_OSS_ALPHA, GPT_OSS_LIMIT):
            raise ValueError(f"{name}: moe_experts runs gpt-oss's activation with alpha "
                             f"{GPT_OSS_ALPHA} and limit {GPT_OSS_LIMIT}, this module has "
                             f"(alpha, limit) = {constants}")
        return "gpt_oss"
    if not getattr(module, "has_gate", True) or own_gate:
        raise ValueError(f"{name}: moe_experts runs SwiGLU experts (silu(gate) * up) and "
                         f"gpt-oss's, not this module's own gating")
    activation = getattr(module, "act_fn", None)
    if activation is not None and type(activation).__name__ not in ("SiLU", "SiLUActivation"):
        raise ValueError(f"{name}: moe_experts runs SwiGLU experts only, this module's "
                         f"activation is {type(activation).__name__}")
    return "swiglu"
