"""gg_runtime's benchmark on one GPU, in one process: each section of
bench/sections/ measures, and its result replaces that section's entry in
bench/results.json (with the device, date, torch, commit and build it ran
on), or, for a section of named rows run with --only, merges into it
(merged); bench/RESULTS.md is then rendered from the whole file
(bench/report.py).

    make bench BENCH_ARGS="--sections host,fp8 --only qwen3"
    cd build && PYTHONPATH=bench-site:.. python -m bench.run --sections host   # the same

The wheel comes first on the path (make bench installs it in build/bench-site),
and it runs from build/: run from the repository root, Python would put the
root first, whose gg_runtime/ is the source without its extensions.
"""
from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import torch

import gg_runtime

from . import report
from .context import WORKLOADS, Context, load_workloads
from .sections import SECTIONS

HERE = Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated, of {','.join(SECTIONS)} (default: all)")
    parser.add_argument("--only", default="",
                        help="run only the workloads and layers whose name contains this")
    parser.add_argument("--workloads", type=Path, default=WORKLOADS)
    parser.add_argument("--out", type=Path, default=HERE,
                        help="folder of results.json, RESULTS.md and plots/ (default: bench/)")
    parser.add_argument("--commit", default=None,
                        help="the commit to record (default: git's HEAD, where this is a checkout)")
    args = parser.parse_args(argv)
    args.sections = [name for name in args.sections.split(",") if name]
    unknown = [name for name in args.sections if name not in SECTIONS]
    if unknown or not args.sections:
        parser.error(f"--sections: unknown {unknown}; choose from {','.join(SECTIONS)}")
    return args


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True,
                          check=True).stdout.strip()


def git_commit():
    """HEAD's short hash, with '+changes' where tracked files differ from it
    (bench/'s own outputs aside); None outside a git checkout."""
    outputs = (f":(exclude)bench/{name}" for name in (report.RESULTS, report.MARKDOWN, "plots"))
    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs)
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if changed else "")


def main(argv=None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/run.py needs a CUDA GPU (python -m bench.report renders "
                         "RESULTS.md without one)")
    torch.manual_seed(0)
    context = Context(load_workloads(args.workloads, args.only), args.only, args.out)
    provenance = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
                  "torch": torch.__version__, "commit": args.commit or git_commit(),
                  "gg_runtime_build": gg_runtime.info()["build"], "only": args.only}
    run_sections({name: SECTIONS[name] for name in args.sections}, context, provenance, args.out)
    print(f"\nwrote {args.out / report.RESULTS} and {args.out / report.MARKDOWN}")


def run_sections(sections: dict, context: Context, provenance: dict, out_dir: Path) -> None:
    """Runs each section, prints its report, and puts its result with the
    provenance in out_dir's results.json in place of its last one; then
    renders RESULTS.md again, after each section (a later failure keeps it).
    A section that could not run here (its data says why: `skipped`) leaves
    a measured last result in place, and says so."""
    results = report.load(out_dir)
    for name, section in sections.items():
        print(f"\n## {section.TITLE} (`{name}`)\n", flush=True)
        data = section.run(context)
        print("\n".join(section.report(data)), flush=True)
        last = results.get(name, {}).get("data", {})
        if "skipped" in data and last and "skipped" not in last:
            print(f"(kept the measured result of {results[name]['date']}, commit "
                  f"{results[name]['commit']})", flush=True)
            continue
        results[name] = merged(section, results.get(name), {**provenance, "data": data})
        report.write(out_dir, results)


def merged(section, last: dict | None, entry: dict) -> dict:
    """entry, or, where the section's rows are named (its ROWS: the key of the
    data's list of rows, each with a "name") and entry ran with --only on the
    commit and device of the last result, that result's rows with entry's in
    place of those of the same name: a section too long for one process runs
    a filter at a time.  The merged entry lists its runs' filters ("" for all)."""
    key = getattr(section, "ROWS", None)
    if (key is None or not entry["only"] or not last or "skipped" in last["data"]
            or (last["commit"], last["device"]) != (entry["commit"], entry["device"])):
        return entry
    rows = {row["name"]: row for row in last["data"][key]}
    rows.update((row["name"], row) for row in entry["data"][key])
    runs = [*last.get("runs", [last.get("only", "")]), entry["only"]]
    return {**entry, "only": "", "runs": runs, "data": {**entry["data"], key: list(rows.values())}}


if __name__ == "__main__":
    main()
