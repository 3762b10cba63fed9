"""Host-side cost of one call, layer by layer (microseconds per call).

    PYTHONPATH=build/bench-site python bench/host_profile.py
"""
import time

import torch

import gg_runtime
from gg_runtime import _native, gemm_list, ragged
from gg_runtime.cases import classify
from gg_runtime.testing import list_inputs, moe_inputs


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


a, b, offs = moe_inputs([32] * 8, 128, 128, torch.bfloat16)
w = b.detach().requires_grad_()
out = torch.empty(256, 128, device="cuda", dtype=torch.bfloat16)
As, Bs = list_inputs([(16, 16, 32)] * 128, torch.float16)
words = gemm_list._group_words(As, Bs, False, torch.float16, 0)
width = len(gemm_list.GROUP_FIELDS)
ms, ns = words[3::width], words[4::width]
launch = _native.launcher("ragged_m")
named = dict(a_ptr=a.data_ptr(), b_ptr=b.data_ptr(), c_ptr=out.data_ptr(), offs_ptr=offs.data_ptr(),
             T=256, N=128, K=128, G=8, lda=128, b_group_stride=b.stride(0), ldb=128, ldc=128)


def synced(fn):
    def call():
        fn()
        torch.cuda.synchronize()
    return call


rows = {
    "validation (classify)": lambda: classify(a, b, offs, None, None),
    "torch.empty": lambda: torch.empty(256, 128, device="cuda", dtype=torch.bfloat16),
    "target (device, stream, dtypes)": lambda: _native.target(a, out.dtype),
    "ragged_m launcher (dispatch + launch)":
        lambda: launch("nt", *_native.target(a, out.dtype), **named),
    "ragged.ragged_m": lambda: ragged.ragged_m(a, b, offs),
    "gg_runtime.grouped_mm": lambda: gg_runtime.grouped_mm(a, b, offs),
    "gg_runtime.grouped_mm, autograd recording": lambda: gg_runtime.grouped_mm(a, w, offs),
    "torch.ops.gg_runtime.grouped_mm":
        lambda: torch.ops.gg_runtime.grouped_mm(a, b, offs, None, None),
    "torch._grouped_mm": lambda: torch._grouped_mm(a, b, offs),
    "torch._grouped_mm, autograd recording": lambda: torch._grouped_mm(a, w, offs),
    "grouped_gemm(128): group words":
        lambda: gemm_list._group_words(As, Bs, False, torch.float16, 0),
    "grouped_gemm(128): outputs": lambda: gemm_list._outputs(ms, ns, As[0]),
    "gg_runtime.grouped_gemm, 128 groups": lambda: gg_runtime.grouped_gemm(As, Bs),
    "  the same, synchronised each call": synced(lambda: gg_runtime.grouped_gemm(As, Bs)),
}
for name, fn in rows.items():
    print(f"{name:44} {per_call_us(fn):7.1f} us")
