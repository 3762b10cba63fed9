"""make memcheck (a GPU machine with compute-sanitizer): the GPU tests under
NVIDIA's compute-sanitizer, one line per tool:

- memcheck of gg_runtime's kernels (OUR_KERNELS) with exact allocations
  (PYTORCH_NO_CUDA_MEMORY_CACHING=1: under torch's caching allocator a write
  past a tensor's end lands in the allocator's slack or in another live
  tensor, unseen) over every GPU test but those capturing CUDA graphs, which
  need the caching allocator: those run with it;
- initcheck (reads of device memory nothing wrote) of gg_runtime's kernels,
  exact allocations, the same tests;
- racecheck and synccheck on the warp-specialised Gluon kernels (compute-
  sanitizer's kernel filter: the other kernels run unchecked), over the
  tests that force each of their variants.

Each tool's tests are dealt into --jobs shards, each a pytest process under
the tool; --jobs processes run at a time.  The full reports go to --logs.
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
# The tests forcing every warp-specialised variant: their files, and what their
# names hold.
WS_TESTS = {"test_gpu_variants.py": ("",), "test_gpu_moe_fp8.py": ("variant", "decode"),
            "test_gpu_fp8_grouped_mm.py": ("variant",)}


# Run from tests/runtime, node ids relative to it (else pytest's root is the
# repository's, where setup.py is).
PYTEST = (sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", ".")


@dataclass(frozen=True)
class Run:
    tool: str
    shard: int
    tests: tuple  # pytest node ids
    exact: bool  # PYTORCH_NO_CUDA_MEMORY_CACHING=1
    kernels: str  # compute-sanitizer's kernel filter

    def name(self) -> str:
        return f"{self.tool}_{'exact' if self.exact else 'caching'}_{self.shard}"


@dataclass
class Outcome:
    run: Run
    errors: int | None  # None: no ERROR SUMMARY (the tool or pytest crashed)
    tests: str  # pytest's last line
    passed: bool


def collect(runtime_tests: Path, files: list) -> list:
    """The node ids of the tests in `files` (run from runtime_tests)."""
    result = subprocess.run([*PYTEST, "--collect-only", *files], cwd=runtime_tests,
                            capture_output=True, text=True, check=True)
    return [line for line in result.stdout.splitlines() if "::" in line]


def shards(tests: list, count: int) -> list:
    """tests dealt round-robin into at most `count` non-empty shards (neighbouring
    tests, often alike in cost, spread over the shards)."""
    return [tuple(tests[i::count]) for i in range(min(count, len(tests)))]


def runs(tests: list, tools: list, jobs: int) -> list:
    plans = []
    graphs = [t for t in tests if GRAPH_TESTS in t.split("::", 1)[1]]
    others = [t for t in tests if t not in graphs]
    ws = [t for t in others if any(t.startswith(f + "::") and any(w in t for w in words)
                                   for f, words in WS_TESTS.items())]
    for tool in tools:
        if tool in ("memcheck", "initcheck"):
            plans += [Run(tool, i, s, True, OUR_KERNELS)
                      for i, s in enumerate(shards(others, jobs))]
            if tool == "memcheck":  # capture needs the caching allocator
                plans += [Run(tool, i, s, False, OUR_KERNELS)
                          for i, s in enumerate(shards(graphs, 1))]
        else:
            plans += [Run(tool, i, s, True, WS_KERNELS) for i, s in enumerate(shards(ws, jobs))]
    return plans


def execute(run: Run, runtime_tests: Path, logs: Path) -> Outcome:
    command = ["compute-sanitizer", "--tool", run.tool, "--print-limit", "20", "--kernel-name",
               run.kernels, *PYTEST, *run.tests]
    env = dict(os.environ)
    if run.exact:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    result = subprocess.run(command, cwd=runtime_tests, env=env, capture_output=True, text=True)
    log = result.stdout + result.stderr
    (logs / f"{run.name()}.log").write_text(log)
    summary = re.findall(r"ERROR SUMMARY: (\d+) error", log)
    pytest_lines = [line for line in log.splitlines()
                    if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    tests = pytest_lines[-1].strip("= ") if pytest_lines else "no pytest summary"
    passed = result.returncode == 0 and "failed" not in tests
    return Outcome(run, int(summary[-1]) if summary else None, tests, passed)


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
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--tools", default="memcheck,initcheck,racecheck,synccheck")
    parser.add_argument("--files", default="test_gpu_*.py", help="a glob of the runtime tests")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    runtime_tests = args.runtime_tests.resolve()
    files = sorted(p.name for p in runtime_tests.glob(args.files))
    tools = args.tools.split(",")
    plans = runs(collect(runtime_tests, files), tools, args.jobs)
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda r: execute(r, runtime_tests, args.logs.resolve()),
                                 plans))
    for o in outcomes:
        print(f"  {o.run.name()}: {o.errors} errors; {o.tests}", flush=True)
    lines = [summary_line(tool, outcomes) for tool in tools]
    print("\n".join(lines))
    (args.logs / "summary.txt").write_text("\n".join(lines) + "\n")
    ok = all(o.errors == 0 and o.passed for o in outcomes)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
