import contextlib
import importlib.util
import os
import sys
import zlib
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

# The runtime tests run against the INSTALLED wheel; the source tree must not shadow it.
_REPO = str(Path(__file__).resolve().parents[2])
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _REPO]

import gg_runtime  # noqa: E402
from gg_runtime import _C  # noqa: E402
from gg_runtime.testing import forced, guarded, poisoned  # noqa: E402

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
# torch.compile's backends for the traced tests: inductor generates Triton
# kernels for the ops around ours, so it needs Triton (a training machine has it;
# a serving one that runs gg_runtime alone need not).
COMPILE_BACKENDS = ["aot_eager", pytest.param("inductor", marks=pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="inductor needs Triton"))]
# Autograd over fake CUDA tensors asks torch's CUDA device guard, which a
# CPU-only torch build does not have: it aborts the process (or raises).
fake_autograd = pytest.mark.skipif(
    torch.version.cuda is None,
    reason="autograd over fake CUDA tensors needs a torch built with CUDA (CPU-only: aborts)")


def device_arch():
    """The table arch the wheel runs on this GPU (the extension's rule), or None."""
    return _C.device_info(0)["kernel_arch"] if HAS_GPU else None


def up_projection_runs_on(variant, inter: int) -> bool:
    """Whether a scaled_ragged_glu variant runs on experts of width `inter`:
    the family's conditions (aot/families/scaled_ragged_glu.py), which its key
    ends with."""
    if variant["key"].endswith("_whole_halves"):
        return inter % 128 == 0
    return inter % 128 == 64 if variant["key"].endswith("_odd_halves") else True


def tma_runs_here() -> bool:
    """Whether the wheel has `tma` variants for the path this GPU takes."""
    return any(v["flavour"] == "tma" and v["arch"] == device_arch() for v in _C.variants())


@pytest.fixture
def fake():
    """Within the test, tensors made on "cuda" are fake: shapes, dtypes and
    strides without a GPU (the CPU validation tests)."""
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        yield mode


def cuda(*shape, dtype=torch.bfloat16):
    """An uninitialised CUDA tensor (fake under the `fake` fixture)."""
    return torch.empty(*shape, dtype=dtype, device="cuda")


# The tests that capture CUDA graphs have this in their names (tests/memcheck.py
# runs them under torch's caching allocator, which capture needs).
CAPTURES_GRAPHS = "graph"


def pytest_configure(config):
    config.addinivalue_line("markers", "unguarded: the poison fixture sets no guards (tests "
                            "that count the memory the operators keep)")


@pytest.fixture
def poison(request):
    """Every output gg_runtime allocates starts as NaN (unwritten elements
    show), and every output and scratch tensor lies between canary-filled
    guard regions checked when the test ends (writes out of bounds fail it;
    not under the `unguarded` mark, where the guards would keep tensors the
    test expects freed, nor in tests that capture CUDA graphs, where their
    fills would be captured rather than run)."""
    unguarded = (request.node.get_closest_marker("unguarded") is not None
                 or CAPTURES_GRAPHS in request.node.name)
    with poisoned(), contextlib.nullcontext() if unguarded else guarded():
        yield


@pytest.fixture(params=[True, False], ids=["tma", "basic"])
def allow_tma(request):
    """The test runs with TMA kernels allowed, then with `basic` forced.  Only
    sm90 has `tma` variants, so elsewhere one run suffices."""
    if request.param and not tma_runs_here():
        pytest.skip("no tma kernels for this GPU's path")
    with forced(basic=not request.param):
        yield request.param


# GG_TEST_SM_LIMIT=n (make test's third GPU pass): every test's launches under
# gg_runtime.sm_limit(n), so that each persistent program walks many tiles,
# and a program's state carried from tile to tile (its rings' phases, its
# counts) is tested where a full grid gives most programs one tile.
SM_LIMIT = int(os.environ.get("GG_TEST_SM_LIMIT", "0"))


@pytest.fixture(autouse=True)
def sm_limited():
    with gg_runtime.sm_limit(SM_LIMIT):
        yield


@pytest.fixture(autouse=True)
def fresh_seed(request):
    """Each test's own seed, the same in every run (str's hash() differs
    between processes): a failure on random data reproduces."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
