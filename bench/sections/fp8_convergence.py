"""fp8 training converges as bf16 does (issue 49's criterion): a 4-layer
MoE language model trained from one initialisation on one fixed synthetic
token stream, its experts a torch layer whose products are bf16 grouped_mm
or fp8_grouped_mm in each recipe, or moe_experts in bf16 or with each fp8
recipe (the router, embeddings and head in bf16 alike).  The stream is a
first-order Markov chain with a few likely successors per token (its
entropy is the loss floor); the model sees the current and the previous
token.  Reported: each run's loss curve (a plot) and its final loss (the
mean of the last 25 steps) against bf16's."""
from __future__ import annotations

import math

import torch

import gg_runtime
from gg_runtime.testing import moe_layer, route_top_k

from ..markdown import fmt, table
from ..plotting import pyplot, save

TITLE = "fp8 training: convergence"
VOCAB, DIM, EXPERTS, INTER, TOP_K, LAYERS = 2048, 1024, 8, 1024, 2, 4
SUCCESSORS = 8  # likely next tokens of each token
SEQUENCES, LENGTH, STEPS, LR, TAIL = 16, 512, 300, 1e-3, 25
RECIPES = ("rowwise", "blockwise")


def run(context) -> dict:
    chain = markov_chain()
    stream = token_stream(chain)
    runs = {"bf16": train(torch_layer(lambda a, b, offs, bias=None:
                                      gg_runtime.grouped_mm(a, b, offs)), stream)}
    for recipe in RECIPES:
        runs[recipe] = train(torch_layer(lambda a, b, offs, bias=None, r=recipe:
                                         gg_runtime.fp8_grouped_mm(a, b, offs, recipe=r)), stream)
    for recipe in (None,) + RECIPES:
        runs[f"moe_experts {recipe or 'bf16'}"] = train(fused_layer(recipe), stream)
    data = {"model": {"vocab": VOCAB, "dim": DIM, "experts": EXPERTS, "inter": INTER,
                      "top_k": TOP_K, "layers": LAYERS, "batch_tokens": SEQUENCES * LENGTH,
                      "steps": STEPS, "lr": LR},
            "entropy": chain_entropy(chain), "losses": runs,
            "final": {name: sum(losses[-TAIL:]) / TAIL for name, losses in runs.items()}}
    path, link = context.plot_path("fp8_convergence.png")
    if plot(runs, data["entropy"], path):
        data["plot"] = link
    return data


def markov_chain() -> torch.Tensor:
    """[VOCAB, VOCAB] transition probabilities: SUCCESSORS random next tokens
    per token with Zipf weights, and a little mass on every token."""
    generator = torch.Generator(device="cuda").manual_seed(1234)
    probs = torch.full((VOCAB, VOCAB), 0.05 / VOCAB, device="cuda")
    successors = torch.randint(VOCAB, (VOCAB, SUCCESSORS), device="cuda", generator=generator)
    zipf = 1.0 / torch.arange(1, SUCCESSORS + 1, device="cuda")
    probs.scatter_add_(1, successors, (0.95 * zipf / zipf.sum()).expand(VOCAB, -1).contiguous())
    return probs / probs.sum(1, keepdim=True)


def chain_entropy(probs) -> float:
    """The stream's cross-entropy floor (nats), under its stationary distribution."""
    state = torch.full((VOCAB,), 1.0 / VOCAB, device="cuda")
    for _ in range(200):
        state = state @ probs
    return float(-(state[:, None] * probs * probs.clamp_min(1e-30).log()).sum())


def token_stream(chain) -> torch.Tensor:
    """[STEPS, SEQUENCES, LENGTH + 2] tokens: each step's SEQUENCES walks of
    the chain (the same for every run)."""
    generator = torch.Generator(device="cuda").manual_seed(5678)
    walks = STEPS * SEQUENCES
    tokens = [torch.randint(VOCAB, (walks,), device="cuda", generator=generator)]
    for _ in range(LENGTH + 1):
        tokens.append(torch.multinomial(chain[tokens[-1]], 1, generator=generator)[:, 0])
    return torch.stack(tokens, 1).view(STEPS, SEQUENCES, LENGTH + 2)


def torch_layer(mm):
    """The experts as a torch layer whose grouped products are mm's."""
    return lambda x, router, w13, w2: moe_layer(mm, x, router, w13, w2, TOP_K)


def fused_layer(recipe):
    """The experts as moe_experts (fp8=recipe), routed as moe_layer routes."""
    def layer(x, router, w13, w2):
        weights, chosen = route_top_k(x, router, TOP_K)
        return gg_runtime.moe_experts(x, chosen, weights, w13, w2, fp8=recipe)
    return layer


class Model(torch.nn.Module):
    """Embeddings of the current and previous token, LAYERS residual MoE
    blocks (RMS norm, router, `experts`), a head; float32 parameters, run in
    bf16."""

    def __init__(self, experts):
        super().__init__()
        self.experts = experts
        self.embed = torch.nn.Parameter(torch.randn(VOCAB, DIM) * 0.02)
        self.embed_prev = torch.nn.Parameter(torch.randn(VOCAB, DIM) * 0.02)
        self.routers = torch.nn.Parameter(torch.randn(LAYERS, DIM, EXPERTS) * DIM ** -0.5)
        self.w13 = torch.nn.Parameter(torch.randn(LAYERS, EXPERTS, 2 * INTER, DIM) * DIM ** -0.5)
        self.w2 = torch.nn.Parameter(torch.randn(LAYERS, EXPERTS, DIM, INTER) * INTER ** -0.5
                                     / math.sqrt(2 * LAYERS))
        self.head = torch.nn.Parameter(torch.randn(DIM, VOCAB) * DIM ** -0.5)

    def forward(self, current, previous):
        bf16 = torch.bfloat16
        x = (self.embed[current] + self.embed_prev[previous]).to(bf16)
        for layer in range(LAYERS):
            h = torch.nn.functional.rms_norm(x, (DIM,))
            x = x + self.experts(h, self.routers[layer].to(bf16), self.w13[layer].to(bf16),
                                 self.w2[layer].to(bf16))
        return torch.nn.functional.rms_norm(x, (DIM,)) @ self.head.to(bf16)


def train(experts, stream) -> list:
    """The loss of each step (predicting token t + 1 from tokens t and t - 1)."""
    torch.manual_seed(0)
    model = Model(experts).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = []
    for tokens in stream:
        logits = model(tokens[:, 1:-1].reshape(-1), tokens[:, :-2].reshape(-1))
        loss = torch.nn.functional.cross_entropy(logits.float(), tokens[:, 2:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def plot(runs, entropy, path) -> bool:
    """The loss curves at `path`; False where matplotlib is not importable."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, losses in runs.items():
        ax.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1)
    ax.axhline(entropy, color="grey", linestyle=":", label="the stream's entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_yscale("log")
    ax.set_title(f"fp8 vs bf16 experts: a {LAYERS}-layer MoE LM, "
                 f"{torch.cuda.get_device_name()}")
    ax.legend()
    save(fig, path)
    return True


def bf16_of(run: str) -> str:
    """The bf16 run a run is compared with: moe_experts' own, or the torch layer's."""
    return "moe_experts bf16" if run.startswith("moe_experts") else "bf16"


def report(data) -> list:
    m, final = data["model"], data["final"]
    lines = [f"A {m['layers']}-layer MoE language model (vocabulary {m['vocab']}, width "
             f"{m['dim']}, {m['experts']} experts of {m['inter']}, top-{m['top_k']}), "
             f"{m['steps']} AdamW steps (lr {m['lr']}) of {m['batch_tokens']} tokens from one "
             "initialisation and one synthetic Markov stream; the experts a torch layer "
             "whose products are bf16 (grouped_mm) or fp8 (fp8_grouped_mm, by recipe), or "
             "moe_experts in bf16 or fp8 (fp8=recipe). Final loss: the mean of the last "
             f"{TAIL} steps; the stream's entropy {data['entropy']:.3f} nats is the floor.", ""]
    lines += table(["experts", "final loss", "x its bf16's"], [
        [name, f"{loss:.4f}", fmt(loss / final[bf16_of(name)], "{:.4f}")]
        for name, loss in final.items() if bf16_of(name) in final])
    if "plot" in data:
        lines += ["", f"![loss curves]({data['plot']})"]
    return lines
