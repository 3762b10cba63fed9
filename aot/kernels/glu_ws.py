"""kernels/glu.py's gated epilogue in Gluon, for the warp-specialised
ragged_glu kernel (kernels/ragged_ws.py): the bias, gu's optional store and
h's store through TMA, staged in the MMA partition's c buffer.  w13_columns
and activate are twins of glu.py's and swiglu.py's Triton functions (a Gluon
kernel cannot call a Triton one): change them together."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from .gluon_api import tma_store
from .glu import CONCATENATED
from .ragged import RAGGED_MAX, RAGGED_ROWS
from .swiglu import GPT_OSS_ALPHA, GPT_OSS_LIMIT
from .ws import column_parts, ragged_descriptor, shared_layout, store_tile


@gluon.jit
def gu_descriptor(gu_ptr, N, PART_M: gl.constexpr, EPI_N: gl.constexpr, GLU: gl.constexpr):
    """gu [T, N] row-major, for TMA stores of [PART_M, EPI_N] parts with the
    rows clipped to a group (ws.ragged_descriptor); CONCATENATED: seen as
    [T, 2, N / 2], a part's columns clipped to its half."""
    if GLU == CONCATENATED:
        block: gl.constexpr = [1, 1, PART_M, 1, EPI_N]
        ld = N.to(gl.int64)
        return tma.make_tensor_descriptor(gu_ptr, [RAGGED_MAX, RAGGED_MAX, RAGGED_ROWS, 2, N // 2],
                                          [2 ** 34 - ld, ld, ld, ld // 2, 1], block,
                                          shared_layout(block, gu_ptr.dtype.element_ty))
    else:
        return ragged_descriptor(gu_ptr, N, N.to(gl.int64), PART_M, EPI_N)


@gluon.jit
def w13_columns(off_n, N, BN: gl.constexpr, GLU: gl.constexpr, layout: gl.constexpr):
    """glu.w13_columns in `layout`."""
    c = gl.arange(0, BN, layout)
    if GLU == CONCATENATED:
        j = off_n // 2 + c % (BN // 2)
        return j + (c // (BN // 2)) * (N // 2), j < N // 2
    else:
        return off_n + c, off_n + c < N


@gluon.jit
def activate(gate, up, gpt_oss):
    """glu.act (kernels/swiglu.py's activation), float32."""
    if gpt_oss != 0:
        g = gl.minimum(gate, GPT_OSS_LIMIT)
        u = gl.minimum(gl.maximum(up, -GPT_OSS_LIMIT), GPT_OSS_LIMIT)
        h = (u + 1.0) * g / (1.0 + gl.exp(-GPT_OSS_ALPHA * g))
    else:
        h = gate / (1.0 + gl.exp(-gate)) * up
    return h


@gluon.jit
def store_gated(acc, c_desc, c_buf, bias, glu, g, G, N, off_n, row, start, end,
                GLU: gl.constexpr):
    """glu.glu_epilogue for a tile at (row >= start, off_n) of the group
    [start, end), bias = (bias_ptr, has_bias) and glu = (gu_desc, save_gu,
    gpt_oss): h's tile stored through c_desc, gu's through gu_desc."""
    bias_ptr, has_bias = bias
    gu_desc, save_gu, gpt_oss = glu
    BN: gl.constexpr = acc.shape[1]
    if has_bias != 0:
        cols, ok = w13_columns(off_n, N, BN, GLU, gl.SliceLayout(0, acc.type.layout))
        group_bias = gl.load(bias_ptr + g.to(gl.int64) * N + cols, mask=ok & (g < G), other=0.0)
        acc = acc + gl.expand_dims(group_bias.to(gl.float32), 0)
    at = RAGGED_ROWS - (end - start) + (row - start)
    if GLU == CONCATENATED:
        gate, up = column_parts(acc, 2)
    else:  # each thread holds column pairs: no data moves
        gate, up = acc.reshape([acc.shape[0], BN // 2, 2]).split()
    if save_gu != 0:
        if GLU == CONCATENATED:
            staged = c_buf.reinterpret(gu_desc.dtype, gu_desc.block_shape, gu_desc.layout)
            halves = (gate, up)
            for i in gl.static_range(2):
                tma.store_wait(0)  # the previous store has read c_buf
                c_buf.store(halves[i].to(gu_desc.dtype))
                fence_async_shared()
                tma_store(gu_desc, (RAGGED_ROWS, end, at, i, off_n // 2), staged)
        else:
            store_tile(acc, gu_desc, c_buf, (RAGGED_ROWS, end, at), off_n)
    store_tile(activate(gate, up, gpt_oss), c_desc, c_buf, (RAGGED_ROWS, end, at), off_n // 2)
