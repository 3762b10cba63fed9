"""How the warp-specialised kernels store a finished tile: by TMA in column
parts staged in a shared buffer (store_tile), through registers where a TMA
box cannot skip rows (store_rows), or transposed into a C stored [N, T]
(store_columns).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma

from .gluon_api import tma_store
from .ws import shared_layout


@gluon.jit
def column_parts(tile, PARTS: gl.constexpr):
    """tile split into PARTS (1 or 2) column blocks, as a tuple.  The halves
    differ in the top bit of the column, which wgmma's layout keeps within a
    thread: no data moves."""
    if PARTS == 1:
        return (tile, )
    else:
        gl.static_assert(PARTS == 2, "the epilogue splits a tile in at most two")
        return tile.reshape([tile.shape[0], 2, tile.shape[1] // 2]).permute((0, 2, 1)).split()


@gluon.jit
def store_tile(tile, c_desc, c_buf, origin, off_n):
    """Store a finished tile through TMA in column parts as wide as c_buf (2-D),
    staging each in c_buf: part i goes to c_desc's block at coordinates
    origin + (off_n + i x the part's width, ), origin being those before the
    column (the group's and the rows')."""
    EPI_N: gl.constexpr = c_buf.shape[1]
    PARTS: gl.constexpr = tile.shape[1] // EPI_N
    staged = c_buf.reinterpret(c_desc.dtype, c_desc.block_shape, c_desc.layout)
    flat = c_buf
    if c_buf.dtype != c_desc.dtype:  # allocated wider (ring_setup's STAGED): a 2-D view of c's type
        flat = c_buf.reinterpret(c_desc.dtype, c_buf.shape,
                                 shared_layout(c_buf.shape, c_desc.dtype))
    parts = column_parts(tile.to(c_desc.dtype), PARTS)
    for i in gl.static_range(PARTS):
        tma.store_wait(0)  # the previous store has read c_buf
        flat.store(parts[i])
        fence_async_shared()
        tma_store(c_desc, origin + (off_n + i * EPI_N, ), staged)


@gluon.jit
def store_rows(tile, c_ptr, ldc, row, first, end, off_n, N):
    """Store a tile at (row, off_n) of a row-major C through registers, only
    rows first .. end and columns below N: a group's first tile where it
    begins before the group (tiled_rows), rows a TMA box cannot skip."""
    layout: gl.constexpr = tile.type.layout
    rows = row + gl.arange(0, tile.shape[0], gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, tile.shape[1], gl.SliceLayout(0, layout))
    keep = gl.expand_dims((rows >= first) & (rows < end), 1) & gl.expand_dims(cols < N, 0)
    at = gl.expand_dims(rows.to(gl.int64) * ldc, 1) + gl.expand_dims(cols, 0)
    gl.store(c_ptr + at, tile.to(c_ptr.dtype.element_ty), mask=keep)


@gluon.constexpr_function
def column_layout(warps):
    """The registers of a part of a tile stored transposed through them
    (store_columns): a warp's threads on 32 consecutive rows of a column, so
    that each store writes 64 consecutive bytes of 16-bit C^T whatever the
    mask (a group's rows start and end anywhere: wider vectors would need
    masks constant over them); its warps side by side."""
    return gl.BlockedLayout([1, 1], [32, 1], [1, warps], [0, 1])


@gluon.constexpr_function
def transposed_shared(dtype):
    """A [rows, cols] buffer stored column-major, TMA's 128-byte swizzle: its
    transpose is a [cols, rows] block of a TMA store of C^T (the rows of a
    partition's tile are at least 128 bytes of C^T's contiguous dimension)."""
    return gl.NVMMASharedLayout(128, dtype.primitive_bitwidth, 2, transposed=True)


@gluon.jit
def store_columns(tile, c_desc, c_buf, c_ptr, ldc, row, first, end, off_n, N):
    """Store a tile at (row, off_n) of a C stored transposed (C[r, n] at
    c_ptr + n * ldc + r: row-major C^T, c_desc's [N, T] with blocks of
    c_buf's transpose), only rows first .. end and columns below N, in
    column parts as wide as c_buf, each staged in it column-major.  A tile
    whose rows all lie in first .. end is stored by TMA; a TMA box cannot end
    at a group's last row, which runs along C^T's contiguous dimension, so
    other tiles are stored through registers (column_layout)."""
    ROWS: gl.constexpr = tile.shape[0]
    EPI_N: gl.constexpr = c_buf.shape[1]
    PARTS: gl.constexpr = tile.shape[1] // EPI_N
    layout: gl.constexpr = column_layout(gl.num_warps())
    staged = c_buf.reinterpret(c_buf.dtype, [ROWS, EPI_N], transposed_shared(c_buf.dtype))
    whole = (row >= first) & (row + ROWS <= end)
    rows = row + gl.arange(0, ROWS, gl.SliceLayout(1, layout))
    row_ok = gl.expand_dims((rows >= first) & (rows < end), 1)
    parts = column_parts(tile.to(c_buf.dtype), PARTS)
    for i in gl.static_range(PARTS):
        tma.store_wait(0)  # the previous store has read c_buf
        staged.store(parts[i])
        if whole:
            fence_async_shared()
            tma_store(c_desc, [off_n + i * EPI_N, row], staged.permute((1, 0)))
        else:
            part = staged.load(layout)
            cols = off_n + i * EPI_N + gl.arange(0, EPI_N, gl.SliceLayout(0, layout))
            at = gl.expand_dims(rows, 1) + gl.expand_dims(cols.to(gl.int64) * ldc, 0)
            gl.store(c_ptr + at, part, mask=row_ok & gl.expand_dims(cols < N, 0))
