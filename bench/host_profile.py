"""Host-side cost of one grouped_mm call, layer by layer (microseconds per call).

    PYTHONPATH=build/bench-site python bench/host_profile.py
"""
import time

import torch

import gg_runtime
from gg_runtime import _C, raw
from gg_runtime._native import current_stream


def per_call_us(fn, calls=3000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


a = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8, 128, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
offs = torch.arange(32, 257, 32, device="cuda", dtype=torch.int32)
out = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16)
As = [torch.randn(16, 32, device="cuda", dtype=torch.float16) for _ in range(128)]
Bs = [torch.randn(32, 16, device="cuda", dtype=torch.float16) for _ in range(128)]
args = (0, current_stream(0), 1, True, "", True, a.data_ptr(), b.data_ptr(), out.data_ptr(),
        offs.data_ptr(), 256, 128, 128, 8, 128, b.stride(0), 128, 128)
basic_args = args[:3] + (False,) + args[4:]  # `basic` needs no global scratch
fields = raw._list_fields(As, Bs, False, torch.float16, 0)
ms, ns = fields[2::raw.LIST_FIELDS], fields[3::raw.LIST_FIELDS]
list_out = torch.empty(sum(ms), 16, device="cuda", dtype=torch.float16)
list_args = (0, current_stream(0), 0, True, "", False, fields, list_out.data_ptr(), 1)


def synced(fn):
    def call():
        fn()
        torch.cuda.synchronize()
    return call


rows = {
    "validation (check_grouped_mm)": lambda: raw.check_grouped_mm(a, b, offs, None),
    "torch.empty": lambda: torch.empty(256, 128, device="cuda", dtype=torch.bfloat16),
    "current stream": lambda: current_stream(0),
    "_C.run_ragged_m (dispatch + launch)": lambda: _C.run_ragged_m(*args),
    "_C.run_ragged_m, basic (no scratch)": lambda: _C.run_ragged_m(*basic_args),
    "raw.grouped_mm": lambda: raw.grouped_mm(a, b, offs),
    "gg_runtime.grouped_mm": lambda: gg_runtime.grouped_mm(a, b, offs),
    "grouped_gemm(128): per-group fields": lambda: raw._list_fields(As, Bs, False, torch.float16, 0),
    "grouped_gemm(128): outputs": lambda: raw._list_outputs(ms, ns, As[0]),
    "grouped_gemm(128): _C.run_list": lambda: _C.run_list(*list_args),
    "gg_runtime.grouped_gemm, 128 groups": lambda: gg_runtime.grouped_gemm(As, Bs),
    "  the same, synchronised each call": synced(lambda: gg_runtime.grouped_gemm(As, Bs)),
    "torch.ops.gg_runtime.grouped_mm": lambda: torch.ops.gg_runtime.grouped_mm(a, b, offs),
}
for name, fn in rows.items():
    print(f"{name:40} {per_call_us(fn):7.1f} us")
