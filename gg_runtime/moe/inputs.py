"""MoeInputs: one call's tensors and choices as moe_experts' host paths pass
them on, in the operators' order (csrc/ops/moe_inputs.h's MoeInputs, then
gate_up and activation), so that `op(*inputs, ...)` calls them."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class MoeInputs(NamedTuple):
    x: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor
    b13: Optional[torch.Tensor]
    b2: Optional[torch.Tensor]
    gate_up: str
    activation: str

    def wants_gradient(self) -> bool:
        """Whether autograd records the call (else nothing is kept).  Spelled
        out, not a loop: the forward's host time counts."""
        return torch.is_grad_enabled() and (
            self.x.requires_grad or self.topk_weights.requires_grad or self.w13.requires_grad
            or self.w2.requires_grad or (self.b13 is not None and self.b13.requires_grad)
            or (self.b2 is not None and self.b2.requires_grad))
