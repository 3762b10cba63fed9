"""grouped_gemm: independent C_i = A_i @ B_i of any sizes (the `list` kernel
family).  Checks the groups, allocates the outputs, launches once."""
from __future__ import annotations

from itertools import accumulate

from . import _native
from .validate import check_same, check_tensor, check_unit_inner_stride, require

# One group's words in the list family's group table (the kernel's order,
# aot/kernels/list_gemm.py).  Checked against the build's table at import.
GROUP_FIELDS = ("a", "b", "c", "M", "N", "K", "lda", "ldb", "ldc")
_WIDTH = len(GROUP_FIELDS)
_C_AT, _M_AT, _N_AT = (GROUP_FIELDS.index(name) for name in ("c", "M", "N"))
_FAMILY = _native.FAMILIES["list"]
_LAUNCH = _native.launcher("list")
if tuple(name for name, *_ in _FAMILY["group_fields"]) != GROUP_FIELDS:
    raise ImportError(f"gg_runtime was built with list group fields {_FAMILY['group_fields']}, "
                      f"this module writes {GROUP_FIELDS}")
DTYPES = _native.family_dtypes("list")


def _check_group(i: int, a, b, trans_b: bool, ref) -> None:
    check_tensor(a, f"As[{i}]", 2, DTYPES)
    check_tensor(b, f"Bs[{i}]", 2, DTYPES)
    check_same(a, f"As[{i}]", ref, "As[0]")
    check_same(b, f"Bs[{i}]", ref, "As[0]")
    check_unit_inner_stride(a, f"As[{i}]")
    check_unit_inner_stride(b, f"Bs[{i}]")
    b_k = b.shape[1] if trans_b else b.shape[0]
    if a.shape[1] != b_k:
        layout = "[N, K]" if trans_b else "[K, N]"
        raise ValueError(f"group {i}: As[{i}] is {tuple(a.shape)} ([M, K]) but Bs[{i}] is "
                         f"{tuple(b.shape)} ({layout}): K differs ({a.shape[1]} vs {b_k})")


def _group_words(As, Bs, trans_b: bool, dtype, device):
    """The group table (c left 0 until the outputs exist), or None when some
    group fails a check.  The hot loop of grouped_gemm: one cheap combined
    test per group; _check_group says what is wrong."""
    words = []
    for a, b in zip(As, Bs):
        (m, k), (lda, a_inner) = a.shape, a.stride()
        (b_rows, b_cols), (ldb, b_inner) = b.shape, b.stride()
        n, b_k = (b_rows, b_cols) if trans_b else (b_cols, b_rows)
        if (a.dtype is not dtype or b.dtype is not dtype or a.get_device() != device
                or b.get_device() != device or k != b_k or (a_inner != 1 and k > 1)
                or (b_inner != 1 and b_cols > 1)):
            return None
        words += (a.data_ptr(), b.data_ptr(), 0, m, n, k, lda, ldb, n)  # C_i is contiguous
    return words


_MIXED_N_ALIGN = 64  # elements: 128 bytes, so every C_i can take TMA stores


def _outputs(ms: list, ns: list, ref):
    """(Cs, their addresses): every C_i in one allocation, back to back, each
    contiguous.  One allocation instead of one per group; when every N is
    equal the C_i are row slices of one [sum M, N] tensor, otherwise each
    starts at a multiple of _MIXED_N_ALIGN elements."""
    size = ref.element_size()
    if ns.count(ns[0]) == len(ns):
        buffer = _native.empty((sum(ms), ns[0]), ref)
        step = size * ns[0]
        base = buffer.data_ptr()
        starts = accumulate(ms[:-1], initial=0)
        return list(buffer.split(ms)), [base + step * m for m in starts]
    sizes = [-(-m * n // _MIXED_N_ALIGN) * _MIXED_N_ALIGN for m, n in zip(ms, ns)]
    buffer = _native.empty((sum(sizes),), ref)
    base = buffer.data_ptr()
    Cs, addresses = [], []
    for m, n, offset in zip(ms, ns, accumulate(sizes[:-1], initial=0)):
        Cs.append(buffer.as_strided((m, n), (n, 1), offset))
        addresses.append(base + size * offset)
    return Cs, addresses


def grouped_gemm(As, Bs, trans_b: bool) -> list:
    require(isinstance(As, (list, tuple)) and isinstance(Bs, (list, tuple)),
            "As and Bs must be lists of tensors", TypeError)
    if len(As) != len(Bs):  # not require(): its message would be formatted on every call
        raise ValueError(f"As has {len(As)} matrices but Bs has {len(Bs)}")
    if not As:
        return []
    ref = As[0]
    check_tensor(ref, "As[0]", 2, DTYPES)
    if _native.bridge is not None:  # the same in C++, or None where this path must run
        Cs = _native.bridge.grouped_gemm(As, Bs, trans_b, *_native.target(ref, ref.dtype))
        if Cs is not None:
            return Cs
    try:
        words = _group_words(As, Bs, trans_b, ref.dtype, ref.get_device())
    except (AttributeError, TypeError, ValueError):  # not a tensor, not 2-D
        words = None
    if words is None:
        for i, (a, b) in enumerate(zip(As, Bs)):
            _check_group(i, a, b, trans_b, ref)
        raise AssertionError("the fast and the full group checks disagree")
    Cs, words[_C_AT::_WIDTH] = _outputs(words[_M_AT::_WIDTH], words[_N_AT::_WIDTH], ref)
    _LAUNCH("nt" if trans_b else "nn", *_native.target(ref, ref.dtype), group_table=words)
    return Cs
