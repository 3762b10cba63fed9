"""kernels/glu.py's gated epilogue in Gluon, for the warp-specialised
ragged_glu and scaled_ragged_glu kernels (kernels/ragged_ws.py): the bias,
gu's optional store, h's optional quantization to fp8 and h's store through
TMA, staged in the MMA partition's c buffer.  w13_columns, activate,
quantize_blocks and to_e4m3 are twins of glu.py's, swiglu.py's and
quantize.py's Triton functions (a Gluon kernel cannot call a Triton one):
change them together."""
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from .epilogue_ws import column_parts, store_tile
from .fast_math import sigmoid
from .glu import CONCATENATED
from .gluon_api import clamp, tma_store
from .quantize import AMAX_FLOOR, E4M3_MAX, E4M3_MAX_RECIPROCAL
from .ragged import RAGGED_MAX, RAGGED_ROWS
from .scaled import SCALE_BLOCK
from .swiglu import GPT_OSS_ALPHA, GPT_OSS_CODE, GPT_OSS_LIMIT
from .ws import ragged_descriptor, shared_layout


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
def activate(gate, up, activation):
    """glu.act (kernels/swiglu.py's activation), float32, with fast_math's
    sigmoid (the same bits but where gate < -87: there 0, not a subnormal)."""
    if activation == GPT_OSS_CODE:
        g = gl.minimum(gate, GPT_OSS_LIMIT, propagate_nan=tl.PropagateNan.ALL)
        u = clamp(up, -GPT_OSS_LIMIT, GPT_OSS_LIMIT, propagate_nan=tl.PropagateNan.ALL)
        h = (u + 1.0) * (g * sigmoid(GPT_OSS_ALPHA * g))
    else:
        h = gate * sigmoid(gate) * up
    return h


@gluon.jit
def quantize_blocks(x, scale_ptr, rows, row_ok, block, blocks_per_row):
    """quantize.quantize_blocks: x [R, 128] float32, each row one block."""
    scale = gl.maximum(gl.max(gl.abs(x), 1), AMAX_FLOOR) * E4M3_MAX_RECIPROCAL
    gl.store(scale_ptr + rows.to(gl.int64) * blocks_per_row + block, scale, mask=row_ok)
    return to_e4m3(x, gl.expand_dims(scale, 1))


@gluon.jit
def to_e4m3(x, scale):
    """quantize.to_e4m3: x / scale (scale broadcast over x) saturated to
    e4m3's finite range."""
    inv = gl.div_rn(1.0, scale)
    q = x * inv
    q = gl.fma(gl.fma(-q, scale, x), inv, q)
    return clamp(q, -E4M3_MAX, E4M3_MAX, propagate_nan=tl.PropagateNan.ALL).to(gl.float8e4nv)


@gluon.jit
def quantized_h(h, out_scales, N, off_n, row, end):
    """h's tile [rows row .., 128 columns from off_n / 2] (float32) in e4m3,
    each row's 128 columns one 1x128 block whose scale goes to out_scales
    [T, cdiv(N / 2, 128)] (rows below end); columns past N / 2 count as 0."""
    gl.static_assert(h.shape[1] == SCALE_BLOCK, "a tile's h columns are one scale block")
    layout: gl.constexpr = h.type.layout
    cols = off_n // 2 + gl.arange(0, SCALE_BLOCK, gl.SliceLayout(0, layout))
    h = gl.where(gl.expand_dims(cols < N // 2, 0), h, 0.0)
    rows = row + gl.arange(0, h.shape[0], gl.SliceLayout(1, layout))
    blocks = (N // 2 + SCALE_BLOCK - 1) // SCALE_BLOCK
    return quantize_blocks(h, out_scales, rows, rows < end, off_n // 2 // SCALE_BLOCK, blocks)


@gluon.jit
def store_gated(acc, c_desc, c_buf, bias, glu, g, G, N, off_n, row, start, end,
                GLU: gl.constexpr, out_scales=None):
    """glu.glu_epilogue for a tile at (row >= start, off_n) of the group
    [start, end), bias = (bias_ptr, has_bias) and glu = (gu_desc, save_gu,
    activation): h's tile stored through c_desc, gu's through gu_desc (None:
    never); out_scales: h stored in fp8 (quantized_h)."""
    bias_ptr, has_bias = bias
    gu_desc, save_gu, activation = glu
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
    if gu_desc is not None:  # noqa: SIM102 (a constexpr, then a runtime test)
        if save_gu != 0:
            store_gu(acc, gate, up, gu_desc, c_buf, (RAGGED_ROWS, end, at), off_n, GLU)
    h = activate(gate, up, activation)
    if out_scales is not None:
        h = quantized_h(h, out_scales, N, off_n, row, end)
    store_tile(h, c_desc, c_buf, (RAGGED_ROWS, end, at), off_n // 2)


@gluon.jit
def store_gu(acc, gate, up, gu_desc, c_buf, origin, off_n, GLU: gl.constexpr):
    """gu's tile (the accumulator plus bias, or CONCATENATED its gate and up
    halves) through gu_desc at origin + the column."""
    if GLU == CONCATENATED:
        staged = c_buf.reinterpret(gu_desc.dtype, gu_desc.block_shape, gu_desc.layout)
        halves = (gate, up)
        for i in gl.static_range(2):
            tma.store_wait(0)  # the previous store has read c_buf
            c_buf.store(halves[i].to(gu_desc.dtype))
            fence_async_shared()
            tma_store(gu_desc, origin + (i, off_n // 2), staged)
    else:
        store_tile(acc, gu_desc, c_buf, origin, off_n)
