"""A small MoE model's forward with gg_runtime's and with torch's grouped_mm,
same weights and tokens: two blocks of router -> top-k -> tokens sorted by
expert -> gated up projection -> down projection -> weighted scatter back,
with a residual, in bf16; host time included (at these sizes the forward is
bound by the host)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import gg_runtime
from gg_runtime.testing import time_ms

from ..markdown import fmt, table

TITLE = "A 2-block MoE model's forward"
MODEL = {"dim": 2048, "hidden": 1024, "experts": 32, "top_k": 2, "layers": 2}


class MoEBlock(torch.nn.Module):
    """The grouped matrix product is a parameter, so one model runs on
    gg_runtime and on torch."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int, mm):
        super().__init__()
        self.top_k, self.mm = top_k, mm
        self.router = torch.nn.Linear(dim, experts, bias=False)
        self.up = torch.nn.Parameter(torch.randn(experts, 2 * hidden, dim) * dim ** -0.5)
        self.down = torch.nn.Parameter(torch.randn(experts, dim, hidden) * hidden ** -0.5)

    def forward(self, x):
        experts = self.up.shape[0]
        weights, chosen = torch.topk(F.softmax(self.router(x).float(), dim=-1), self.top_k, dim=-1)
        order = chosen.flatten().argsort()
        token = order // self.top_k
        offs = torch.bincount(chosen.flatten(), minlength=experts).cumsum(0).to(torch.int32)
        gate, up = self.mm(x[token], self.up.transpose(1, 2), offs).chunk(2, dim=-1)
        y = self.mm(F.silu(gate) * up, self.down.transpose(1, 2), offs)
        y = y * weights.flatten()[order, None].to(y.dtype)
        return x + torch.zeros_like(x).index_add_(0, token, y)


def moe_model(mm, dim: int, hidden: int, experts: int, top_k: int, layers: int, seed=0):
    torch.manual_seed(seed)
    blocks = [MoEBlock(dim, hidden, experts, top_k, mm) for _ in range(layers)]
    return torch.nn.Sequential(*blocks).to(device="cuda", dtype=torch.bfloat16)


def run(context) -> dict:
    """Measured in turns, three times each, best kept: the first turns run
    slower on a lent host."""
    rows = []
    for tokens in (2048, 8192):
        x = torch.randn(tokens, MODEL["dim"], device="cuda", dtype=torch.bfloat16)
        models = {"gg_runtime": moe_model(gg_runtime.grouped_mm, **MODEL),
                  "torch": moe_model(torch._grouped_mm, **MODEL)}
        times = {name: float("inf") for name in models}
        with torch.no_grad():
            for _ in range(3):
                for name, model in models.items():
                    times[name] = min(times[name], time_ms(lambda: model(x)))
        rows.append({"tokens": tokens, "ms": times,
                     "vs_torch": times["torch"] / times["gg_runtime"]})
    return {"model": MODEL, "forward": rows}


def report(data) -> list:
    model = ", ".join(f"{name} {value}" for name, value in data["model"].items())
    lines = [f"Model: {model}. x torch: torch's time / ours.", ""]
    return lines + table(["tokens", "gg_runtime ms", "torch ms", "x torch"], [
        [r["tokens"], f"{r['ms']['gg_runtime']:.2f}", f"{r['ms']['torch']:.2f}",
         fmt(r["vs_torch"])] for r in data["forward"]])
