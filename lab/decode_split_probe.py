"""fp8 moe_experts at decode with each unit's H cut into parts
(aot/kernels/experts_decode_split.py), on the served shapes and token counts
of bench's vllm_fp8 section, each replayed from a CUDA graph with the L2
flushed.  Two modes:

- sweep (default): the split kernels JIT-compiled by the GPU host's Triton
  for a range of splits (and each kernel alone, and two variants of them),
  against the wheel's forward, each output against the float64 reference:
  what to read before changing the splits' rule (csrc/ops/
  expert_products_fp8.cc decode_splits);
- `--ab`: the wheel's forward as it dispatches against the one-kernel
  forward forced (the variant the dispatch took before the split forward:
  the warp-specialised one where its `few_units` holds), at `--tokens`
  (those whose slots the decode kernel holds);
- `--routed`: the wheel's forward as it dispatches against the routed
  products forced (a `combine` variant forced), on the bench's inputs
  (bench/sections/fp8_experts.py: softmax top-k routing; `--seeds` such
  routings) and the probe's, at `--tokens`: where the decode path's bound
  on slots an expert lies;
- `--kernels`: the one-kernel forward's two kernels, the warp-specialised
  and the Triton one, each forced, timed in turns, at `--tokens` where the
  dispatch takes the one-kernel forward and both kernels' conditions hold
  (a build with the warp-specialised config's `few_units` lifted compares
  them on every such call);
- `--down`: the down kernel's sum of the parts, four loads at a time as the
  wheel's (part_sums), against one load after another and against a single
  part (a bound on what the sum costs; its output is wrong), each kernel
  alone and each whole forward, at T = 1 and 2.

    python lab/decode_split_probe.py [--ab | --kernels | --routed | --down] [--filter NAME]
        [--tokens T ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton

import gg_runtime
from bench.measure import graphed
from gg_runtime import _C
from aot.kernels.combine import combine_parts_kernel
import triton.language as tl

from aot.kernels.experts_decode import (CHUNK_COLUMNS, MAX_SLOTS, down_parts, locate_unit,
                                        quantized_h, slot_groups, token_rows, w2_descriptor,
                                        w13_descriptor)
from lab.decode_two_kernel_split import (part_sums, scaled_decode_down_kernel,
                                              scaled_decode_up_kernel)
from aot.kernels.glu import CONCATENATED
from aot.kernels.quantize import scale_of, to_e4m3
from aot.kernels.scaled import BLOCKWISE, SCALE_BLOCK
from gg_runtime.testing import forced, rel_error, time_in_turns
from gg_runtime.testing.moe_fp8 import fp8_experts, moe_experts_fp8_ref
from gg_runtime.testing.timing import time_ms

# (H, I, E, k) of bench/vllm_fp8.py's served shapes.
SHAPES = {"deepseek_v3_tp16": (7168, 128, 256, 8), "deepseek_v3_tp8": (7168, 256, 256, 8),
          "qwen3_30b_a3b": (2048, 768, 128, 8), "qwen3_30b_a3b_tp2": (2048, 384, 128, 8),
          "qwen3_30b_a3b_tp4": (2048, 192, 128, 8), "mixtral_tp2": (4096, 7168, 8, 2)}
# --ab only: no float64 reference (its dequantized weights would be 90 GB).
AB_SHAPES = {"deepseek_v3": (7168, 2048, 256, 8), "mixtral": (4096, 14336, 8, 2),
             "gpt_oss_20b": (2880, 2880, 32, 4)}
TOKENS = (1, 2, 4, 8)
SPLITS = (1, 2, 4, 8, 16, 28, 56)
BM, BN, BK = 16, 128, 128
PROGRAMS = 132 * 4


# The down kernels' ways of summing gu's parts (down_sums_kernel's SUMS).
IN_FOURS, ONE_AT_A_TIME, ONE_PART = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@triton.jit
def down_sums_kernel(gu_ptr, ids_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr, has_b2,
                     gpt_oss, parts_ptr, S, H, N, G, splits, w2_group_stride, ld2,
                     SCALING: tl.constexpr, GLU: tl.constexpr, USE_TMA: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     CHUNK: tl.constexpr, PRECISION: tl.constexpr, SUMS: tl.constexpr):
    """scaled_decode_down_kernel with the parts of gu summed another way:
    IN_FOURS, four splits a load (one 3-D tile); ONE_AT_A_TIME, one load
    after another (the kernel before part_sums); ONE_PART, only the first
    part read (timing only: its output is wrong)."""
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    w2 = (w2_descriptor(w2_ptr, G, inter, H, w2_group_stride, ld2, BN), w2_scale_ptr,
          (b13_ptr, has_b13, b2_ptr, has_b2, gpt_oss))
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    per_split = tl.cdiv(tl.cdiv(H, BN), splits) * BN
    four = tl.arange(0, 4)
    for t in range(tl.program_id(0), tl.sum(groups[2]) * splits, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t // splits, groups, chunks, BM)
        n_lo = (t % splits) * per_split
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        mask = row_ok[:, None] & (j < inter)[None, :]
        rows = gu_ptr + slots.to(tl.int64)[:, None] * N + j[None, :]
        if SUMS == ONE_PART:
            gate = tl.load(rows, mask=mask, other=0.0)
            up = tl.load(rows + inter, mask=mask, other=0.0)
        else:
            gate = tl.zeros((BM, CHUNK_COLUMNS), dtype=tl.float32)
            up = tl.zeros((BM, CHUNK_COLUMNS), dtype=tl.float32)
            if SUMS == ONE_AT_A_TIME:
                for split in range(splits):
                    gate += tl.load(rows + split * S * N, mask=mask, other=0.0)
                    up += tl.load(rows + split * S * N + inter, mask=mask, other=0.0)
            else:
                for s0 in range(0, splits, 4):
                    split = s0 + four
                    at = rows[None, :, :] + (split * S * N)[:, None, None]
                    both = mask[None, :, :] & (split < splits)[:, None, None]
                    gate += tl.sum(tl.load(at, mask=both, other=0.0), axis=0)
                    up += tl.sum(tl.load(at + inter, mask=both, other=0.0), axis=0)
        h, h_scale = quantized_h(gate, up, w2[2], g, column, inter, GLU)
        down_parts(w2, h, h_scale, parts_ptr, g, slots, row_ok, column, chunks,
                   (n_lo, tl.minimum(n_lo + per_split, H), H), SCALING, BN)


@triton.jit
def down_fanned_kernel(gu_ptr, ids_ptr, w2_ptr, w2_scale_ptr, b13_ptr, has_b13, b2_ptr, has_b2,
                       activation, parts_ptr, S, H, N, G, splits, w2_group_stride, ld2,
                       down_splits, SCALING: tl.constexpr, GLU: tl.constexpr,
                       USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """scaled_decode_down_kernel with H's rows cut into `down_splits` parts,
    whatever the up kernel's `splits` (each program sums all of gu's parts)."""
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    w2 = (w2_descriptor(w2_ptr, G, inter, H, w2_group_stride, ld2, BN), w2_scale_ptr,
          (b13_ptr, has_b13, b2_ptr, has_b2, activation))
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    per_split = tl.cdiv(tl.cdiv(H, BN), down_splits) * BN
    for t in range(tl.program_id(0), tl.sum(groups[2]) * down_splits, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t // down_splits, groups, chunks, BM)
        n_lo = (t % down_splits) * per_split
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        mask = row_ok[:, None] & (j < inter)[None, :]
        gate, up = part_sums(gu_ptr + slots.to(tl.int64)[:, None] * N + j[None, :], mask,
                             S.to(tl.int64) * N, inter, splits)
        h, h_scale = quantized_h(gate, up, w2[2], g, column, inter, GLU)
        if n_lo < H:
            down_parts(w2, h, h_scale, parts_ptr, g, slots, row_ok, column, chunks,
                       (n_lo, tl.minimum(n_lo + per_split, H), H), SCALING, BN)


@triton.jit
def up_merged_kernel(x_ptr, xq_ptr, x_scale_ptr, ids_ptr, k, w13_ptr, w13_scale_ptr, gu_ptr,
                     S, H, N, G, splits, w13_group_stride, ld13, SCALING: tl.constexpr,
                     GLU: tl.constexpr, USE_TMA: tl.constexpr, BM: tl.constexpr,
                     BN: tl.constexpr, BK: tl.constexpr, CHUNK: tl.constexpr,
                     PRECISION: tl.constexpr):
    """scaled_decode_up_kernel (blockwise, concatenated) with gate and up in one K loop."""
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
    ks = tl.arange(0, BK)
    for t in range(tl.program_id(0), tl.sum(groups[2]) * splits, tl.num_programs(0)):
        g, slots, row_ok, column = locate_unit(t // splits, groups, chunks, BM)
        split = t % splits
        k_lo = split * per_split
        k_hi = tl.minimum(k_lo + per_split, H)
        x_rows, _, _ = token_rows(x_ptr, xq_ptr, x_scale_ptr, k, slots, row_ok, H, SCALING)
        first = column * CHUNK_COLUMNS
        j = first + tl.arange(0, CHUNK_COLUMNS)
        j_ok = j < inter
        g64 = g.to(tl.int64)
        scales = w13_scale_ptr + (g64 * tl.cdiv(2 * inter, SCALE_BLOCK)
                                  + j // SCALE_BLOCK) * tl.cdiv(H, SCALE_BLOCK)
        up_scales = w13_scale_ptr + (g64 * tl.cdiv(2 * inter, SCALE_BLOCK)
                                     + (inter + j) // SCALE_BLOCK) * tl.cdiv(H, SCALE_BLOCK)
        gate = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
        up = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            xs = tl.load(x_rows[:, None] + k0 + ks[None, :],
                         mask=row_ok[:, None] & (k0 + ks < k_hi)[None, :], other=0.0)
            xs = xs.to(tl.float32)
            x_scale = scale_of(tl.max(tl.abs(xs), axis=1))
            xq = to_e4m3(xs, x_scale[:, None]).T
            wg = desc.load([g, 0, first, k0]).reshape(CHUNK_COLUMNS, BK)
            wu = desc.load([g, 1, first, k0]).reshape(CHUNK_COLUMNS, BK)
            sg = tl.load(scales + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)[:, None]
            su = tl.load(up_scales + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)[:, None]
            gate += tl.dot(wg, xq) * x_scale[None, :] * sg
            up += tl.dot(wu, xq) * x_scale[None, :] * su
        rows = gu_ptr + (split * S + slots.to(tl.int64))[:, None] * N + j[None, :]
        mask = row_ok[:, None] & j_ok[None, :]
        tl.store(rows, gate.T, mask=mask)
        tl.store(rows + inter, up.T, mask=mask)


def make_case(H, inter, E, k, T):
    x = torch.randn(T, H, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(E, device="cuda")[:k] for _ in range(T)])
    weights = torch.rand(T, k, device="cuda")
    w13 = (torch.randn(E, 2 * inter, H, device="cuda") * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, inter, device="cuda") * inter ** -0.5).to(torch.bfloat16)
    w13, w2 = fp8_experts(w13, w2, "128x128")
    return dict(x=x, topk_ids=ids, topk_weights=weights, w13=w13, w2=w2)


def split_forward(case, splits, up_kernel=scaled_decode_up_kernel,
                  down_kernel=scaled_decode_down_kernel, stages=(True, True, True),
                  down_options=None, down_splits=None, combine=(32, 256, 8),
                  combine_kernel=combine_parts_kernel):
    """The two split kernels and combine_parts (those of `stages` on), as a
    closure over buffers."""
    x, ids, weights = case["x"], case["topk_ids"].reshape(-1), case["topk_weights"]
    (w13, w13_scale, _), (w2, w2_scale, _) = case["w13"], case["w2"]
    T, H = x.shape
    E, N, _ = w13.shape
    k = case["topk_ids"].shape[1]
    S = T * k
    chunks = triton.cdiv(N // 2, 128)
    gu = torch.empty(splits, S, N, device="cuda")
    parts = torch.empty(S, chunks, H, device="cuda")
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    units = (triton.cdiv(S, BM) + min(S, E)) * chunks
    grid = (min(units * splits, PROGRAMS),)
    down_grid = (min(units * (down_splits or splits), PROGRAMS),)
    fanned = () if down_splits is None else (down_splits,)
    combine_bn, combine_bk, combine_warps = combine
    common = dict(SCALING=BLOCKWISE, GLU=CONCATENATED, USE_TMA=True, BM=BM, BN=BN, BK=BK,
                  CHUNK=0, PRECISION=0, num_warps=4, num_stages=3)

    def run():
        if stages[0]:
            up_kernel[grid](x, x, weights, ids, k, w13, w13_scale, gu, S, H, N, E, splits,
                            w13.stride(0), w13.stride(1), **common)
        if stages[1]:
            down_kernel[down_grid](gu, ids, w2, w2_scale, x, 0, x, 0, 0, parts, S, H, N, E,
                                   splits, w2.stride(0), w2.stride(1), *fanned, **common,
                                   **(down_options or {}))
        if stages[2]:
            combine_kernel[(min(T * triton.cdiv(H, combine_bn), PROGRAMS),)](
                parts, ids, weights, out, T, H, k, E, chunks, USE_TMA=False, BM=1,
                BN=combine_bn, BK=combine_bk, CHUNK=0, PRECISION=0, num_warps=combine_warps,
                num_stages=1)
        return out
    return run


def breakdown(case, reference) -> dict:
    """At splits 4, 8, 16: each kernel alone, and the two variants."""
    rows = {}
    H = case["x"].shape[1]
    for splits in (4, 8, 16):
        if splits > triton.cdiv(H, 128):
            continue
        row = {}
        for name, stages in (("up", (True, False, False)), ("down", (False, True, False)),
                             ("combine", (False, False, True))):
            fn = split_forward(case, splits, stages=stages)
            split_forward(case, splits)()  # gu and parts as a call leaves them
            row[name] = 1e3 * replayed_ms(fn)
        in_fours = {"down_kernel": down_sums_kernel, "down_options": {"SUMS": IN_FOURS}}
        for name, kernels in (("down_in_fours", in_fours),
                              ("up_merged", {"up_kernel": up_merged_kernel}),
                              ("both", {**in_fours, "up_kernel": up_merged_kernel})):
            fn = split_forward(case, splits, **kernels)
            row[name] = 1e3 * replayed_ms(fn)
            row[name + "_error"] = rel_error(fn(), reference)
        print(f"    splits {splits}: " + " ".join(
            f"{k} {v:.1f}" if "error" not in k else f"({v:.0e})" for k, v in row.items()),
            flush=True)
        rows[splits] = row
    return rows


def down_sums(args):
    """--down: the part sums' cost in the down kernel (the module's docstring)."""
    rows = []
    variants = {"wheel": {}, "one_at_a_time": {"down_kernel": down_sums_kernel,
                                               "down_options": {"SUMS": ONE_AT_A_TIME}},
                "one_part": {"down_kernel": down_sums_kernel, "down_options": {"SUMS": ONE_PART}}}
    for name, shape in SHAPES.items():
        if args.filter not in name:
            continue
        for T in (1, 2):
            torch.manual_seed(T)
            case = make_case(*shape, T)
            reference = moe_experts_fp8_ref(**case)
            for splits in (8, 14, 16):
                if splits > triton.cdiv(shape[0], 128) // 4:
                    continue
                row = {"shape": name, "T": T, "splits": splits}
                timed = {}
                for variant, options in variants.items():
                    split_forward(case, splits, **options)()
                    alone = split_forward(case, splits, stages=(False, True, False), **options)
                    whole = split_forward(case, splits, **options)
                    timed[variant + "_down"] = graphed(alone)
                    timed[variant + "_whole"] = graphed(whole)
                    row[variant + "_error"] = rel_error(whole(), reference)
                row.update({k: 1e3 * v for k, v in time_in_turns(timed).items()})
                print(f"{name:20s} T={T} splits {splits:2d}: " + " ".join(
                    f"{k} {row[k]:.1f}" for k in timed) + " | errors " + " ".join(
                    f"{v}: {row[v + '_error']:.1e}" for v in variants), flush=True)
                rows.append(row)
    return rows


# --fan: combine_parts' tiles (BN columns, BK parts a step, warps): the wheel's
# for tokens of at most FEW_PARTS parts, and its other.
FEW_PARTS = 16
COMBINES = ((512, FEW_PARTS, 4), (32, 256, 8))


def dispatch_splits(units: int, blocks: int) -> int:
    """The two-kernel split forward's rule (csrc/ops/expert_products_fp8_decode.cc
    decode_splits before the one-launch kernel), unforced."""
    want = min(256 // units, blocks // 4) if units <= 32 and blocks >= 40 else 1
    return 1 if want < 2 else triton.cdiv(blocks, triton.cdiv(blocks, want))


# --profile: the fanned down kernel and combine_parts JIT-compiled without
# Triton's specialization of the integers the wheel's variants take as they
# come (neither 1 nor a multiple of 16 assumed): S, G, splits, the flags; T,
# K, G, P.
UNSPECIALIZED = (
    triton.JITFunction(down_fanned_kernel.fn, do_not_specialize=[
        "S", "G", "splits", "has_b13", "has_b2", "activation", "down_splits"]),
    triton.JITFunction(combine_parts_kernel.fn, do_not_specialize=["T", "K", "G", "P"]))
# --profile: the fanned down kernel as the wheel's TMA variant is compiled
# (aot/variants.py divisible_params: none for the tma flavour): no integer
# assumed a multiple of 16, no pointer 16-byte aligned.
DOWN_POINTERS = ["gu_ptr", "ids_ptr", "w2_ptr", "w2_scale_ptr", "b13_ptr", "b2_ptr", "parts_ptr"]
DOWN_INTEGERS = ["has_b13", "has_b2", "activation", "S", "H", "N", "G", "splits",
                 "w2_group_stride", "ld2", "down_splits"]
AS_THE_WHEEL = triton.JITFunction(down_fanned_kernel.fn, do_not_specialize=DOWN_INTEGERS,
                                  do_not_specialize_on_alignment=DOWN_POINTERS + DOWN_INTEGERS)


def fan(args):
    """--fan: the split forward with the down kernel's rows cut apart from
    the up kernel's splits (down_fanned_kernel: `d` parts of H, against `d`
    equal to the up's `s`, the wheel's kernels), each replayed with the L2
    flushed, timed in turns with the wheel's dispatch; each output against
    the float64 reference."""
    rows = []
    for name, shape in SHAPES.items():
        if args.filter not in name:
            continue
        H, inter, E, k = shape
        blocks = triton.cdiv(H, 128)
        for T in args.tokens or TOKENS:
            if T * k > MAX_SLOTS.value:
                continue
            torch.manual_seed(T)
            case = make_case(*shape, T)
            reference = moe_experts_fp8_ref(**case)
            units = min(T * k, E) * triton.cdiv(inter, 128)
            combine = COMBINES[0] if k * triton.cdiv(inter, 128) <= FEW_PARTS else COMBINES[1]
            timed, errors = {"wheel": graphed(lambda: gg_runtime.moe_experts(**case))}, {}
            errors["wheel"] = rel_error(gg_runtime.moe_experts(**case), reference)
            ours = dispatch_splits(units, blocks)
            for splits in sorted({ours, *(s for s in (4, 8, 14) if s <= blocks // 2)} - {1}):
                for down_splits in sorted({splits, *(max(1, min(blocks, programs // units))
                                                     for programs in (132, 264))}):
                    fn = split_forward(case, splits, down_kernel=down_fanned_kernel,
                                       down_splits=down_splits, combine=combine)
                    key = f"s{splits}_d{down_splits}"
                    errors[key] = rel_error(fn(), reference)
                    timed[key] = graphed(fn)
            times = {key: 1e3 * v for key, v in time_in_turns(timed).items()}
            row = {"shape": name, "T": T, "units": units, "dispatch_splits": ours, "us": times,
                   "errors": errors}
            same = min((key for key in times if key[0] == "s" and
                        key.split("_")[0][1:] == key.split("_")[1][1:]), key=times.get)
            best = min((key for key in times if key[0] == "s"), key=times.get)
            print(f"{name:18s} T={T} (dispatch s{ours}): wheel {times['wheel']:.1f}, best "
                  f"d = s {same} {times[same]:.1f}, best {best} {times[best]:.1f} (error "
                  f"{errors[best]:.1e}, wheel's {errors['wheel']:.1e}); " + " ".join(
                      f"{key} {v:.1f}" for key, v in times.items() if key != "wheel"),
                  flush=True)
            if args.profile:
                from lab.vllm_kernel_split import kernel_us
                splits = int(same.split("_")[0][1:])
                timed["unspecialized"] = graphed(split_forward(
                    case, splits, down_kernel=UNSPECIALIZED[0], down_splits=splits,
                    combine=combine, combine_kernel=UNSPECIALIZED[1]))
                timed["as_the_wheel"] = graphed(split_forward(
                    case, splits, down_kernel=AS_THE_WHEEL, down_splits=splits, combine=combine))
                row["kernels"] = {key: kernel_us(timed[key])
                                  for key in ("wheel", same, "unspecialized", "as_the_wheel")}
                print("  kernels µs:", row["kernels"], flush=True)
            rows.append(row)
    if args.profile:
        for kernel in (scaled_decode_up_kernel, down_fanned_kernel):
            for compiled in kernel.device_caches[torch.cuda.current_device()][0].values():
                print(f"  {kernel.fn.__name__}: {compiled.n_regs} registers, "
                      f"{compiled.n_spills} spilled", flush=True)
    return rows


def replayed_ms(fn):
    return time_ms(graphed(fn))


def one_kernel_variant(case) -> str:
    """The scaled_experts_decode variant the one-kernel forward takes on
    `case` (blockwise, concatenated, bfloat16 tokens): the warp-specialised
    one where its conditions hold, else the Triton one."""
    variants = decode_variants(case)
    try:
        with forced(variants["ws"]):
            gg_runtime.moe_experts(**case)
        return variants["ws"]
    except ValueError:  # past its few_units
        return variants["triton"]


def ab(args):
    rows = []
    for name, shape in {**SHAPES, **AB_SHAPES}.items():
        if args.filter not in name:
            continue
        for T in args.tokens or TOKENS:
            if T * shape[3] > MAX_SLOTS.value:
                continue
            torch.manual_seed(T)
            case = make_case(*shape, T)
            key = one_kernel_variant(case)
            default = lambda: gg_runtime.moe_experts(**case)  # noqa: E731
            with forced(key):
                before = gg_runtime.moe_experts(**case)
                one_kernel = graphed(lambda: gg_runtime.moe_experts(**case))
            times = time_in_turns({"one_kernel": one_kernel, "dispatch": graphed(default)})
            after = default()
            row = {"shape": name, "T": T, "variant": key.rsplit(".", 1)[1],
                   **{k: 1e3 * v for k, v in times.items()},
                   "difference": rel_error(after, before)}
            if name in SHAPES:
                reference = moe_experts_fp8_ref(**case)
                row["error"], row["one_kernel_error"] = (rel_error(after, reference),
                                                         rel_error(before, reference))
            print(f"{name:20s} T={T}: dispatch {row['dispatch']:6.1f} us, one kernel "
                  f"{row['one_kernel']:6.1f} us ({row['variant']}), "
                  f"x {row['one_kernel'] / row['dispatch']:.2f}; difference "
                  f"{row['difference']:.1e}, errors {row.get('error', 0):.1e} "
                  f"{row.get('one_kernel_error', 0):.1e}", flush=True)
            rows.append(row)
    return rows


def decode_variants(case) -> dict:
    """The scaled_experts_decode variants of `case` (blockwise, concatenated,
    bfloat16 tokens): {"ws": key, "triton": key}."""
    keys = [v["key"] for v in _C.variants() if v["family"] == "scaled_experts_decode"
            and v["axes"] == {"scaling": "blockwise", "gate_up": "concatenated"}
            and v["dtype"] == "bfloat16"]
    (ws,) = [key for key in keys if "_ws" in key]
    (plain,) = [key for key in keys if "_ws" not in key]
    return {"ws": ws, "triton": plain}


def kernels(args):
    rows = []
    for name, shape in {**SHAPES, **AB_SHAPES}.items():
        if args.filter not in name:
            continue
        H, inter, E, k = shape
        for T in args.tokens or TOKENS:
            slots, units = T * k, min(T * k, E) * triton.cdiv(inter, 128)
            if slots > MAX_SLOTS.value or slots > 2 * E or \
                    dispatch_splits(units, triton.cdiv(H, 128)) > 1:
                continue
            torch.manual_seed(T)
            case = make_case(*shape, T)
            graphs, outputs = {}, {}
            try:
                for kind, key in decode_variants(case).items():
                    with forced(key):
                        outputs[kind] = gg_runtime.moe_experts(**case)
                        graphs[kind] = graphed(lambda: gg_runtime.moe_experts(**case))
            except ValueError as refused:  # past a kernel's condition (its few_units)
                print(f"{name:20s} T={T}: units <= {units}: {refused}", flush=True)
                continue
            times = time_in_turns(graphs)
            row = {"shape": name, "T": T, "units": units,
                   "touched": int(case["topk_ids"].unique().numel()),
                   **{kind: 1e3 * v for kind, v in times.items()},
                   "difference": rel_error(outputs["ws"], outputs["triton"])}
            print(f"{name:20s} T={T}: units <= {units}, touched {row['touched']}: ws "
                  f"{row['ws']:6.1f} us, triton {row['triton']:6.1f} us, ws / triton "
                  f"{row['ws'] / row['triton']:.2f}; difference {row['difference']:.1e}",
                  flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    return rows


def routed_variant(case) -> str:
    """A `combine` variant that runs the call: forcing it forces the routed
    products (csrc/ops/expert_products_fp8_decode.cc decode_fits)."""
    for v in _C.variants():
        if v["family"] == "combine" and v["arch"] == 90 and v["dtype"] == "bfloat16":
            try:
                with forced(v["key"]):
                    gg_runtime.moe_experts(**case)
                return v["key"]
            except ValueError:
                continue
    raise ValueError("no combine variant runs this call")


def routed(args):
    from bench.sections.fp8_experts import expert_weights, routed_tokens
    rows = []
    for name, shape in {**SHAPES, **AB_SHAPES}.items():
        if args.filter not in name:
            continue
        H, inter, E, k = shape
        weights = expert_weights(H, inter, E, "128x128", bf16=False)
        for T in args.tokens or TOKENS:
            draws = [("bench", T + 1000 * seed) for seed in range(args.seeds)]
            for inputs, seed in [*draws, ("probe", T)] if args.seeds else [("bench", T),
                                                                             ("probe", T)]:
                torch.manual_seed(seed)
                if inputs == "bench":
                    x, ids, w = routed_tokens(T, H, E, k)
                else:
                    case = make_case(H, 16, E, k, T)  # its routing and tokens only
                    x, ids, w = case["x"], case["topk_ids"], case["topk_weights"]
                case = dict(x=x, topk_ids=ids, topk_weights=w, w13=weights["w13"],
                            w2=weights["w2"])
                key = routed_variant(case)
                with forced(key):
                    before = gg_runtime.moe_experts(**case)
                    forced_routed = graphed(lambda: gg_runtime.moe_experts(**case))
                times = time_in_turns({"routed": forced_routed, "dispatch": graphed(
                    lambda: gg_runtime.moe_experts(**case))})
                row = {"shape": name, "T": T, "inputs": inputs, "seed": seed, "slots": T * k,
                       "touched": int(ids.unique().numel()),
                       "most_an_expert": int(torch.bincount(ids.flatten()).max()),
                       **{k: 1e3 * v for k, v in times.items()},
                       "difference": rel_error(gg_runtime.moe_experts(**case), before)}
                print(f"{name:14s} T={T:3d} {inputs:5s}: dispatch {row['dispatch']:6.1f} us, "
                      f"routed {row['routed']:6.1f} us, x {row['routed'] / row['dispatch']:.2f}"
                      f" (touched {row['touched']}, most an expert {row['most_an_expert']}); "
                      f"difference {row['difference']:.1e}", flush=True)
                rows.append(row)
        del weights
        torch.cuda.empty_cache()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--ab", action="store_true")
    parser.add_argument("--kernels", action="store_true")
    parser.add_argument("--down", action="store_true")
    parser.add_argument("--routed", action="store_true")
    parser.add_argument("--fan", action="store_true")
    parser.add_argument("--profile", action="store_true",
                        help="--fan: the wheel's kernels and the probe's under the profiler")
    parser.add_argument("--seeds", type=int, default=0,
                        help="--routed: this many routings of the bench's kind a token count")
    parser.add_argument("--tokens", type=int, nargs="*", help="--ab's token counts")
    args = parser.parse_args()
    if args.fan:
        triton.set_allocator(lambda size, align, stream: torch.empty(
            size, dtype=torch.int8, device="cuda"))
        rows = fan(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    if args.ab or args.kernels or args.down or args.routed:
        if args.down:
            triton.set_allocator(lambda size, align, stream: torch.empty(
                size, dtype=torch.int8, device="cuda"))
        rows = ab(args) if args.ab else kernels(args) if args.kernels else \
            down_sums(args) if args.down else routed(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for name, shape in SHAPES.items():
        if args.filter not in name:
            continue
        for T in TOKENS:
            torch.manual_seed(T)
            case = make_case(*shape, T)
            reference = moe_experts_fp8_ref(**case)
            default = lambda: gg_runtime.moe_experts(**case)  # noqa: E731
            row = {"shape": name, "T": T, "default_us": 1e3 * replayed_ms(default),
                   "default_error": rel_error(default(), reference), "splits": {}}
            for splits in SPLITS:
                if splits > triton.cdiv(shape[0], 128):
                    continue
                fn = split_forward(case, splits)
                error = rel_error(fn(), reference)
                row["splits"][splits] = {"us": 1e3 * replayed_ms(fn), "error": error}
            if T <= 2:
                row["breakdown"] = breakdown(case, reference)
            best = min(row["splits"].items(), key=lambda kv: kv[1]["us"])
            print(f"{name:20s} T={T:3d} default {row['default_us']:7.1f} us "
                  f"(err {row['default_error']:.1e}) | " + " ".join(
                      f"{s}:{v['us']:.1f}" + ("!" if v["error"] > 3e-2 else "")
                      for s, v in row["splits"].items()) + f" | best {best[0]}", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
