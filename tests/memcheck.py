"""make memcheck (a GPU machine with compute-sanitizer): the GPU tests under
NVIDIA's compute-sanitizer, one line per tool:

- memcheck of gg_runtime's kernels (OUR_KERNELS) with exact allocations
  (PYTORCH_NO_CUDA_MEMORY_CACHING=1: under torch's caching allocator a write
  past a tensor's end lands in the allocator's slack or in another live
  tensor, unseen) over every GPU test but those capturing CUDA graphs, which
  need the caching allocator: those run with it;
- initcheck (reads of device memory nothing wrote), exact allocations, over
  the tests named by --initcheck-tests (a few that reach every operator),
  every kernel instrumented (under a kernel filter the writes of torch's
  kernels, which make the tests' inputs, go untracked and their memory reads
  as never written);
- memcheck, exact allocations, of the bench's sections that check their
  results (BENCH_SECTIONS), each section a process, after the tests and one
  a GPU (their workloads are large);
- racecheck and synccheck on the warp-specialised Gluon kernels (compute-
  sanitizer's kernel filter: the other kernels run unchecked), over the
  tests that force each of their variants.

Two kinds of report are counted apart (APART), listed in the summary, and do
not fail the run; every other report does, and so do reports the tool
dropped (its error buffer overflowed: they could not be sorted):
- initcheck's reports in torch's kernels (the tests' references);
- racecheck's hazards between two accesses at a Gluon kernel's `def` line:
  code Triton generates for gl.warp_specialize, which hands the partitions
  their arguments and state through shared memory, each write before named
  barrier 1 and each read after it.  A kernel with nothing but that
  hand-over draws none; one with a loader partition and a TMA ring between
  the partitions (lab/racecheck_probe.py's `ring`, its result exact) draws
  them at the same bytes (docs/notes).

Each tool's tests are dealt into shards of at most MAX_SHARD_TESTS tests
(and at least --jobs shards), each a pytest process under the tool; --jobs
processes run at a time, dealt over the machine's GPUs (one each:
CUDA_VISIBLE_DEVICES).  A sanitizer's process holds GPU memory of its own,
and under memcheck with exact allocations that memory grows with every
kernel call the process makes (docs/notes): too many processes a GPU, or too
many tests a process, run the GPU out of it.  The reports go to --logs as
they are written.
Exit status 1 if any tool found an error or any test failed.

    python tests/memcheck.py --runtime-tests tests/runtime --logs build/memcheck
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

GRAPH_TESTS = "graph"  # the tests that capture CUDA graphs have it in their names
# compute-sanitizer's kernel filters.  gg_runtime's kernels (Triton's and Gluon's)
# have plain C names ending in _kernel; torch's and cuBLAS's are C++-mangled
# (_Z...), so torch's work around the tests (the float64 references above all)
# runs unchecked, at full speed.
OUR_KERNELS = "regex=^[a-z0-9_]+_kernel$"
WS_KERNELS = "kns=_ws_kernel"  # the warp-specialised Gluon kernels' names end so
# The bench's sections that check gg_runtime's results against a reference before
# timing them (the others time only, train for many steps, or run an anchor).
BENCH_SECTIONS = ("workloads", "wgrad", "training", "experts", "bias", "fp16", "cases", "fp8",
                  "fp8_experts", "w4_experts", "vllm_fp8", "fp8_training",
                  "fp8_moe_training")
BENCH_WRONG = r"wrong result|differs from"  # how a section reports a failed check
# initcheck's default tests: every operator once (the guards' test), the MoE
# router and the fp8 serving shapes, the ragged product's group edges.
INITCHECK_TESTS = ("test_gpu_guards.py", "test_gpu_moe_operators.py::test_route_operator",
                   "test_gpu_moe_fp8.py::test_served_shapes",
                   "test_gpu_moe_w4.py::test_layouts_activations_biases",
                   "test_gpu_grouped_mm.py::test_ragged_m_edge_distributions")
# The tests forcing every warp-specialised variant: their files, and what their
# names hold.
WS_TESTS = {"test_gpu_variants.py": ("",), "test_gpu_moe_fp8.py": ("variant",),
            "test_gpu_moe_fp8_decode.py": ("decode",), "test_gpu_fp8_grouped_mm.py": ("variant",)}


# The reports counted apart (module docstring), by tool: what they are, and a
# test of a report's text.
APART = {
    "racecheck": ("gl.warp_specialize's hand-over",
                  lambda report: at_lines(report, lambda line: line.startswith("def "))),
    "initcheck": ("torch's kernels",
                  lambda report: not re.search(r" at [a-z0-9_]+_kernel\+0x", report)),
}
KERNEL_SOURCES = Path(__file__).resolve().parent.parent / "aot" / "kernels"
# How each tool is run: every report printed (without host backtraces) where
# reports are sorted, memcheck's first few with them.
SORTED_FLAGS = ("--print-limit", "0", "--show-backtrace", "no")  # 0: unlimited
TOOL_FLAGS = {"memcheck": ("--print-limit", "20"),
              "racecheck": (*SORTED_FLAGS, "--racecheck-report", "hazard")}

# Run from tests/runtime, node ids relative to it (else pytest's root is the
# repository's, where setup.py is).
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".")


@dataclass(frozen=True)
class Run:
    tool: str
    shard: str  # names the run among the tool's
    command: tuple  # what runs under the tool
    cwd: Path
    exact: bool  # PYTORCH_NO_CUDA_MEMORY_CACHING=1
    kernels: str  # compute-sanitizer's kernel filter
    env: tuple = ()  # (name, value) pairs

    def name(self) -> str:
        return f"{self.tool}_{'exact' if self.exact else 'caching'}_{self.shard}"


@dataclass
class Outcome:
    run: Run
    errors: int | None  # None: no ERROR SUMMARY (the tool or pytest crashed)
    tests: str  # pytest's last line
    passed: bool
    apart: int = 0  # of errors, those counted apart (APART)
    dropped: int = 0  # reports the tool dropped unprinted (not among errors)

    def ours(self) -> int | None:
        return None if self.errors is None else self.errors - self.apart


def source_line(location: str) -> str:
    """The kernel source's text at 'file.py:line' ('' where there is none)."""
    name, _, number = location.rpartition(":")
    path = KERNEL_SOURCES / name
    if not (path.is_file() and number.isdigit()):
        return ""
    lines = path.read_text().splitlines()
    return lines[int(number) - 1] if 0 < int(number) <= len(lines) else ""


def at_lines(report: str, test) -> bool:
    """Whether every kernel source line a report names passes test."""
    locations = re.findall(r" in (\S+\.py:\d+)$", report, flags=re.MULTILINE)
    return bool(locations) and all(test(source_line(where)) for where in locations)


def reports_apart(tool: str, log: str) -> int:
    """How many of the log's reports APART counts apart for the tool."""
    if tool not in APART:
        return 0
    _, is_apart = APART[tool]
    # (not anchored to a line's start: pytest's progress dots share the tool's lines)
    reports = re.split(r"========= (?=Error: Potential|Uninitialized)", log)[1:]
    return sum(is_apart(report.split("\n=========     Saved host backtrace")[0])
               for report in reports)


def collect(runtime_tests: Path, files: list) -> list:
    """The node ids of the tests in `files` (run from runtime_tests)."""
    result = subprocess.run([*PYTEST, "--collect-only", *files], cwd=runtime_tests,
                            capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if "::" in line]


# Tests a sanitizer process runs at most (the memory it holds grows with them).
MAX_SHARD_TESTS = 100


def shards(tests: list, jobs: int) -> list:
    """tests dealt round-robin into at least `jobs` shards of at most
    MAX_SHARD_TESTS tests, none empty (neighbouring tests, often alike in
    cost, spread over the shards)."""
    count = max(jobs, -(-len(tests) // MAX_SHARD_TESTS))
    return [tuple(tests[i::count]) for i in range(min(count, len(tests)))]


def test_runs(tests: list, tools: list, jobs: int, runtime_tests: Path,
              initcheck: tuple) -> list:
    plans = []
    graphs = [t for t in tests if GRAPH_TESTS in t.split("::", 1)[1]]
    others = [t for t in tests if t not in graphs]
    ws = [t for t in others if any(t.startswith(f + "::") and any(w in t for w in words)
                                   for f, words in WS_TESTS.items())]

    def pytest(tool, shard, ids, exact, kernels):
        command = (*PYTEST, "-o", "console_output_style=count", *ids)
        return Run(tool, str(shard), command, runtime_tests, exact, kernels)

    for tool in tools:
        if tool == "memcheck":
            plans += [pytest(tool, i, s, True, OUR_KERNELS)
                      for i, s in enumerate(shards(others, jobs))]
            # capture needs the caching allocator
            plans += [pytest(tool, i, s, False, OUR_KERNELS)
                      for i, s in enumerate(shards(graphs, 1))]
        elif tool == "initcheck":
            chosen = [t for t in others if t.startswith(initcheck)]
            plans += [pytest(tool, i, s, True, "") for i, s in enumerate(shards(chosen, jobs))]
        else:
            plans += [pytest(tool, i, s, True, WS_KERNELS) for i, s in enumerate(shards(ws, jobs))]
    return plans


def bench_runs(sections: list, bench_site: Path, logs: Path) -> list:
    """memcheck, exact allocations, of the bench's sections, each in a process of
    its own, results written under logs (bench/results.json is left alone).  With
    exact allocations a section's CUDA-graph replays fall back to eager calls
    (bench/measure.py's graphed)."""
    repository = Path(__file__).resolve().parent.parent
    env = (("PYTHONPATH", f"{bench_site.resolve()}:{repository}"),)
    return [Run("memcheck", f"bench_{name}",
                (sys.executable, "-m", "bench.run", "--sections", name, "--commit", "memcheck",
                 "--out", str(logs / f"bench_{name}")),
                repository / "build", True, OUR_KERNELS, env)
            for name in sections]


def visible_gpus() -> list:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them."""
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        return os.environ["CUDA_VISIBLE_DEVICES"].split(",")
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return [str(i) for i in range(max(1, listing.count("GPU ")))]


def execute(run: Run, gpu: str, logs: Path) -> Outcome:
    kernels = ("--kernel-name", run.kernels) if run.kernels else ()
    command = ["compute-sanitizer", "--tool", run.tool, *TOOL_FLAGS.get(run.tool, SORTED_FLAGS),
               *kernels, *run.command]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu, **dict(run.env))
    # The caller's setting would make the caching runs (CUDA graphs) fail too.
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    if run.exact:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    path = logs / f"{run.name()}.log"
    with path.open("w") as log_file:  # written as it runs: progress can be read
        returncode = subprocess.run(command, cwd=run.cwd, env=env, stdout=log_file,
                                    stderr=subprocess.STDOUT).returncode
    log = path.read_text()
    # racecheck ends with "RACECHECK SUMMARY: n hazards displayed (e errors, w warnings)"
    summary = re.findall(r"(?:ERROR SUMMARY: |hazards displayed \()(\d+) error", log)
    if run.command[1:3] == ("-m", "bench.run"):
        # a section reports a wrong result in its output and goes on
        wrong = len(re.findall(BENCH_WRONG, log))
        tests = f"bench section: exit {returncode}, {wrong} wrong results"
        passed = returncode == 0 and not wrong
    else:
        pytest_lines = [line for line in log.splitlines() if not line.startswith("=========")
                        and re.search(r"\d+ (passed|failed|skipped|error)", line)]
        tests = pytest_lines[-1].strip("= ") if pytest_lines else "no pytest summary"
        passed = returncode == 0 and "failed" not in tests
    dropped = sum(int(n) for n in re.findall(r"(\d+) errors were skipped", log))
    # the tool counts each of its overflow warnings among its errors
    overflow_warnings = len(re.findall(r"Error buffer overflow has been detected", log))
    return Outcome(run, int(summary[-1]) if summary else None, tests, passed,
                   reports_apart(run.tool, log) + overflow_warnings, dropped)


def run_all(plans: list, gpus: list, jobs: int, logs: Path) -> list:
    """The outcomes of plans, jobs at a time, the i-th on GPU i modulo their number."""
    with ThreadPoolExecutor(jobs) as pool:
        return list(pool.map(lambda i: execute(plans[i], gpus[i % len(gpus)], logs),
                             range(len(plans))))


def summary_line(tool: str, outcomes: list) -> str:
    mine = [o for o in outcomes if o.run.tool == tool]
    crashed = [o.run.name() for o in mine if o.errors is None]
    errors = sum(o.errors or 0 for o in mine)
    failed = [o.run.name() for o in mine if not o.passed]
    counts = {}
    for o in mine:
        for number, word in re.findall(r"(\d+) (passed|failed|skipped|error)", o.tests):
            counts[word] = counts.get(word, 0) + int(number)
    tests = ", ".join(f"{n} {word}" for word, n in counts.items()) or "no tests"
    line = f"{tool}: {errors} errors over {len(mine)} runs ({tests})"
    apart = sum(o.apart for o in mine)
    if apart:
        line += f"; {apart} of them in {APART[tool][0]}, counted apart"
    dropped = sum(o.dropped for o in mine)
    if dropped:
        line += f"; {dropped} dropped unprinted by the tool (its buffer overflowed), not sorted"
    if crashed:
        line += f"; no summary from {', '.join(crashed)}"
    if failed:
        line += f"; failing runs: {', '.join(failed)}"
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime-tests", type=Path, default=Path(__file__).parent / "runtime")
    parser.add_argument("--logs", type=Path, default=Path("build/memcheck"))
    parser.add_argument("--jobs", type=int, default=None,
                        help="sanitizer processes at once (default: 4 a GPU)")
    parser.add_argument("--tools", default="memcheck,initcheck,racecheck,synccheck")
    parser.add_argument("--files", default="test_gpu_*.py", help="a glob of the runtime tests")
    parser.add_argument("--bench", default=",".join(BENCH_SECTIONS),
                        help="bench sections to run under memcheck ('' for none)")
    parser.add_argument("--bench-site", type=Path, default=Path("build/bench-site"),
                        help="where the wheel is installed for the bench (make bench-site)")
    parser.add_argument("--initcheck-tests", default=",".join(INITCHECK_TESTS),
                        help="node id prefixes of the tests initcheck runs")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    runtime_tests = args.runtime_tests.resolve()
    files = sorted(p.name for p in runtime_tests.glob(args.files))
    tools = args.tools.split(",")
    logs = args.logs.resolve()
    gpus = visible_gpus()
    jobs = args.jobs or 4 * len(gpus)
    plans = test_runs(collect(runtime_tests, files), tools, jobs, runtime_tests,
                      tuple(args.initcheck_tests.split(",")))
    outcomes = run_all(plans, gpus, jobs, logs)
    if "memcheck" in tools and args.bench:
        outcomes += run_all(bench_runs(args.bench.split(","), args.bench_site, logs), gpus,
                            len(gpus), logs)
    for o in outcomes:
        print(f"  {o.run.name()}: {o.errors} errors; {o.tests}", flush=True)
    lines = [summary_line(tool, outcomes) for tool in tools]
    print("\n".join(lines))
    (args.logs / "summary.txt").write_text("\n".join(lines) + "\n")
    ok = all(o.ours() == 0 and o.dropped == 0 and o.passed for o in outcomes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
