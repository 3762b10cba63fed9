"""The compiled extensions: the torch-free core `_C` (kernel table, settings,
info) and the torch operators `_ops` (torch.ops.gg_runtime.*, all host work of
every op in C++), and `call`, which runs an operator and raises its errors as
the classes gg_runtime documents."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from . import _C

KERNEL_DIR = Path(__file__).parent / "_kernels"
_C.set_kernel_dir(str(KERNEL_DIR))

# The operators use torch 2.10's stable ABI; an older torch (installed past the
# wheel's requirement) would fail to load them with an undefined symbol.
OLDEST_TORCH = (2, 10)
if tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2]) < OLDEST_TORCH:
    raise ImportError(f"gg_runtime needs torch >= {'.'.join(map(str, OLDEST_TORCH))}, found "
                      f"{torch.__version__}")

from . import _ops  # noqa: E402, F401  (registers torch.ops.gg_runtime; needs _C's runtime)

CudaError = _C.CudaError
"""A CUDA driver call or a kernel launch failed (a subclass of RuntimeError).

The message names the kernel (its variant key) where a launch failed, and
the CUDA error's name and text (`CUDA_ERROR_X (...)`).  Bad input never
gets this far: it raises TypeError or ValueError before anything
launches."""
UnsupportedDeviceError = _C.UnsupportedDeviceError
"""This wheel has no kernels for the GPU (a subclass of RuntimeError).

Raised by every op on a GPU of compute capability below 8.0, and by the fp8
functions (`scaled_grouped_mm`, `quantize_fp8`, `moe_experts` and `fused_experts`
with fp8 weights) on any GPU other than 9.0.
The message says why; `info()["device"]["reason"]` tells it without
calling an op."""
OPS = torch.ops.gg_runtime

# csrc/ops/op_support.h's tags: the class each error of the operators is raised
# as (torch releases differ in what they make of a C++ exception).
_TAGGED = {"[gg_runtime ValueError] ": ValueError, "[gg_runtime TypeError] ": TypeError,
           "[gg_runtime CudaError] ": CudaError,
           "[gg_runtime UnsupportedDeviceError] ": UnsupportedDeviceError}
# torch's dispatcher's own message for an argument of the wrong type, and how
# gg_runtime's messages name the types.
_WRONG_TYPE = re.compile(r"Expected a value of type '(.+?)' for argument '(\w+)' but instead "
                         r"found type '(\w+)'")
_TYPE_NAMES = {"Tensor": "a torch.Tensor", "Optional[Tensor]": "a torch.Tensor or None",
               "List[Tensor]": "a list of torch.Tensor", "bool": "a bool", "str": "a str",
               "Optional[ScalarType]": "a torch.dtype or None"}


def _translated(error: Exception):
    """The error gg_runtime documents for an operator's error, or None."""
    message = str(error)
    for tag, kind in _TAGGED.items():
        at = message.find(tag)
        if at >= 0:
            return kind(message[at + len(tag):])
    wrong_type = _WRONG_TYPE.search(message) if isinstance(error, RuntimeError) else None
    if wrong_type is not None:
        expected, name, found = wrong_type.groups()
        return TypeError(f"{name} must be {_TYPE_NAMES.get(expected, expected)}, got {found}")
    return None


def check_types(tensors=(), optional=(), flags=(), dtypes=(), ints=()) -> None:
    """A TypeError naming the first argument of the wrong type, in the words
    of the operators' own (_TYPE_NAMES): (name, value) pairs of tensors, of
    tensors or None, of bools, of torch.dtypes or None, of ints (not bools).  For the Python entry
    points, before they read their arguments or pass them to an operator
    (torch's dispatcher takes None for a tensor and an int for a dtype, and
    fails inside torch on them, differently from release to release)."""
    for name, value in tensors:
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be {_TYPE_NAMES['Tensor']}, got {type(value).__name__}")
    for name, value in optional:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be {_TYPE_NAMES['Optional[Tensor]']}, got "
                            f"{type(value).__name__}")
    for name, value in flags:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be {_TYPE_NAMES['bool']}, got {type(value).__name__}")
    for name, value in dtypes:
        if value is not None and not isinstance(value, torch.dtype):
            raise TypeError(f"{name} must be a torch.dtype or None, got {type(value).__name__}")
    for name, value in ints:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")


# torch's stable ABI cannot pass a tensor of some dtypes to an operator (the
# two below, by c10's ScalarType numbers, are the ones users hold); its
# message gives the number only.
_UNPASSABLE = re.compile(r"Not yet supported ScalarType (\d+)")
_UNPASSABLE_DTYPES = {44: torch.float8_e8m0fnu, 45: torch.float4_e2m1fn_x2}


def _unpassable(op, args, error: Exception):
    """A TypeError naming the operator's argument whose dtype the stable ABI
    cannot pass, where error says so; else None."""
    found = _UNPASSABLE.search(str(error))
    if found is None:
        return None
    dtype = _UNPASSABLE_DTYPES.get(int(found.group(1)))
    for argument, value in zip(op._schema.arguments, args):
        tensors = value if isinstance(value, (list, tuple)) else (value,)
        if dtype is not None and any(isinstance(t, torch.Tensor) and t.dtype == dtype
                                     for t in tensors):
            return TypeError(f"{argument.name} must not be {dtype}: {op._schema.name} takes no "
                             "tensor of that dtype there")
    return TypeError(f"{op._schema.name} was given a tensor of a dtype it cannot take "
                     f"(c10 ScalarType {found.group(1)})")


def call(op, *args):
    """op(*args), its errors raised as TypeError, ValueError, CudaError or
    UnsupportedDeviceError (no cost unless it raises)."""
    try:
        return op(*args)
    except (ValueError, RuntimeError) as error:
        translated = _translated(error) or _unpassable(op, args, error)
        if translated is None:
            raise
        raise translated from None


def call_untracked_if_possible(op, *args):
    """call(op, *args), past the operator's autograd kernel where no tensor
    argument records a gradient: there that kernel (torch.library's, in
    Python: grouped_mm's) would only pass the call on, at a cost of several
    microseconds.  Under torch.compile every call goes through it (the
    compiler traces it)."""
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
            isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)):
        return call(op, *args)
    with torch._C._AutoDispatchBelowAutograd():
        return call(op, *args)


def tf32_allowed() -> bool:
    """Whether torch lets float32 matmuls use TF32.  torch >= 2.9 has
    fp32_precision ('tf32', 'ieee', or 'none' = the global setting, resolved
    here); there, reading the legacy allow_tf32 raises once the new API was used."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", None)
    return precision == "tf32" if precision is not None else bool(matmul.allow_tf32)
