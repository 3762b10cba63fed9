"""MoEExperts: moe_experts as an nn.Module with transformers' parameter names."""
from __future__ import annotations

import torch

from .._native import check_types
from ..formats import RECIPES
from ..fp8_expert_weights import Fp8ExpertWeights, quantize_expert_weights
from .choices import check_choices
from .experts import moe_experts


class MoEExperts(torch.nn.Module):
    """The experts of a token-choice MoE layer (`moe_experts`) as a module.

    Its parameters have the names and layouts of transformers' fused experts:
    `gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]` and, with `bias=True`,
    `gate_up_proj_bias [E, 2I]` and `down_proj_bias [E, H]`, initialised as
    nn.Linear's, expert by expert.  `forward(hidden_states [T, H],
    top_k_index [T, k], top_k_weights [T, k]) -> [T, H]`, as transformers
    calls its experts module: `moe_experts` with these parameters.

    Args:
        num_experts: E.
        hidden_size: H, the tokens' width.
        intermediate_size: I, each expert's hidden width (w13 has 2I rows).
        gate_up: `"concatenated"` or `"interleaved"`, as in `moe_experts`.
        activation: `"swiglu"` or `"gpt_oss"`, as in `moe_experts`.
        bias: whether the two projections have biases (gpt-oss's do).
        fp8: None, or an fp8 training recipe, `"blockwise"` or `"rowwise"`
            (`moe_experts`' `fp8`): the module then quantizes its weights
            once after each change (an optimizer step, found by the weights'
            version counters: `quantize_expert_weights`) and its calls
            until the next change reuse them, as gradient accumulation's
            micro-batches do.  The module keeps those fp8 copies, as many
            bytes as its weights, between calls.  Writes through `.data`
            bypass the version counters and are not seen (write the
            parameters under `torch.no_grad()` instead); `torch.compile`
            breaks its graph at the check.
        device (torch.device | str | None): where the parameters are made.
        dtype (torch.dtype | None): the parameters' dtype (float16 or bfloat16
            to run; with `fp8` also float32, master weights for 16-bit
            hidden states).

    Raises:
        TypeError: a size that is not an int.
        ValueError: a size below 1; an unknown gate_up, activation or fp8 recipe.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 gate_up: str = "concatenated", activation: str = "swiglu", bias: bool = False,
                 fp8: str | None = None, device=None, dtype=None):
        super().__init__()
        sizes = (("num_experts", num_experts), ("hidden_size", hidden_size),
                 ("intermediate_size", intermediate_size))
        check_types(ints=sizes)
        for name, size in sizes:
            if size < 1:
                raise ValueError(f"{name} must be at least 1, got {size}")
        check_choices(gate_up, activation)
        if fp8 is not None and fp8 not in RECIPES:
            raise ValueError(f"fp8 must be None or one of {RECIPES}, got {fp8!r}")
        self.gate_up, self.activation, self.fp8 = gate_up, activation, fp8
        self._fp8_weights = None  # quantize_expert_weights' of the weights as they are
        factory = {"device": device, "dtype": dtype}
        self.gate_up_proj = torch.nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size, **factory))
        self.down_proj = torch.nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size, **factory))
        self.gate_up_proj_bias = self.down_proj_bias = None
        if bias:
            self.gate_up_proj_bias = torch.nn.Parameter(
                torch.empty(num_experts, 2 * intermediate_size, **factory))
            self.down_proj_bias = torch.nn.Parameter(
                torch.empty(num_experts, hidden_size, **factory))
        self.reset_parameters()

    def reset_parameters(self):
        """nn.Linear's initialisation, expert by expert: uniform in ±1/sqrt(fan_in)."""
        for weight in (self.gate_up_proj, self.down_proj):
            bound = weight.shape[-1] ** -0.5
            torch.nn.init.uniform_(weight, -bound, bound)
        for bias, weight in ((self.gate_up_proj_bias, self.gate_up_proj),
                             (self.down_proj_bias, self.down_proj)):
            if bias is not None:
                bound = weight.shape[-1] ** -0.5
                torch.nn.init.uniform_(bias, -bound, bound)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """`moe_experts(hidden_states, top_k_index, top_k_weights, ...)` with this
        module's parameters, gate_up, activation and fp8: `[T, H]` -> `[T, H]`."""
        return moe_experts(hidden_states, top_k_index, top_k_weights, self.gate_up_proj,
                           self.down_proj, **self._options())

    def _options(self) -> dict:
        """moe_experts' keyword arguments from this module's settings and biases."""
        return {"gate_up": self.gate_up, "activation": self.activation,
                "b13": self.gate_up_proj_bias, "b2": self.down_proj_bias,
                "fp8": self._quantized_weights()}

    def _quantized_weights(self) -> Fp8ExpertWeights | None:
        """None without fp8, else the weights quantized once per change."""
        if self.fp8 is None:
            return None
        weights = (self.gate_up_proj, self.down_proj)
        if self._fp8_weights is None or not self._fp8_weights.matches(*weights):
            self._fp8_weights = None  # the old copies go before the new ones are made
            self._fp8_weights = quantize_expert_weights(*weights, fp8=self.fp8)
        return self._fp8_weights
