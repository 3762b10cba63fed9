"""transformers_experts_forward: a transformers experts module run by moe_experts."""
from __future__ import annotations

import torch

from .choices import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from .experts import moe_experts


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
    activation = _activation_of(module)
    if not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj")):
        raise TypeError(f"module must be a transformers experts module (gate_up_proj and "
                        f"down_proj), got {type(module).__name__}")
    transposed = getattr(module, "is_transposed", False)
    weights = [module.gate_up_proj, module.down_proj]
    w13, w2 = (w.mT if transposed else w for w in weights)
    has_bias = getattr(module, "has_bias", False)
    return moe_experts(hidden_states, top_k_index, top_k_weights, w13, w2,
                       gate_up="concatenated" if getattr(module, "is_concatenated", True)
                       else "interleaved", activation=activation,
                       b13=module.gate_up_proj_bias if has_bias else None,
                       b2=module.down_proj_bias if has_bias else None)


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
