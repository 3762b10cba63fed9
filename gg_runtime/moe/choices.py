"""The values moe_experts' gate_up and activation take, and their check."""
from __future__ import annotations

from .._native import _C

# The values the kernels are built for (aot/axes.py's Choices), the one
# description the operators parse them by.
_CHOICES = _C.choices()
GATE_UP_VALUES = tuple(_CHOICES["GateUp"])
# silu(gate) * up, and gpt-oss's clamped form (the kernels' GPT_OSS_ALPHA and
# GPT_OSS_LIMIT, aot/kernels/swiglu.py; a test holds them equal): (clamp(up, -7,
# 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
ACTIVATIONS = tuple(_CHOICES["Activation"])
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0


def check_choices(gate_up, activation):
    """Before anything is recorded for autograd (the operator parses them by
    the same values)."""
    if gate_up not in GATE_UP_VALUES:
        raise ValueError(f"gate_up must be one of {GATE_UP_VALUES}, got {gate_up!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
