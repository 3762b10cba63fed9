"""The compiled extensions, their kernel folder, and the small facts the Python
layer passes to them: dtype codes (from the generated tables), the caller's
device and stream.  Every output the Python layer allocates goes through
`empty`; `bridge` is the torch bridge, or None."""
from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

import torch

from . import _C

KERNEL_DIR = Path(__file__).parent / "_kernels"
_C.set_kernel_dir(str(KERNEL_DIR))

# torch dtype -> the code _C.launch takes; the build's dtype list is the only owner.
# float32 inputs take the `tf32` code where torch allows TF32 for matmuls.
_CODES = {name: code for code, name in enumerate(_C.dtypes())}
DTYPE_CODES = {getattr(torch, name): code for name, code in _CODES.items() if name != "tf32"}
_TF32 = _CODES["tf32"]

CudaError = _C.CudaError
UnsupportedDeviceError = _C.UnsupportedDeviceError
FAMILIES = _C.families()  # name -> parameters, in the table's index order


def family_dtypes(family: str) -> tuple:
    """The torch dtypes a family's inputs may have (tf32 is float32's other code)."""
    return tuple(getattr(torch, name) for name in FAMILIES[family]["dtypes"] if name != "tf32")


def launcher(family: str):
    """The launch entry of one kernel family:

        launch(layout, device, stream, dtype, out_dtype, *, <its parameters>)

    with keyword-only parameters named as in the family's description (from
    the build's table), so a call site names every value and a missing or
    misspelt name is a TypeError.  Made once per family at import; a call
    passes the values on in ABI order, with no dictionary built per call."""
    names = FAMILIES[family]["caller_params"]
    source = (f"def launch(layout, device, stream, dtype, out_dtype, *, {', '.join(names)}):\n"
              f"    _launch({list(FAMILIES).index(family)}, layout, device, stream, dtype, "
              f"out_dtype, {', '.join(names)})\n")
    namespace = {"_launch": _C.launch}
    exec(compile(source, f"<gg_runtime launcher {family}>", "exec"), namespace)
    return namespace["launch"]


def _stream_getter():
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw  # a plain int, without building a torch.cuda.Stream object
    return lambda index: torch.cuda.current_stream(index).cuda_stream


current_stream = _stream_getter()


def target(x: torch.Tensor, out_dtype: torch.dtype) -> tuple:
    """(device, stream, input dtype code, output dtype code) of a call whose
    inputs are like x, writing out_dtype."""
    index = x.get_device()
    code = DTYPE_CODES[x.dtype]
    if x.dtype is torch.float32 and _tf32_allowed():
        code = _TF32
    return index, current_stream(index), code, DTYPE_CODES[out_dtype]


def runs_tma(device: int) -> bool:
    """Whether calls on this device run the wheel's `tma` variants (its kernel
    arch has them: sm90 cubins, not the sm80 path, which forcing PTX takes)."""
    return _runs_tma(device, _C.force_ptx())


@functools.cache
def _runs_tma(device: int, force_ptx: bool) -> bool:
    arch = _C.device_info(device)["kernel_arch"]
    return any(v["arch"] == arch and v["flavour"] == "tma" for v in _C.variants())


def _tf32_allowed() -> bool:
    """Whether torch lets float32 matmuls use TF32.  torch >= 2.9 has
    fp32_precision ('tf32', 'ieee', or 'none' = the global setting, resolved
    here); there, reading the legacy allow_tf32 raises once the new API was used."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    return precision == "tf32" if precision is not None else bool(matmul.allow_tf32)


def _load_bridge():
    """(gg_runtime._torch_C or None, why not): the hot paths of grouped_gemm
    and grouped_mm reading tensors in C++.  It links libtorch, whose C++ ABI
    holds within one torch release only, so it is loaded only under the torch
    release (and C++ ABI) it was built with; elsewhere the Python twins run."""
    path = Path(__file__).parent / "_torch_C.json"
    if not path.exists():
        return None, "the wheel was built without torch"
    built = json.loads(path.read_text())
    running = {"torch": torch.__version__.split("+")[0],
               "cxx11_abi": torch.compiled_with_cxx11_abi()}
    if built != running:
        return None, f"built for {built}, running {running}"
    try:
        return importlib.import_module("gg_runtime._torch_C"), ""
    except ImportError as error:  # e.g. a torch build of that release with other symbols
        return None, f"import failed: {error}"


bridge, BRIDGE_ABSENT_REASON = _load_bridge()


def empty(shape: tuple, like: torch.Tensor, dtype=None) -> torch.Tensor:
    """Every output is allocated here (tests replace it to poison outputs)."""
    return like.new_empty(shape, dtype=dtype)
