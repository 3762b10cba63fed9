"""Case generators, float32 references and a timer, shared by the tests
(tests/runtime/conftest.py puts this folder on their path), the benchmark and
`aot tune`.  It imports torch only: not part of the gg_runtime package."""
from __future__ import annotations

import contextlib
import statistics

import torch

TOLERANCE = {torch.float16: 3e-3, torch.bfloat16: 1.5e-2, torch.float32: 1e-5}
TF32_TOLERANCE = 5e-3  # float32 inputs with TF32 products
FLOAT32_OUTPUT_TOLERANCE = 1e-4  # 16-bit inputs, float32 output: only the summation order differs


def tolerance(dtype, out_dtype=None, tf32=False) -> float:
    """Relative error allowed against a float32 reference of the same inputs."""
    if tf32:
        return TF32_TOLERANCE
    if out_dtype is torch.float32 and dtype is not torch.float32:
        return FLOAT32_OUTPUT_TOLERANCE
    return TOLERANCE[dtype]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref||; NaN anywhere in out fails any tolerance."""
    out = out.float()
    if torch.isnan(out).any():
        return float("inf")
    denom = ref.norm().item()
    diff = (out - ref).norm().item()
    return diff / denom if denom > 0 else diff


@contextlib.contextmanager
def tf32_allowed(allowed: bool):
    """Within the block torch allows TF32 for float32 matmuls, or not (the
    setting gg_runtime follows); the previous setting is restored."""
    matmul = torch.backends.cuda.matmul
    name = "fp32_precision" if hasattr(matmul, "fp32_precision") else "allow_tf32"
    value = ("tf32" if allowed else "ieee") if name == "fp32_precision" else allowed
    before = getattr(matmul, name)
    setattr(matmul, name, value)
    try:
        yield
    finally:
        setattr(matmul, name, before)


# ---------------------------------------------------------------- references

def ref_list(As, Bs, trans_b=False):
    return [a.float() @ (b.float().t() if trans_b else b.float()) for a, b in zip(As, Bs)]


def effective_ends(offs: torch.Tensor, total: int) -> list:
    """e_g = clamp(max(offs[0..g]), 0, total), the documented reading of offsets."""
    ends, running = [], 0
    for value in offs.tolist():
        running = max(running, value)
        ends.append(min(max(running, 0), total))
    return ends


def group_slices(a, b, offs=None):
    """(group, index of its part of grouped_mm's output, its a, its b) for each
    group, the case told by the operands' dims and offsets read as
    effective_ends; for ragged M and N then ("past the groups", index of the
    part no group covers, None, None)."""
    if a.dim() == 3 and b.dim() == 3:  # batched
        for g in range(a.shape[0]):
            yield g, g, a[g], b[g]
        return
    ragged = b.shape[1] if a.dim() == 3 else a.shape[0] if b.dim() == 3 else a.shape[1]
    start = 0
    for g, end in enumerate(effective_ends(offs, ragged)):
        if a.dim() == 3:  # ragged N: columns of the output
            yield g, (slice(None), slice(start, end)), a[g], b[:, start:end]
        elif b.dim() == 3:  # ragged M: rows
            yield g, slice(start, end), a[start:end], b[g]
        else:  # ragged K: one output per group
            yield g, g, a[:, start:end], b[start:end]
        start = end
    if a.dim() == 3:
        yield "past the groups", (slice(None), slice(start, None)), None, None
    elif b.dim() == 3:
        yield "past the groups", slice(start, None), None, None


def ref_grouped_mm(a, b, offs=None, bias=None):
    """grouped_mm in float32, group by group (bias[g] added to group g's rows)."""
    a32, b32 = a.float(), b.float()
    shape = {(3, 3): lambda: (a.shape[0], a.shape[1], b.shape[2]),
             (3, 2): lambda: (a.shape[1], b.shape[1]),
             (2, 3): lambda: (a.shape[0], b.shape[2]),
             (2, 2): lambda: (offs.shape[0], a.shape[0], b.shape[1])}[(a.dim(), b.dim())]()
    out = torch.zeros(shape, device=a.device)
    for g, index, x, y in group_slices(a32, b32, offs):
        if x is not None:
            out[index] = x @ y if bias is None else x @ y + bias[g].float()
    return out


def ref_grouped_mm_grads(a, b, offs, grad, bias=None):
    """(grad_a, grad_b) of ref_grouped_mm(a, b, offs), and grad_bias where bias
    is given, for the output gradient grad, in float32."""
    inputs = [x.detach().float().requires_grad_() for x in (a, b) + (() if bias is None
                                                                      else (bias,))]
    out = ref_grouped_mm(*inputs[:2], offs, *inputs[2:])
    return torch.autograd.grad(out, inputs, grad.float())


def group_parts(a, b, offs, out):
    """(group, its part of grouped_mm's out, that part computed in float64)
    group by group (a wrong small group cannot hide in a large one's norm);
    for ragged M and N then the part past the last group, which must be zero."""
    for g, index, x, y in group_slices(a, b, offs):
        part = out[index]
        if x is None:
            yield g, part, torch.zeros_like(part, dtype=torch.float64)
        else:
            yield g, part, x.double() @ y.double()


# ---------------------------------------------------------------- fp8

FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_BLOCK = 128
# Against float32 products of the dequantised inputs.  float32 output: fp8 tensor
# cores do not accumulate in IEEE float32 (1.8e-4 measured on an H200, K = 208).
FP8_TOLERANCE = {torch.bfloat16: 1e-2, torch.float32: 1e-3}


def _blocks(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [R, C] as [ceil(R/rows), ceil(C/128), rows, 128], zero-padded."""
    r, c = x.shape
    row_blocks, col_blocks = -(-r // rows), -(-c // FP8_BLOCK)
    padded = x.new_zeros(row_blocks * rows, col_blocks * FP8_BLOCK)
    padded[:r, :c] = x
    return padded.view(row_blocks, rows, col_blocks, FP8_BLOCK).transpose(1, 2)


def _expand(scale: torch.Tensor, rows: int, shape) -> torch.Tensor:
    """Per-block scales [RB, CB] spread over the [R, C] elements they cover."""
    full = scale.repeat_interleave(rows, 0).repeat_interleave(FP8_BLOCK, 1)
    return full[:shape[0], :shape[1]]


def quantize_ref(x: torch.Tensor, granularity: str):
    """(q, scale) with x ~ q * scale, in float32 torch: scale = amax / 448 over
    a row ('rowwise'), a 1x128 or a 128x128 block; x 2-D [R, C], or 3-D
    [G, R, C] quantised group by group."""
    if x.dim() == 3:
        pairs = [quantize_ref(group, granularity) for group in x]
        return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])
    x = x.float()
    if granularity == "rowwise":
        amax = x.abs().amax(dim=1) if x.shape[1] else x.new_zeros(x.shape[0])
        scale = amax.clamp(min=1e-12) / FP8_MAX
        full = scale[:, None]
    else:
        rows = 1 if granularity == "1x128" else FP8_BLOCK
        scale = _blocks(x, rows).abs().amax(dim=(2, 3)).clamp(min=1e-12) / FP8_MAX
        full = _expand(scale, rows, x.shape)
    q = (x / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def dequantize_ref(q: torch.Tensor, scale: torch.Tensor, granularity: str) -> torch.Tensor:
    """float32 q * scale, the inverse of quantize_ref's layout."""
    if q.dim() == 3:
        return torch.stack([dequantize_ref(g, s, granularity) for g, s in zip(q, scale)])
    if granularity == "rowwise":
        return q.float() * scale[:, None]
    rows = 1 if granularity == "1x128" else FP8_BLOCK
    return q.float() * _expand(scale, rows, q.shape)


def fp8_moe_inputs(counts, n: int, k: int, granularity: str, device="cuda"):
    """(a [T, K], b [G, K, N] K-major, scale_a, scale_b, offs) quantised from
    random data: 'rowwise' or 'blockwise' (1x128 activations, 128x128 weights)."""
    x = randn(sum(counts), k, dtype=torch.float32, device=device)
    w = randn(len(counts), n, k, dtype=torch.float32, device=device, scale=max(k, 1) ** -0.5)
    a_kind, b_kind = ("rowwise", "rowwise") if granularity == "rowwise" else ("1x128", "128x128")
    a, scale_a = quantize_ref(x, a_kind)
    b, scale_b = quantize_ref(w, b_kind)
    return a, b.transpose(1, 2), scale_a, scale_b, offsets_from_counts(counts, device)


def dequantized(a, b, scale_a, scale_b, granularity: str):
    """float32 (a, b) of scaled_grouped_mm's inputs (b [G, K, N] K-major)."""
    a_kind, b_kind = ("rowwise", "rowwise") if granularity == "rowwise" else ("1x128", "128x128")
    a32 = dequantize_ref(a, scale_a, a_kind)
    return a32, dequantize_ref(b.transpose(-2, -1), scale_b, b_kind).transpose(-2, -1)


def ref_scaled_grouped_mm(a, b, scale_a, scale_b, offs, granularity: str) -> torch.Tensor:
    """scaled_grouped_mm in float32 on the dequantised inputs (b [G, K, N] K-major)."""
    return ref_grouped_mm(*dequantized(a, b, scale_a, scale_b, granularity), offs)


# ---------------------------------------------------------------- cases

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


# gpt-oss's activation constants (transformers' GptOssExperts alpha and limit).
GPT_OSS_ALPHA, GPT_OSS_LIMIT = 1.702, 7.0


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


# ---------------------------------------------------------------- timing

_flush = None


def time_in_turns(fns: dict, turns: int = 5) -> dict:
    """{name: median ms} of each fn over `turns` turns of time_ms, all the
    fns timed in each turn, in reverse order every other turn: the GPU's clock
    drifts within a run (bench/RESULTS.md), and this spreads the drift over
    all of them alike."""
    times = {name: [] for name in fns}
    for turn in range(turns):
        for name in (list(fns) if turn % 2 == 0 else list(reversed(fns))):
            times[name].append(time_ms(fns[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def time_ms(fn, warmup_ms=25.0, rep_ms=100.0) -> float:
    """Median ms of fn() over about rep_ms of repetitions, CUDA events around
    each, the L2 cache flushed before each."""
    global _flush
    if _flush is None:
        _flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    times = []
    for _ in range(max(10, min(1000, int(rep_ms / estimate)))):
        _flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# Test hooks of the runtime (process-wide, not for concurrent use); gg_runtime is
# imported when they run, so that `aot tune` can use this file without it.

@contextlib.contextmanager
def forced(variant: str = "", basic: bool = False):
    """Within the block every launch runs exactly `variant` (an error if it
    cannot run the call), or with basic=True only `basic` variants."""
    from gg_runtime import _C
    _C.set_override(variant, basic)
    try:
        yield
    finally:
        _C.set_override("", False)


def last_variant() -> str:
    """Key of the variant this thread's last launch ran ('' if it launched nothing)."""
    from gg_runtime import _C
    return _C.last_variant()


@contextlib.contextmanager
def poisoned():
    """Within the block every output the operators allocate starts as NaN, so
    elements a kernel fails to write show."""
    from gg_runtime import _ops
    _ops.set_poison(True)
    try:
        yield
    finally:
        _ops.set_poison(False)
