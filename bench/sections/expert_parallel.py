"""gg_runtime.moe.expert_parallel across the GPUs of one host (EP2, EP4 and
EP8, as many as are visible) beside the NCCL baseline (host-synced
all_to_all_single of each slot's row, moe_experts as the local experts,
each token's outputs gathered and summed with its weights) and the local
experts alone (moe_experts on the rows a rank received, gathered: the
no-communication floor), on DeepSeek-V3's and Qwen3-30B-A3B's experts,
bf16 (on sm90 also with fp8 weights).  Each layer and world size is one
run of bench/expert_parallel_worker.py under torch.distributed.run; its
figures are rank 0's.  Skipped, with its
reason, where fewer than two GPUs are visible."""
from __future__ import annotations

import json
import subprocess

import torch

from gg_runtime.testing import ranks_command, ranks_env

from ..markdown import fmt, table

TITLE = "Expert parallelism on one host"
# (H, I, E, k)
LAYERS = {"deepseek_v3": (7168, 2048, 256, 8), "qwen3_30b_a3b": (2048, 768, 128, 8)}
WORLDS = (2, 4, 8)


def run(context) -> dict:
    gpus = torch.cuda.device_count()
    if gpus < 2:
        return {"skipped": f"needs two or more GPUs of one host, this machine has {gpus}"}
    runs = []
    for name, shape in LAYERS.items():
        for world in WORLDS:
            if context.only in name and world <= gpus:
                run = run_layer(name, shape, world)
                vdev = run_layer(name, shape, world, "vdev")
                run["vdev"] = vdev.get("vdev") or {"error": vdev.get("error", "no rows")}
                runs.append(run)
    return {"runs": runs}


def run_layer(name, shape, world, *mode) -> dict:
    """The worker's rows for one layer on `world` GPUs (mode "vdev": the
    torch NVSHMEM baseline's, in a process of its own), or its error."""
    command = ranks_command(world, "-m", "bench.expert_parallel_worker", name, *map(str, shape),
                            *mode)
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800, env=ranks_env())
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"layer": name, "world": world, "error": (out.stderr or out.stdout)[-400:].strip()}


def gb_per_s(row, hidden, world, over_nvlink=False, transfer="dispatch"):
    """A transfer's bytes a second: the rows rank 0 sent, or got back (those
    from or to other ranks only, over_nvlink: (W - 1) / W of them)."""
    sent = row["rows_sent"] * hidden * 2 * ((world - 1) / world if over_nvlink else 1)
    return sent / row[f"{transfer}_ms"] / 1e6


def one_chunk(forward, entry) -> float:
    """The forward (graphed ms) an overlap entry compares with: its
    transport's in one chunk."""
    for other in forward["overlap"]:
        if (other["chunks"] == 1
                and other.get("transport") == entry.get("transport", "symmetric_memory")):
            return other["graphed_ms"]
    return forward["ours_graphed_ms"]


def ours_at(run, tokens) -> tuple:
    """Our layer's (eager, graphed) ms at `tokens` a rank (the forward or a
    decode row; decode rows were not timed eagerly: None)."""
    rows = [run["forward"], *run["decode"]]
    row = next(r for r in rows if r["tokens"] == tokens)
    return row.get("ours_ms"), row["ours_graphed_ms"]


def report(data) -> list:
    if "skipped" in data:
        return [f"Not run: {data['skipped']}."]
    done = [r for r in data["runs"] if "error" not in r]
    forward = [(r["layer"], r["world"], r["shape"][0], r["forward"]) for r in done]
    lines = ["Forward at 4096 tokens a rank (ms; ours also replayed from a CUDA graph), forward "
             "+ backward (eager), and dispatch and return timed alone (graphed, each repeated: a "
             "lone dispatch also waits for the ranks before it sends, which a layer's run of "
             "calls does not; GB/s of the rows rank 0 sent, and of those that crossed "
             "NVLink, each way; the return's time includes the sum). The local experts alone: "
             "moe_experts on the rows a rank received, gathered (none of the buffer's rows "
             "that no rank sent). 1st call: the process's first call of ours, wall-clock "
             "(the layout agreed by the ranks, the buffer made, the kernels loaded). Error: "
             "ours against the NCCL baseline's output.", ""]
    lines += table(
        ["layer", "EP", "ours", "ours graphed", "NCCL", "experts alone", "graphed / alone",
         "NCCL / ours", "fwd+bwd ours", "fwd+bwd NCCL", "fwd+bwd alone", "fwd+bwd ours / alone",
         "dispatch µs", "return µs", "dispatch GB/s", "NVLink GB/s", "return NVLink GB/s",
         "1st call ms", "error"],
        [[name, world, fmt(f["ours_ms"]), fmt(f["ours_graphed_ms"]), fmt(f["nccl_ms"]),
          fmt(f["alone_ms"]), fmt(f["ours_graphed_ms"] / f["alone_ms"]),
          fmt(f["nccl_ms"] / f["ours_ms"]), fmt(f["ours_backward_ms"]),
          fmt(f["nccl_backward_ms"]), fmt(f["alone_backward_ms"]),
          fmt(f["ours_backward_ms"] / f["alone_backward_ms"]),
          fmt(f["dispatch_ms"] * 1e3, "{:.0f}"),
          fmt(f["return_ms"] * 1e3, "{:.0f}"), fmt(gb_per_s(f, hidden, world), "{:.0f}"),
          fmt(gb_per_s(f, hidden, world, True), "{:.0f}"),
          fmt(gb_per_s(f, hidden, world, True, "return"), "{:.0f}"),
          fmt(f.get("first_ms"), "{:.1f}"), fmt(f["error_vs_nccl"], "{:.1e}")]
         for name, world, hidden, f in forward])
    by_sms = [(name, world, hidden, f["by_sms"]) for name, world, hidden, f in forward
              if f.get("by_sms")]
    if by_sms:
        lines += ["", "Dispatch and return at 4096 tokens a rank, timed alone (graphed) on the "
                  "given SMs: every kernel of the transfer, torch's barriers included, run in "
                  "a CUDA green context of that many SMs, gg_runtime's grids that share of "
                  "the GPU's (`gg_runtime.sm_limit`; all: every SM, no limit): µs and NVLink "
                  "GB/s each way.", ""]
        lines += table(
            ["layer", "EP", "SMs", "dispatch µs", "dispatch NVLink GB/s", "return µs",
             "return NVLink GB/s"],
            [[name, world, entry["sms"] or "all", fmt(entry["dispatch_ms"] * 1e3, "{:.0f}"),
              fmt(gb_per_s(entry, hidden, world, True), "{:.0f}"),
              fmt(entry["return_ms"] * 1e3, "{:.0f}"),
              fmt(gb_per_s(entry, hidden, world, True, "return"), "{:.0f}")]
             for name, world, hidden, entries in by_sms for entry in entries])
    overlap = [(r["layer"], r["world"], r["forward"]) for r in done if "overlap" in r["forward"]]
    if overlap:
        lines += ["", "Overlap at 4096 tokens a rank: the tokens in chunks, each chunk's "
                  "transfers on a second stream held to the given SMs while the experts of "
                  "the chunks beside it run on the rest (ms; forward replayed from a CUDA "
                  "graph, forward + backward eager, timed at one SM count). Chunks 1: the "
                  "stages one after the other (the rows above).", ""]
        lines += table(
            ["layer", "EP", "transport", "chunks", "transport SMs", "forward graphed",
             "/ chunks 1", "/ experts alone", "fwd+bwd", "fwd+bwd / chunks 1"],
            [[name, world, o.get("transport", "symmetric_memory"), o["chunks"],
              o.get("transport_sms", "-"), fmt(o["graphed_ms"]),
              fmt(o["graphed_ms"] / one_chunk(f, o)), fmt(o["graphed_ms"] / f["alone_ms"]),
              fmt(o["backward_ms"]),
              fmt(o["backward_ms"] and o["backward_ms"] / f["ours_backward_ms"])]
             for name, world, f in overlap for o in f["overlap"]])
    vdev = [(r["layer"], r["world"], v, ours_at(r, v["tokens"])) for r in done
            if isinstance(r.get("vdev"), list) for v in r["vdev"]]
    if vdev:
        lines += ["", "torch's NVSHMEM all-to-all (`all_to_all_vdev_2d` out, "
                  "`all_to_all_vdev_2d_offset` back, each slot's row sent, moe_experts on what "
                  "came, no host sync) as the transport, in a process of its own (ms; ours "
                  "from the rows above; - where the call could not be captured in a CUDA "
                  "graph):", ""]
        lines += table(
            ["layer", "EP", "tokens a rank", "vdev_2d eager", "vdev_2d graphed",
             "its dispatch µs (eager)", "ours eager", "ours graphed", "vdev_2d eager / ours eager",
             "error"],
            [[name, world, v["tokens"], fmt(v["eager_ms"]), fmt(v["graphed_ms"]),
              fmt(v["dispatch_ms"] * 1e3, "{:.0f}"), fmt(eager), fmt(graphed),
              fmt(eager and v["eager_ms"] / eager), fmt(v["error_vs_nccl"], "{:.1e}")]
             for name, world, v, (eager, graphed) in vdev])
    lines += ["", "Decode (µs a step, ours and the experts alone replayed from CUDA graphs; the "
              "NCCL baseline eager, its splits read by the host; 1st call: ours on a buffer "
              "sized for the step, its first call, ms wall-clock):", ""]
    lines += table(
        ["layer", "EP", "tokens a rank", "ours", "NCCL", "experts alone", "ours / alone",
         "dispatch", "return", "1st call ms"],
        [[r["layer"], r["world"], d["tokens"], fmt(d["ours_graphed_ms"] * 1e3, "{:.0f}"),
          fmt(d["nccl_ms"] * 1e3, "{:.0f}"), fmt(d["alone_ms"] * 1e3, "{:.0f}"),
          fmt(d["ours_graphed_ms"] / d["alone_ms"]), fmt(d["dispatch_ms"] * 1e3, "{:.0f}"),
          fmt(d["return_ms"] * 1e3, "{:.0f}"), fmt(d.get("first_ms"), "{:.1f}")]
         for r in done for d in r["decode"]])
    fp8 = [r for r in done if "fp8" in r]
    if fp8:
        lines += ["", "fp8 weights (128 x 128 blocks; the tokens sent quantized per 128 "
                  "columns, their scales beside them), µs a step replayed from CUDA graphs:", ""]
        lines += table(
            ["layer", "EP", "tokens a rank", "ours", "experts alone", "ours / alone",
             "dispatch", "return"],
            [[r["layer"], r["world"], d["tokens"], fmt(d["ours_graphed_ms"] * 1e3, "{:.0f}"),
              fmt(d["alone_ms"] * 1e3, "{:.0f}"), fmt(d["ours_graphed_ms"] / d["alone_ms"]),
              fmt(d["dispatch_ms"] * 1e3, "{:.0f}"), fmt(d["return_ms"] * 1e3, "{:.0f}")]
             for r in fp8 for d in r["fp8"]])
    failed = [f"- {r['layer']} at EP{r['world']}: {r['error']}" for r in data["runs"]
              if "error" in r]
    failed += [f"- the vdev_2d baseline, {r['layer']} at EP{r['world']}: {r['vdev']['error']}"
               for r in data["runs"] if isinstance(r.get("vdev"), dict)]
    return lines + (["", "Not run:", *failed] if failed else [])
