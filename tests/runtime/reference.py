"""Float32 references and case generators shared by the tests and the benchmark."""
import torch

TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN anywhere in out fails any tolerance."""
    out = out.float()
    if torch.isnan(out).any():
        return float("inf")
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


def ref_list(As, Bs, trans_b=False):
    return [a.float() @ (b.float().t() if trans_b else b.float()) for a, b in zip(As, Bs)]


def effective_ends(offs: torch.Tensor, total: int) -> list:
    """e_g = clamp(max(offs[0..g]), 0, total), the documented reading of offsets."""
    ends, running = [], 0
    for value in offs.tolist():
        running = max(running, value)
        ends.append(min(max(running, 0), total))
    return ends


def ref_grouped_mm(a, b, offs=None):
    a32, b32 = a.float(), b.float()
    if a.dim() == 3:
        return torch.bmm(a32, b32)
    if b.dim() == 3:  # ragged M
        out = torch.zeros(a.shape[0], b.shape[2], device=a.device)
        start = 0
        for g, end in enumerate(effective_ends(offs, a.shape[0])):
            out[start:end] = a32[start:end] @ b32[g]
            start = end
        return out
    out = torch.zeros(offs.shape[0], a.shape[0], b.shape[1], device=a.device)  # ragged K
    start = 0
    for g, end in enumerate(effective_ends(offs, a.shape[1])):
        out[g] = a32[:, start:end] @ b32[start:end]
        start = end
    return out


def offsets_from_counts(counts, device) -> torch.Tensor:
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


def randn(*shape, dtype, device="cuda", scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)
