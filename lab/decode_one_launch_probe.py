"""fp8 moe_experts at decode with H split over programs (the split forward,
aot/kernels/experts_decode_split.py) in ONE launch: the up projection's
parts, the down projection's and combine_parts' tiles as the tickets of one
grid, each program taking the next ticket from a counter, a down ticket
waiting (spinning on its unit's count of finished up parts) and a combine
ticket on the count of finished down tickets.  Tickets are handed out in
the order programs start, so a ticket only ever waits on tickets that
running programs already hold: no grid-wide residency is assumed.  The
counters are zeroed before each call (a memset in the graph).

Against the wheel's forward (its three launches) and the same three kernels
JIT-compiled here (lab/decode_split_probe.py's split_forward), each replayed
from a CUDA graph with the L2 flushed, in turns; every output against the
float64 reference.  Variants: `PREFETCH` (a down ticket asks L2 for its w2
rows before it waits, so that those bytes stream during the up projection),
and the splits of the wheel's rule or `--splits`.

    python -m lab.decode_one_launch_probe [--filter NAME] [--tokens T ...] [--splits S ...]
        [--json OUT]
"""
from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

import gg_runtime
from aot.kernels.experts_decode import (CHUNK_COLUMNS, down_parts, locate_unit, quantized_h,
                                        slot_groups, token_rows, w2_descriptor, w13_descriptor,
                                        w13_product, w13_rows)
from aot.kernels.glu import act
from aot.kernels.quantize import scale_of, to_e4m3
from aot.kernels.scaled import SCALE_BLOCK
from lab.decode_two_kernel_split import part_sums
from aot.kernels.glu import CONCATENATED
from aot.kernels.scaled import BLOCKWISE
from bench.measure import graphed
from gg_runtime.testing import rel_error, time_in_turns
from gg_runtime.testing.moe_fp8 import moe_experts_fp8_ref
from lab.decode_split_probe import BM, BN, BK, SHAPES, dispatch_splits, make_case

LEAN_CONFIGS = ((16, 4), (8, 4), (32, 8))  # (down rows a program, warps)
CBN, CBK = 512, 16  # combine's tile: combine_parts' few_parts config


@triton.jit
def wait_for(counter_ptr, target):
    """Spin until *counter_ptr reaches target (acquire, GPU scope)."""
    while tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu") < target:
        pass
    tl.debug_barrier()


@triton.jit
def arrive(counter_ptr):
    """Every thread's stores before, then one release on *counter_ptr."""
    tl.debug_barrier()
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")


@triton.jit
def prefetch_w2(w2_ptr, g, first, n_lo, n_hi, w2_group_stride, ld2):
    """Ask L2 for w2[g][n_lo:n_hi, first:first + 128], a row's 128 bytes a lane."""
    base = w2_ptr + g.to(tl.int64) * w2_group_stride + first
    for r0 in range(n_lo, n_hi, 512):
        rows = tl.minimum(r0 + tl.arange(0, 512), n_hi - 1)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                  [base + rows.to(tl.int64) * ld2], dtype=tl.int32,
                                  is_pure=False, pack=1)


MARKS = tl.constexpr(10)  # stamps a program: 8 marks, its phase, its ticket


@triton.jit
def stamp(stamps_ptr, mark: tl.constexpr, after, STAMPS: tl.constexpr):
    """%globaltimer (ns) into stamps[program, mark], once `after` (an int32
    the stamp is made to depend on) is known."""
    if STAMPS:
        lane = tl.arange(0, 32) + tl.where(after == -123456789, 1, 0)
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [lane],
                                        dtype=tl.int64, is_pure=False, pack=1)
        tl.store(stamps_ptr + tl.program_id(0) * MARKS + mark + lane * 0, now, mask=lane == 0)


@triton.jit
def one_launch_kernel(x_ptr, ids_ptr, weights_ptr, k, w13_ptr, w13_scale_ptr, w2_ptr,
                      w2_scale_ptr, gu_ptr, parts_ptr, out_ptr, counters_ptr, stamps_ptr, T, S,
                      H, N, G, splits, w13_group_stride, ld13, w2_group_stride, ld2, MAX_UNITS,
                      PREFETCH: tl.constexpr, STAMPS: tl.constexpr, SCALING: tl.constexpr,
                      GLU: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      CBN: tl.constexpr, CBK: tl.constexpr):
    """counters [2 + MAX_UNITS] int32, zero: [0] the next ticket, [1] down
    tickets finished, [2 + u] unit u's up parts finished.  STAMPS: stamps
    [programs, MARKS] int64 (marks 0-7, then the phase and the ticket)."""
    stamp(stamps_ptr, 0, 0, STAMPS)
    ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    stamp(stamps_ptr, 1, ticket, STAMPS)
    inter = N // 2
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    groups = slot_groups(ids_ptr, S, G, chunks, BM)
    work = tl.sum(groups[2]) * splits
    stamp(stamps_ptr, 2, work, STAMPS)
    if STAMPS:
        phase = tl.where(ticket < work, 0, tl.where(ticket < 2 * work, 1, 2))
        tl.store(stamps_ptr + tl.program_id(0) * MARKS + 8, phase.to(tl.int64))
        tl.store(stamps_ptr + tl.program_id(0) * MARKS + 9, ticket.to(tl.int64))
    if ticket < work:  # an up part
        g, slots, row_ok, column = locate_unit(ticket // splits, groups, chunks, BM)
        split = ticket % splits
        per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
        k_lo = split * per_split
        w13_desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
        x = token_rows(x_ptr, x_ptr, weights_ptr, k, slots, row_ok, H, SCALING)
        w13 = (w13_desc, w13_scale_ptr, g, column * CHUNK_COLUMNS, inter)
        k_range = (k_lo, tl.minimum(k_lo + per_split, H), H)
        stamp(stamps_ptr, 3, g, STAMPS)
        gate = w13_product(w13, 0, x, k_range, SCALING, GLU, BM, BK).T
        stamp(stamps_ptr, 4, tl.sum(gate).to(tl.int32), STAMPS)
        up = w13_product(w13, 1, x, k_range, SCALING, GLU, BM, BK).T
        stamp(stamps_ptr, 5, tl.sum(up).to(tl.int32), STAMPS)
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        rows = gu_ptr + (split * S + slots.to(tl.int64))[:, None] * N + j[None, :]
        mask = row_ok[:, None] & (j < inter)[None, :]
        tl.store(rows, gate, mask=mask)
        tl.store(rows + inter, up, mask=mask)
        arrive(counters_ptr + 2 + ticket // splits)
        stamp(stamps_ptr, 6, 0, STAMPS)
    elif ticket < 2 * work:  # a down part
        t = ticket - work
        u = t // splits
        g, slots, row_ok, column = locate_unit(u, groups, chunks, BM)
        per_split = tl.cdiv(tl.cdiv(H, BN), splits) * BN
        n_lo = (t % splits) * per_split
        n_hi = tl.minimum(n_lo + per_split, H)
        if PREFETCH:
            prefetch_w2(w2_ptr, g, column * CHUNK_COLUMNS, n_lo, n_hi, w2_group_stride, ld2)
        w2 = (w2_descriptor(w2_ptr, G, inter, H, w2_group_stride, ld2, BN), w2_scale_ptr,
              (x_ptr, 0, x_ptr, 0, 0))
        j = column * CHUNK_COLUMNS + tl.arange(0, CHUNK_COLUMNS)
        mask = row_ok[:, None] & (j < inter)[None, :]
        stamp(stamps_ptr, 3, g, STAMPS)
        wait_for(counters_ptr + 2 + u, splits)
        stamp(stamps_ptr, 4, 0, STAMPS)
        gate, up = part_sums(gu_ptr + slots.to(tl.int64)[:, None] * N + j[None, :], mask,
                             S.to(tl.int64) * N, inter, splits)
        stamp(stamps_ptr, 5, tl.sum(gate + up).to(tl.int32), STAMPS)
        h, h_scale = quantized_h(gate, up, w2[2], g, column, inter, GLU)
        down_parts(w2, h, h_scale, parts_ptr, g, slots, row_ok, column, chunks,
                   (n_lo, n_hi, H), SCALING, BN)
        stamp(stamps_ptr, 6, 0, STAMPS)
        arrive(counters_ptr + 1)
        stamp(stamps_ptr, 7, 0, STAMPS)
    elif ticket < 2 * work + T * tl.cdiv(H, CBN):  # a combine tile
        tile = ticket - 2 * work
        col_tiles = tl.cdiv(H, CBN)
        token = tile // col_tiles
        cols = (tile % col_tiles) * CBN + tl.arange(0, CBN)
        col_ok = cols < H
        first_slot = token.to(tl.int64) * k
        wait_for(counters_ptr + 1, work)
        stamp(stamps_ptr, 3, 0, STAMPS)
        acc = tl.zeros((CBN,), dtype=tl.float32)
        for first in range(0, k * chunks, CBK):
            pair = first + tl.arange(0, CBK)
            pair_ok = pair < k * chunks
            jj = pair // chunks
            expert = tl.load(ids_ptr + first_slot + jj, mask=pair_ok, other=-1)
            kept = pair_ok & (expert >= 0) & (expert < G)
            weight = tl.load(weights_ptr + first_slot + jj, mask=kept, other=0.0)
            values = tl.load(parts_ptr + ((first_slot + jj) * chunks + pair % chunks)[:, None] * H
                             + cols[None, :], mask=kept[:, None] & col_ok[None, :], other=0.0)
            acc += tl.sum(values * weight[:, None], axis=0)
        tl.store(out_ptr + token.to(tl.int64) * H + cols, acc.to(out_ptr.dtype.element_ty),
                 mask=col_ok)
        stamp(stamps_ptr, 4, 0, STAMPS)


@triton.jit
def lean_kernel(x_ptr, ids_ptr, weights_ptr, w13_ptr, w13_scale_ptr, w2_ptr, w2_scale_ptr, gu_ptr,
                h_ptr, h_scale_ptr, out_ptr, counters_ptr, T, S, H, N, G, k, splits, up_items,
                w13_group_stride, ld13, w2_group_stride, ld2, PREFETCH: tl.constexpr,
                GLU: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, SPLITS_PAD: tl.constexpr,
                DBN: tl.constexpr, PARTS_PAD: tl.constexpr):
    """One launch, one slot a unit (no slot groups), weights by pointer loads
    (no descriptors made), blockwise scales.  Tickets: up items (unit =
    slot x chunk of h, split of H) write gu [splits, units, 256] float32;
    the unit's last arriver sums them, applies the activation and writes h
    e4m3 [units, 128] and its scale [units]; then down items (token, DBN
    rows of H) take the token's k slots' h and w2 rows and write out.
    counters [2 + units] int32, zero: [0] tickets, [1] units whose h is
    written, [2 + u] unit u's up parts written."""
    inter = N // 2
    # Made first: its global write and fence overlap the ticket's and the ids' round trips.
    w13_desc = w13_descriptor(w13_ptr, G, inter, H, w13_group_stride, ld13, GLU, BK)
    ticket = tl.atomic_add(counters_ptr, 1, sem="relaxed", scope="gpu")
    chunks = tl.cdiv(inter, CHUNK_COLUMNS)
    units = S * chunks
    cols = tl.arange(0, CHUNK_COLUMNS)
    if ticket < up_items:
        split = ticket % splits
        unit = ticket // splits
        slot = unit // chunks
        column = unit % chunks
        expert = tl.load(ids_ptr + slot)
        kept = (expert >= 0) & (expert < G)
        expert = tl.where(kept, expert, 0).to(tl.int32)
        j = column * CHUNK_COLUMNS + cols
        j_ok = j < inter
        per_split = tl.cdiv(tl.cdiv(H, BK), splits) * BK
        k_lo = split * per_split
        k_hi = tl.minimum(k_lo + per_split, H)
        if kept:
            g64 = expert.to(tl.int64)
            k_blocks = tl.cdiv(H, SCALE_BLOCK)
            s_gate = w13_scale_ptr + (g64 * tl.cdiv(N, SCALE_BLOCK)
                                      + w13_rows(j, 0, inter, GLU) // SCALE_BLOCK) * k_blocks
            s_up = w13_scale_ptr + (g64 * tl.cdiv(N, SCALE_BLOCK)
                                    + w13_rows(j, 1, inter, GLU) // SCALE_BLOCK) * k_blocks
            token = (slot // k).to(tl.int64)
            rows = tl.arange(0, BM)
            ks = tl.arange(0, BK)
            first = column * CHUNK_COLUMNS
            gate = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
            up = tl.zeros((CHUNK_COLUMNS, BM), dtype=tl.float32)
            for k0 in range(k_lo, k_hi, BK):
                in_k = (k0 + ks) < k_hi
                xs = tl.load(x_ptr + token * H + k0 + ks[None, :] + rows[:, None] * 0,
                             mask=(rows == 0)[:, None] & in_k[None, :], other=0.0).to(tl.float32)
                x_scale = scale_of(tl.max(tl.abs(xs), axis=1))
                xq = to_e4m3(xs, x_scale[:, None]).T
                if GLU == CONCATENATED:
                    wg = w13_desc.load([expert, 0, first, k0]).reshape(CHUNK_COLUMNS, BK)
                    wu = w13_desc.load([expert, 1, first, k0]).reshape(CHUNK_COLUMNS, BK)
                else:
                    wg = w13_desc.load([expert, first, 0, k0]).reshape(CHUNK_COLUMNS, BK)
                    wu = w13_desc.load([expert, first, 1, k0]).reshape(CHUNK_COLUMNS, BK)
                sg = tl.load(s_gate + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)
                su = tl.load(s_up + k0 // SCALE_BLOCK, mask=j_ok, other=0.0)
                gate += tl.dot(wg, xq) * x_scale[None, :] * sg[:, None]
                up += tl.dot(wu, xq) * x_scale[None, :] * su[:, None]
            part = gu_ptr + (split * units + unit).to(tl.int64) * (2 * CHUNK_COLUMNS)
            first = (tl.arange(0, BM) == 0)[None, :]
            tl.store(part + cols, tl.sum(tl.where(first, gate, 0.0), axis=1))
            tl.store(part + CHUNK_COLUMNS + cols, tl.sum(tl.where(first, up, 0.0), axis=1))
        tl.debug_barrier()
        before = tl.atomic_add(counters_ptr + 2 + unit, 1, sem="acq_rel", scope="gpu")
        if before == splits - 1:  # the unit's last part: its h
            if kept:
                sp = tl.arange(0, SPLITS_PAD)
                at = gu_ptr + ((sp * units + unit).to(tl.int64) * (2 * CHUNK_COLUMNS))[:, None] \
                    + cols[None, :]
                got = (sp < splits)[:, None]
                g_sum = tl.sum(tl.load(at, mask=got, other=0.0, cache_modifier=".cg"), axis=0)
                u_sum = tl.sum(tl.load(at + CHUNK_COLUMNS, mask=got, other=0.0,
                                       cache_modifier=".cg"), axis=0)
                h = tl.where(j_ok, act(g_sum, u_sum, 0), 0.0)
                h_scale = scale_of(tl.max(tl.abs(h), axis=0))
                tl.store(h_ptr + unit.to(tl.int64) * CHUNK_COLUMNS + cols, to_e4m3(h, h_scale))
                tl.store(h_scale_ptr + unit, h_scale)
            tl.debug_barrier()
            tl.atomic_add(counters_ptr + 1, 1, sem="release", scope="gpu")
    elif ticket < up_items + T * tl.cdiv(H, DBN):
        d = ticket - up_items
        row_tiles = tl.cdiv(H, DBN)
        token = d // row_tiles
        n = (d % row_tiles) * DBN + tl.arange(0, DBN)
        n_ok = n < H
        pk = tl.arange(0, PARTS_PAD)
        slot = token * k + pk // chunks
        column = pk % chunks
        pk_ok = pk < k * chunks
        expert = tl.load(ids_ptr + slot, mask=pk_ok, other=-1)
        kept = pk_ok & (expert >= 0) & (expert < G)
        g64 = tl.where(kept, expert, 0).to(tl.int64)
        j = column[:, None] * CHUNK_COLUMNS + cols[None, :]
        w_at = w2_ptr + (g64 * w2_group_stride)[:, None, None] \
            + (n.to(tl.int64) * ld2)[None, :, None] + j[:, None, :]
        w_mask = kept[:, None, None] & n_ok[None, :, None] & (j < inter)[:, None, :]
        if PREFETCH:
            w = tl.load(w_at, mask=w_mask, other=0.0)
        w_scale = tl.load(w2_scale_ptr + (g64[:, None] * tl.cdiv(H, SCALE_BLOCK)
                                          + (n // SCALE_BLOCK)[None, :]) * chunks
                          + column[:, None], mask=kept[:, None] & n_ok[None, :], other=0.0)
        weight = tl.load(weights_ptr + slot, mask=kept, other=0.0)
        while tl.atomic_add(counters_ptr + 1, 0, sem="acquire", scope="gpu") < units:
            pass
        tl.debug_barrier()
        if not PREFETCH:
            w = tl.load(w_at, mask=w_mask, other=0.0)
        unit = slot * chunks + column
        hq = tl.load(h_ptr + unit.to(tl.int64)[:, None] * CHUNK_COLUMNS + cols[None, :],
                     mask=kept[:, None], other=0.0, cache_modifier=".cg")
        hs = tl.load(h_scale_ptr + unit, mask=kept, other=0.0, cache_modifier=".cg")
        prod = tl.sum(w.to(tl.float32) * hq.to(tl.float32)[:, None, :], axis=2)
        acc = tl.sum(prod * w_scale * (hs * weight)[:, None], axis=0)
        tl.store(out_ptr + token.to(tl.int64) * H + n, acc.to(out_ptr.dtype.element_ty),
                 mask=n_ok)


def lean(case, splits, dbn=16, prefetch=True, warps=8):
    x, ids, weights = case["x"], case["topk_ids"].reshape(-1), case["topk_weights"]
    (w13, w13_scale, _), (w2, w2_scale, _) = case["w13"], case["w2"]
    T, H = x.shape
    E, N, _ = w13.shape
    k = case["topk_ids"].shape[1]
    S = T * k
    chunks = triton.cdiv(N // 2, 128)
    units = S * chunks
    gu = torch.empty(splits, units, 256, device="cuda")
    h = torch.empty(units, 128, device="cuda", dtype=torch.float8_e4m3fn)
    h_scale = torch.empty(units, device="cuda")
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    counters = torch.zeros(2 + units, device="cuda", dtype=torch.int32)
    up_items = units * splits
    grid = (up_items + T * triton.cdiv(H, dbn),)

    def run():
        counters.zero_()
        lean_kernel[grid](x, ids, weights, w13, w13_scale, w2, w2_scale, gu, h, h_scale, out,
                          counters, T, S, H, N, E, k, splits, up_items, w13.stride(0),
                          w13.stride(1), w2.stride(0), w2.stride(1), PREFETCH=prefetch,
                          GLU=CONCATENATED, BM=BM, BK=BK,
                          SPLITS_PAD=triton.next_power_of_2(splits), DBN=dbn,
                          PARTS_PAD=triton.next_power_of_2(k * chunks), num_warps=warps,
                          num_stages=3)
        return out
    return run


def one_launch(case, splits, prefetch, stamps=None):
    x, ids, weights = case["x"], case["topk_ids"].reshape(-1), case["topk_weights"]
    (w13, w13_scale, _), (w2, w2_scale, _) = case["w13"], case["w2"]
    T, H = x.shape
    E, N, _ = w13.shape
    k = case["topk_ids"].shape[1]
    S = T * k
    chunks = triton.cdiv(N // 2, 128)
    max_units = (triton.cdiv(S, BM) + min(S, E)) * chunks
    gu = torch.empty(splits, S, N, device="cuda")
    parts = torch.empty(S, chunks, H, device="cuda")
    out = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
    counters = torch.zeros(2 + max_units, device="cuda", dtype=torch.int32)
    grid = (2 * max_units * splits + T * triton.cdiv(H, CBN),)
    if stamps is not None:
        stamps.resize_(grid[0], MARKS.value).zero_()

    def run():
        counters.zero_()
        one_launch_kernel[grid](x, ids, weights, k, w13, w13_scale, w2, w2_scale, gu, parts, out,
                                counters, counters if stamps is None else stamps, T, S, H, N, E,
                                splits, w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1),
                                max_units, PREFETCH=prefetch, STAMPS=stamps is not None,
                                SCALING=BLOCKWISE, GLU=CONCATENATED, BM=BM, BN=BN, BK=BK,
                                CBN=CBN, CBK=CBK, num_warps=4, num_stages=3)
        return out
    return run


def timeline(case, splits):
    """Each phase's marks (µs from the first program's entry): the median
    and the largest over the programs of that phase, from one replay."""
    stamps = torch.zeros(1, MARKS, device="cuda", dtype=torch.int64)
    replay = graphed(one_launch(case, splits, False, stamps))
    for _ in range(3):
        stamps.zero_()
        from gg_runtime.testing.timing import flush_l2
        flush_l2()
        replay()
    torch.cuda.synchronize()
    got = stamps.cpu()
    got = got[got[:, 0] > 0]
    start = got[:, 0].min()
    lines = {}
    names = {0: ("entry", "ticket", "groups", "located", "gate", "up", "arrived"),
             1: ("entry", "ticket", "groups", "located", "waited", "summed", "down", "arrived"),
             2: ("entry", "ticket", "groups", "waited", "end")}
    for phase, marks in names.items():
        rows = got[got[:, 8] == phase]
        if not len(rows):
            continue
        cells = []
        for m, name in enumerate(marks):
            us = (rows[:, m] - start).double() / 1e3
            cells.append(f"{name} {us.median():.1f}/{us.max():.1f}")
        lines[phase] = f"  phase {phase} ({len(rows)} programs): " + ", ".join(cells)
    end = got[:, :8].max()
    print(f"  kernel span {(end - start) / 1e3:.1f} us", flush=True)
    for line in lines.values():
        print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--filter", default="")
    parser.add_argument("--tokens", type=int, nargs="*", default=(1, 2, 4))
    parser.add_argument("--splits", type=int, nargs="*", default=())
    parser.add_argument("--timeline", action="store_true")
    args = parser.parse_args()
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8,
                                                                 device="cuda"))
    rows = []
    for name, (H, inter, E, k) in SHAPES.items():
        if args.filter not in name:
            continue
        for T in args.tokens:
            torch.manual_seed(T)
            case = make_case(H, inter, E, k, T)
            reference = moe_experts_fp8_ref(**case)
            units = min(T * k, E) * triton.cdiv(inter, 128)
            rule = dispatch_splits(units, triton.cdiv(H, 128))
            for splits in sorted({rule, *args.splits} - {1}) or (4,):
                if args.timeline:
                    print(f"{name} T={T} splits {splits}:", flush=True)
                    timeline(case, splits)
                    continue
                fns = {"wheel": lambda: gg_runtime.moe_experts(**case),
                       "one": one_launch(case, splits, False)}
                for dbn, warps in LEAN_CONFIGS:
                    fns[f"lean_d{dbn}_w{warps}"] = lean(case, splits, dbn, True, warps)
                fns["lean_d16_w4_late"] = lean(case, splits, 16, False, 4)
                row = {"shape": name, "T": T, "splits": splits, "rule": rule}
                for variant, fn in fns.items():
                    row[variant + "_error"] = rel_error(fn(), reference)
                times = time_in_turns({v: graphed(fn) for v, fn in fns.items()})
                row.update({v: 1e3 * ms for v, ms in times.items()})
                print(f"{name:18s} T={T} splits {splits:2d} (rule {rule:2d}): " + " ".join(
                    f"{v} {row[v]:.1f}" for v in fns) + " us | errors " + " ".join(
                    f"{row[v + '_error']:.0e}" for v in fns), flush=True)
                rows.append(row)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
