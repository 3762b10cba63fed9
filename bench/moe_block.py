"""A small MoE model for the end-to-end row of `make bench`: two blocks of
router -> top-k -> tokens sorted by expert -> gated up projection -> down
projection -> weighted scatter back, with a residual, in bf16.  The grouped
matrix product is a parameter, so one model runs on gg_runtime and on torch."""
import torch
import torch.nn.functional as F


class MoEBlock(torch.nn.Module):
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


def moe_model(mm, dim=2048, hidden=1024, experts=32, top_k=2, layers=2, seed=0):
    torch.manual_seed(seed)
    blocks = [MoEBlock(dim, hidden, experts, top_k, mm) for _ in range(layers)]
    return torch.nn.Sequential(*blocks).to(device="cuda", dtype=torch.bfloat16)
