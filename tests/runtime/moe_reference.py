"""The MoE experts as torch computes them without gg_runtime, expert by
expert: the reference of moe_experts' tests (in float32 or float64 for the
truth, in the inputs' dtype for torch's own error)."""
import torch
from problems import gated_activation


def layer_ref(x, topk_ids, topk_weights, w13, w2, b13=None, b2=None, interleaved=False,
              activation="swiglu"):
    """sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) in x's dtype;
    ids outside [0, E) add nothing."""
    out = torch.zeros_like(x)
    for e in range(w13.shape[0]):
        token, slot = torch.nonzero(topk_ids == e, as_tuple=True)
        gu = x[token] @ w13[e].T + (0 if b13 is None else b13[e])
        y = gated_activation(gu, interleaved, activation) @ w2[e].T + (0 if b2 is None else b2[e])
        out = out.index_add(0, token, y * topk_weights[token, slot, None].to(x.dtype))
    return out
