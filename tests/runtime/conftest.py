import sys
from pathlib import Path

import pytest
import torch

# The runtime tests run against the INSTALLED wheel; the source tree must not shadow it.
_REPO = str(Path(__file__).resolve().parents[2])
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _REPO]

HAS_GPU = torch.cuda.is_available()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")


def device_arch():
    if not HAS_GPU:
        return None
    major, minor = torch.cuda.get_device_capability()
    return 90 if (major, minor) == (9, 0) else 80 if major == 8 else None


@pytest.fixture
def poison(monkeypatch):
    """Every output gg_runtime allocates starts as NaN: unwritten elements show."""
    from gg_runtime import raw

    def poisoned_empty(shape, like):
        return like.new_empty(shape).fill_(float("nan"))

    monkeypatch.setattr(raw, "empty", poisoned_empty)


@pytest.fixture(params=[True, False], ids=["tma", "basic"])
def allow_tma(request):
    """Both flavours on sm90; on sm80 only `basic` exists, so one run suffices."""
    if request.param and device_arch() != 90:
        pytest.skip("TMA kernels run on sm90 only")
    return request.param


@pytest.fixture(autouse=True)
def fresh_seed(request):
    torch.manual_seed(hash(request.node.nodeid) % (2 ** 31))
