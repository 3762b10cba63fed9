"""tests/memcheck.py's sorting of compute-sanitizer's reports: those it counts
apart (APART) and the rest, which are ours."""
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
import memcheck  # noqa: E402


def line_number(file: str, test) -> int:
    lines = (memcheck.KERNEL_SOURCES / file).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if test(line))


def hazard(write: str, read: str) -> str:
    return ("========= Error: Potential RAW hazard detected at __shared__ 0x38540 in block "
            "(4,0,0) :\n"
            f"=========     Write Thread (31,0,0) at k_ws_kernel+0x29d0 in {write}\n"
            f"=========     Read Thread (256,0,0) at k_ws_kernel+0x2a90 in {read}\n"
            "=========     Current Value : 3\n")


def uninitialized(kernel: str) -> str:
    return ("========= Uninitialized __global__ memory read of size 8 bytes\n"
            f"=========     at {kernel}+0x15c00\n"
            "=========     by thread (16,2,0) in block (22,43,0)\n")


def test_hazards_between_def_lines_are_apart_and_others_ours():
    entry = f"ragged_ws.py:{line_number('ragged_ws.py', lambda line: line.startswith('def '))}"
    body = f"loader_ws.py:{line_number('loader_ws.py', lambda line: 'mbarrier.wait(' in line)}"
    log = "========= COMPUTE-SANITIZER\n" + hazard(entry, entry) + "." + hazard(entry, body)
    assert memcheck.reports_apart("racecheck", log) == 1


def test_uninitialized_reads_in_torch_kernels_are_apart_and_in_ours_not():
    torch_kernel = "void at::native::reduce_kernel<(int)128, (int)4>(T3)"
    log = uninitialized(torch_kernel) + uninitialized("route_kernel")
    assert memcheck.reports_apart("initcheck", log) == 1
    assert memcheck.reports_apart("memcheck", log) == 0


def test_only_reports_apart_leave_none_of_ours():
    run = memcheck.Run("racecheck", "0", ("python",), TESTS, True, memcheck.WS_KERNELS)
    assert memcheck.Outcome(run, 4, "1 passed", True, apart=4).ours() == 0
    assert memcheck.Outcome(run, 5, "1 passed", True, apart=4).ours() == 1
    assert memcheck.Outcome(run, None, "", False).ours() is None


def test_shards_hold_every_test_once_and_at_most_their_share():
    tests = [f"t{i}" for i in range(2 * memcheck.MAX_SHARD_TESTS + 50)]
    dealt = memcheck.shards(tests, 2)
    assert len(dealt) == 3 and max(map(len, dealt)) <= memcheck.MAX_SHARD_TESTS
    assert sorted(t for shard in dealt for t in shard) == sorted(tests)
    assert len(memcheck.shards(tests[:10], 4)) == 4 and len(memcheck.shards(tests[:3], 4)) == 3
