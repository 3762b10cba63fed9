"""torchtitan-style MoE layers written with torch alone around a grouped
product passed in (gg_runtime.grouped_mm or torch._grouped_mm): the anchors
the benchmarks time and the tests compare moe_experts with."""
from __future__ import annotations

import torch

from ..moe.choices import GPT_OSS_ALPHA, GPT_OSS_LIMIT


def with_added_bias(mm):
    """mm(a, b, offs, bias) for a grouped product that takes no bias
    (torch._grouped_mm refuses one): mm(a, b, offs), then bias[g] added to
    the rows of each group g (found on the GPU from offs), in float32 so that
    the bias gradient, a sum over the group's rows, is not summed in bf16."""
    def run(a, b, offs, bias=None):
        out = mm(a, b, offs)
        if bias is None:
            return out
        rows = torch.arange(a.shape[0], dtype=offs.dtype, device=a.device)
        group = torch.searchsorted(offs, rows, right=True).clamp(max=bias.shape[0] - 1)
        return (out.float() + bias.float()[group]).to(out.dtype)
    return run


def route_top_k(x, router, top_k: int):
    """The router's choice, in float32 (so a float32 copy of the layer picks
    the same experts): (weights [T, k], expert ids [T, k])."""
    return torch.topk(torch.softmax(x.float() @ router.float(), dim=-1), top_k, dim=-1)


def sorted_by_expert(chosen, experts: int):
    """(token slots sorted by expert, the groups' end offsets), on the GPU."""
    order = chosen.flatten().argsort(stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=chosen.device)
    counts.scatter_add_(0, chosen.flatten(), torch.ones_like(chosen.flatten(), dtype=torch.int32))
    return order, counts.cumsum(0, dtype=torch.int32)




def gated_activation(gu, interleaved: bool = False, activation: str = "swiglu"):
    """act(gate, up) of each row of gu [R, 2I] as transformers writes it:
    "swiglu" silu(gate) * up, "gpt_oss" gpt-oss's clamped form; gate and up
    the halves of a row, or its even and odd columns (interleaved)."""
    gate, up = (gu[:, 0::2], gu[:, 1::2]) if interleaved else gu.chunk(2, dim=-1)
    if activation == "gpt_oss":
        gate, up = gate.clamp(max=GPT_OSS_LIMIT), up.clamp(min=-GPT_OSS_LIMIT, max=GPT_OSS_LIMIT)
        return (up + 1) * gate * torch.sigmoid(gate * GPT_OSS_ALPHA)
    return torch.nn.functional.silu(gate) * up


def moe_layer(mm, x, router, w13, w2, top_k: int, b13=None, b2=None, activation="swiglu",
              interleaved=False) -> torch.Tensor:
    """A torchtitan-style token-choice MoE layer whose grouped products are
    mm(a, b, offs, bias) (gg_runtime.grouped_mm, or with_added_bias of
    torch._grouped_mm): router top-k, token slots sorted by expert, rows
    gathered, up projection (+ b13), gated_activation, down projection (+ b2),
    scaled by the routing weight, added back per token (index_add_: bf16
    atomics).  Routing stays on the GPU (no host sync)."""
    weights, chosen = route_top_k(x, router, top_k)
    order, offs = sorted_by_expert(chosen, w13.shape[0])
    token = order // top_k
    gu = mm(x[token], w13.transpose(1, 2), offs, b13)
    y = mm(gated_activation(gu, interleaved, activation), w2.transpose(1, 2), offs, b2)
    y = y * weights.flatten()[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def moe_layer_no_atomics(mm, x, router, w13, w2, top_k: int, b13=None, b2=None,
                         activation="swiglu", interleaved=False) -> torch.Tensor:
    """moe_layer with the gather and the combine through index_select (the
    sorted outputs put back in slot order by the inverse permutation, scaled
    and summed over each token's k slots): no atomics in the forward.  Same
    grouped products and activation."""
    weights, chosen = route_top_k(x, router, top_k)
    order, offs = sorted_by_expert(chosen, w13.shape[0])
    inverse = order.argsort()
    gu = mm(x.index_select(0, order // top_k), w13.transpose(1, 2), offs, b13)
    y = mm(gated_activation(gu, interleaved, activation), w2.transpose(1, 2), offs, b2)
    y = y.index_select(0, inverse).view(*chosen.shape, -1)
    return (y * weights.to(y.dtype).unsqueeze(-1)).sum(1)
