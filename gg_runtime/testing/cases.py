"""Inputs of the grouped products: random operands in every layout, group
sizes (skewed, random, empty groups) and their offsets, and an MoE layer's
tokens and parameters."""
from __future__ import annotations

import torch

def randn(*shape, dtype, device="cuda", scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


def operand(shape, row_major: bool, strided: bool, dtype, device="cuda"):
    """A tensor of `shape` ([rows, cols] or [batch, rows, cols]) whose last two
    dims are row-major or a transposed view of a row-major [cols, rows];
    strided: taken from a wider tensor (padded rows, every other batch)."""
    *batch, rows, cols = shape
    inner = (rows, cols) if row_major else (cols, rows)
    spread = 2 if strided else 1
    full = torch.randn(*[b * spread for b in batch], inner[0], inner[1] * spread, device=device)
    x = full.to(dtype)[..., : inner[1]]
    if batch:
        x = x[::spread]
    return x if row_major else x.transpose(-2, -1)


def offsets_from_counts(counts, device="cuda") -> torch.Tensor:
    return torch.tensor(counts, dtype=torch.int32, device=device).cumsum(0).to(torch.int32)


def skewed_counts(total: int, groups: int, zero_groups: int = 0, generator=None) -> list:
    """Token counts per expert summing to total, drawn from a skewed distribution,
    with `zero_groups` experts forced empty."""
    weights = torch.rand(groups, generator=generator) ** 3
    weights[torch.randperm(groups, generator=generator)[:zero_groups]] = 0
    if weights.sum() == 0:
        weights[0] = 1
    counts = (weights / weights.sum() * total).floor().long()
    counts[int(weights.argmax())] += total - int(counts.sum())
    return counts.tolist()


def random_group_sizes(rng) -> list:
    """Rows (or columns) per group drawn with rng (a random.Random): one
    group, a few large ones (the warp-specialised bucket), or 7 to 1,200 small
    ones; a fifth of them empty."""
    many = rng.choice((rng.randint(7, 64), rng.randint(1000, 1200)))
    groups, largest = rng.choice(((1, 700), (rng.randint(2, 6), 1500), (many, 9)))
    return [0 if rng.random() < 0.2 else rng.randint(1, largest) for _ in range(groups)]


def moe_inputs(counts, n: int, k: int, dtype, device="cuda"):
    """(a [T, K], weights [G, K, N] as a transposed view of nn.Linear-style
    [G, N, K], offs) for an MoE layer with `counts` tokens per expert."""
    a = randn(sum(counts), k, dtype=dtype, device=device)
    weights = randn(len(counts), n, k, dtype=dtype, device=device, scale=k ** -0.5)
    return a, weights.transpose(1, 2), offsets_from_counts(counts, device)


def list_inputs(mnks, dtype, device="cuda"):
    """(As, Bs) for groups of sizes [(M, N, K)], B as [K, N]."""
    As = [randn(m, k, dtype=dtype, device=device) for m, n, k in mnks]
    Bs = [randn(k, n, dtype=dtype, device=device, scale=max(k, 1) ** -0.5) for m, n, k in mnks]
    return As, Bs


def moe_layer_inputs(tokens: int, hidden: int, inter: int, experts: int, dtype=torch.bfloat16,
                     device="cuda", bias: bool = False) -> dict:
    """Tokens x [T, H] and the parameters of moe_layer, in the layouts models
    keep them: router [H, E], w13 [E, 2I, H] (gate rows, then up rows) and
    w2 [E, H, I] (nn.Linear-style), with bias the experts' biases b13 [E, 2I]
    and b2 [E, H] (as gpt-oss has), each requiring grad."""
    def param(*shape, fan_in):
        return randn(*shape, dtype=dtype, device=device, scale=fan_in ** -0.5).requires_grad_()

    inputs = {"x": randn(tokens, hidden, dtype=dtype, device=device).requires_grad_(),
              "router": param(hidden, experts, fan_in=hidden),
              "w13": param(experts, 2 * inter, hidden, fan_in=hidden),
              "w2": param(experts, hidden, inter, fan_in=inter)}
    if bias:
        inputs.update(b13=param(experts, 2 * inter, fan_in=hidden),
                      b2=param(experts, hidden, fan_in=inter))
    return inputs
