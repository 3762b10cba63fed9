"""vLLM's fused_experts for fp8 weights in 128 x 128 blocks (DeepSeek-V3's
format): vLLM's Triton kernels (bench/vendor_vllm.py copies them) driven by a
host path written here in torch, for the vllm_fp8 bench section.

It follows fused_experts_impl of vLLM 0.33.0 (the vendored kernel's
release-dependent options passed where it declares them): the tokens quantised per 1 x 128
group by vLLM's Triton kernel; the token slots assigned to blocks of
BLOCK_SIZE_M rows of one expert each (moe_align_block_size: slots sorted by
expert, each expert's padded to a multiple of BLOCK_SIZE_M), or, where
tokens * k * 4 <= E, one block per slot (vLLM's naive block assignment);
fused_moe_kernel for w13 (gate then up); SwiGLU; its output quantised again;
fused_moe_kernel for w2, the routing weights applied; each token's k outputs
summed.  One config for both products: vLLM's tuned one for this GPU and shape
where its JSON is vendored, else its H200 file for the shape as a named proxy
(vLLM 0.33 ships some shapes' files for the H200 only), else vLLM's default for
block fp8.  gemms_alone gives vLLM's two fused_moe_kernel launches by
themselves: a lower bound for vLLM's time, whose other launches are one small
CUDA op each in vLLM.

What differs from vLLM: moe_align_block_size, silu_and_mul and moe_sum are vLLM
CUDA ops, written here in torch (the alignment takes about ten launches where
vLLM's takes one, without a host sync either); and vLLM quantises with its CUDA
per_token_group_fp8_quant where it has it, the Triton kernel used here being
its fallback.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import NamedTuple

import torch

from gg_runtime.testing import FP8_BLOCK, FP8_MAX, gated_activation, sorted_by_expert

EPS = 1e-10  # per_token_group_quant_fp8's floor on a group's amax
# fused_experts_impl's test for one block per slot: tokens * k * NAIVE_SPARSITY <= E.
NAIVE_SPARSITY = 4
# The device whose tuned files stand in where vLLM has none for this GPU.
PROXY_DEVICE = "NVIDIA_H200"


class Plan(NamedTuple):
    """What vLLM decides on the host for one shape and token count."""
    config: dict  # BLOCK_SIZE_M/N/K, GROUP_SIZE_M, num_warps, num_stages
    tuned: str | None  # the tuned config's file name; None: vLLM's default
    source: str  # "tuned" (this GPU's file), "H200 proxy" or "default"
    swap_ab: bool  # fused_moe_kernel's SWAP_AB (sm90, M tile < 64, N tile >= 64)
    naive: bool  # one block per slot, no alignment


class Assignment(NamedTuple):
    """fused_moe_kernel's view of the token slots."""
    sorted_ids: torch.Tensor | None  # int32 slots by block, padded with `slots`; None: naive
    expert_ids: torch.Tensor  # each block's expert
    padded_slots: torch.Tensor  # [1] int32: blocks at or past it are skipped


def device_file_name() -> str:
    """This GPU's name as vLLM's config files spell it (any H200 as NVIDIA_H200)."""
    name = re.sub(r"[\s/]+", "_", torch.cuda.get_device_name())
    return "NVIDIA_H200" if "H200" in name.split("_") else name


def config_file_name(experts: int, inter: int, device: str) -> str:
    return (f"E={experts},N={inter},device_name={device},dtype=fp8_w8a8,"
            f"block_shape=[{FP8_BLOCK},{FP8_BLOCK}].json")


def default_config(tokens: int) -> dict:
    """vLLM's get_default_config for fp8 in 128 x 128 blocks on CUDA."""
    decode = tokens <= 8
    return {"BLOCK_SIZE_M": 16 if tokens <= 64 else 64,
            "BLOCK_SIZE_N": 64 if decode else FP8_BLOCK, "BLOCK_SIZE_K": FP8_BLOCK,
            "GROUP_SIZE_M": 1 if tokens <= 16 else 32, "num_warps": 4,
            "num_stages": (4 if tokens <= 4 else 3) if decode else 3}


def tuned_file(configs: Path, experts: int, inter: int, device: str) -> tuple:
    """(vLLM's tuned file in `configs` for the shape on `device`, "tuned");
    else the H200's, "H200 proxy"; else (None, "default")."""
    for owner, source in ((device, "tuned"), (PROXY_DEVICE, "H200 proxy")):
        path = configs / config_file_name(experts, inter, owner)
        if path.exists():
            return path, source
    return None, "default"


def plan(kernels, experts: int, inter: int, top_k: int, tokens: int) -> Plan:
    """vLLM's choices for `tokens` tokens on experts of intermediate size
    `inter`: the config of the nearest token count in the tuned file
    (tuned_file) where there is one, else vLLM's default; the transposed
    product where the vendored kernel has one (SWAP_AB)."""
    path, source = tuned_file(kernels.configs, experts, inter, device_file_name())
    if path is None:
        name, config = None, default_config(tokens)
    else:
        table = {int(m): c for m, c in json.loads(path.read_text()).items()
                 if m != "triton_version"}
        name, config = path.name, table[min(table, key=lambda m: abs(m - tokens))]
    swap_ab = ("SWAP_AB" in kernels.fused_moe_params
               and torch.cuda.get_device_capability() == (9, 0) and config["BLOCK_SIZE_M"] < 64
               and config["BLOCK_SIZE_N"] >= 64)
    return Plan(config, name, source, swap_ab, tokens * top_k * NAIVE_SPARSITY <= experts)


def aligned_by_expert(topk_ids: torch.Tensor, experts: int, block_m: int) -> Assignment:
    """vLLM's moe_align_block_size in torch, on the GPU without a host sync:
    the slots (token * k + j) sorted by expert, each expert's padded with the
    sentinel `slots` to a multiple of block_m; each block's expert (blocks
    past the padded slots, which the kernel skips, get the last expert).
    vLLM's is one CUDA op; the order of slots within an expert may differ."""
    slots = topk_ids.numel()
    capacity = slots + experts * (block_m - 1)
    if slots < experts:
        capacity = min(capacity, slots * block_m)
    order, ends = sorted_by_expert(topk_ids.long(), experts)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_ends = padded.cumsum(0, dtype=torch.int32)
    expert = topk_ids.flatten()[order].long()
    rank = torch.arange(slots, device=topk_ids.device) - (ends - counts)[expert]
    place = (padded_ends - padded)[expert] + rank
    sorted_ids = torch.full((capacity,), slots, dtype=torch.int32, device=topk_ids.device)
    sorted_ids.scatter_(0, place, order.int())
    block_starts = torch.arange(0, capacity, block_m, dtype=torch.int32, device=topk_ids.device)
    expert_ids = torch.searchsorted(padded_ends, block_starts, right=True)
    return Assignment(sorted_ids, expert_ids.clamp_(max=experts - 1).int(), padded_ends[-1:])


def assignment(topk_ids: torch.Tensor, experts: int, chosen: Plan) -> Assignment:
    """The slots' blocks as fused_experts_impl makes them for this plan."""
    block_m = chosen.config["BLOCK_SIZE_M"]
    if chosen.naive:
        padded = torch.full((1,), topk_ids.numel() * block_m, dtype=torch.int32,
                            device=topk_ids.device)
        return Assignment(None, topk_ids.view(-1), padded)
    return aligned_by_expert(topk_ids, experts, block_m)


def refusal(hidden: int, inter: int) -> str | None:
    """Why vLLM refuses experts of this shape with fp8 weights in 128 x 128
    blocks, or None.  Its validate_fp8_block_shape_moe raises where the
    intermediate size per shard is not a multiple of the block (unless a
    checkpoint refines its scale grid), and per_token_group_quant_fp8 asserts
    that a row is whole groups (its kernel reads past the tensor otherwise)."""
    for name, size in (("intermediate size per shard", inter), ("hidden size", hidden)):
        if size % FP8_BLOCK:
            return (f"vLLM refuses fp8 experts in {FP8_BLOCK} x {FP8_BLOCK} blocks whose {name} "
                    f"({size}) is not a multiple of {FP8_BLOCK}")
    return None


def quantize(kernels, x: torch.Tensor) -> tuple:
    """(q, scale [R, C / 128]) of x [R, C] contiguous, by vLLM's
    _per_token_group_quant_fp8, as per_token_group_quant_fp8's Triton path
    launches it (row-major scales, no power-of-two rounding)."""
    rows, cols = x.shape
    if cols % FP8_BLOCK:  # vLLM asserts it: the kernel reads whole groups
        raise ValueError(f"x: {cols} columns are not whole groups of {FP8_BLOCK}")
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(rows, cols // FP8_BLOCK, dtype=torch.float32, device=x.device)
    kernels.per_token_group_quant[(rows * cols // FP8_BLOCK,)](
        y_ptr=x, y_q_ptr=q, y_s_ptr=scale, group_size=FP8_BLOCK, y_num_columns=cols,
        y_row_stride=x.stride(0), eps=EPS, fp8_min=-FP8_MAX, fp8_max=FP8_MAX, use_ue8m0=False,
        BLOCK=FP8_BLOCK, num_warps=1, num_stages=1)
    return q, scale


def expert_product(kernels, chosen: Plan, blocks: Assignment, a, a_scale, w, w_scale, out,
                   topk_weights, top_k: int, routed: bool) -> None:
    """out [T, k, N] = each slot's row of a (a[slot // top_k]) times its
    expert's w [E, N, K], scaled (times its routing weight where `routed`),
    by vLLM's fused_moe_kernel, launched as invoke_fused_moe_triton_kernel
    launches it for fp8 in 128 x 128 blocks."""
    config = {**chosen.config, "SPLIT_K": 1,
              "BLOCK_SIZE_K": min(chosen.config["BLOCK_SIZE_K"], FP8_BLOCK)}
    block_m, block_n = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    slots = a.shape[0] * top_k
    if blocks.sorted_ids is None:
        rows = slots * block_m
    elif a.shape[0] < block_m:
        rows = min(blocks.sorted_ids.numel(), slots * block_m)
    else:
        rows = blocks.sorted_ids.numel()
    n, k = w.shape[1], w.shape[2]
    grid = (-(-rows // block_m) * -(-n // block_n),)
    kernels.fused_moe_kernel[grid](
        a_ptr=a, b_ptr=w, c_ptr=out, b_bias_ptr=None, a_scale_ptr=a_scale, b_scale_ptr=w_scale,
        topk_weights_ptr=topk_weights, sorted_token_ids_ptr=blocks.sorted_ids,
        expert_ids_ptr=blocks.expert_ids, num_tokens_post_padded_ptr=blocks.padded_slots,
        N=n, K=k, EM=rows, num_valid_tokens=slots,
        stride_am=a.stride(0), stride_ak=a.stride(1), stride_be=w.stride(0),
        stride_bk=w.stride(2), stride_bn=w.stride(1), stride_cm=out.stride(1),
        stride_cn=out.stride(2), stride_asm=a_scale.stride(0), stride_ask=a_scale.stride(1),
        stride_bse=w_scale.stride(0), stride_bsk=w_scale.stride(2),
        stride_bsn=w_scale.stride(1), stride_bbe=0, stride_bbn=0,
        group_n=FP8_BLOCK, group_k=FP8_BLOCK, naive_block_assignment=blocks.sorted_ids is None,
        MUL_ROUTED_WEIGHT=routed, top_k=top_k, compute_type=kernels.bfloat16,
        use_fp8_w8a8=True, use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
        HAS_BIAS=False, **release_options(kernels, chosen), **config)


def release_options(kernels, chosen: Plan) -> dict:
    """The constexprs of fused_moe_kernel that only some vLLM releases have,
    where the vendored one has them: the transposed product, no tensor
    descriptors (vLLM 0.33's defaults for fp8 blocks)."""
    options = {"SWAP_AB": chosen.swap_ab, "USE_TD": False}
    return {name: value for name, value in options.items() if name in kernels.fused_moe_params}


def fused_experts(kernels, chosen: Plan, x, topk_ids, topk_weights, w13, w2, w13_scale,
                  w2_scale) -> torch.Tensor:
    """The experts' output [T, H] in x's dtype (bf16): x [T, H], topk_ids
    [T, k], topk_weights [T, k] float32, w13 [E, 2I, H] and w2 [E, H, I]
    float8_e4m3fn with float32 scales [E, 2I/128, H/128] and [E, H/128, I/128]."""
    blocks = assignment(topk_ids, w13.shape[0], chosen)
    xq, x_scale = quantize(kernels, x)
    gate_up = up_projection(kernels, chosen, blocks, xq, x_scale, w13, w13_scale, topk_weights)
    hq, h_scale = quantize(kernels, gated_activation(gate_up.flatten(0, 1)))
    return down_projection(kernels, chosen, blocks, hq, h_scale, w2, w2_scale,
                           topk_weights).sum(1)


def gemms_alone(kernels, chosen: Plan, x, topk_ids, topk_weights, w13, w2, w13_scale, w2_scale):
    """A function that runs fused_experts' two fused_moe_kernel launches and
    nothing else, on the other steps' results (made here, once); it returns
    the down projection's [T, k, H], whose sum over k is fused_experts'."""
    blocks = assignment(topk_ids, w13.shape[0], chosen)
    xq, x_scale = quantize(kernels, x)
    gate_up = up_projection(kernels, chosen, blocks, xq, x_scale, w13, w13_scale, topk_weights)
    hq, h_scale = quantize(kernels, gated_activation(gate_up.flatten(0, 1)))

    def both():
        up_projection(kernels, chosen, blocks, xq, x_scale, w13, w13_scale, topk_weights)
        return down_projection(kernels, chosen, blocks, hq, h_scale, w2, w2_scale, topk_weights)
    return both


def up_projection(kernels, chosen: Plan, blocks: Assignment, xq, x_scale, w13, w13_scale,
                  topk_weights) -> torch.Tensor:
    """[T, k, 2I]: each slot's token times its expert's w13, in bf16."""
    tokens, top_k = topk_weights.shape
    out = torch.empty(tokens, top_k, w13.shape[1], dtype=torch.bfloat16, device=xq.device)
    expert_product(kernels, chosen, blocks, xq, x_scale, w13, w13_scale, out, topk_weights,
                   top_k, routed=False)
    return out


def down_projection(kernels, chosen: Plan, blocks: Assignment, hq, h_scale, w2, w2_scale,
                    topk_weights) -> torch.Tensor:
    """[T, k, H]: each slot's activation times its expert's w2 and its routing
    weight, in bf16."""
    tokens, top_k = topk_weights.shape
    out = torch.empty(tokens, top_k, w2.shape[1], dtype=torch.bfloat16, device=hq.device)
    expert_product(kernels, chosen, blocks, hq, h_scale, w2, w2_scale, out, topk_weights, 1,
                   routed=True)
    return out
