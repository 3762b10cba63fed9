"""4-bit weights widened to bfloat16 in registers, two values a 32-bit
instruction (inline PTX): the K loop's step of kernels/w4.py.  Hopper has no
4-bit tensor cores, so each weight is widened once for a bfloat16 MMA, and
at decode the widening is most of a step's instructions: Triton's integer
and float ops take several a value, these about two
(docs/notes/2026-11-29-w4-widening-in-ptx.md).

Both take b [R, C] bytes, each two values along K (value 2c in byte c's low
nibble, 2c + 1 in its high), and s [R, C] bfloat16, each byte's scale, and
return (the low nibbles' values, the high nibbles') [R, C] bfloat16, which
tl.join(...).reshape(R, 2C) puts in K's order.  With pack=4 an instance sees
four bytes in one register ($4) and their scales in two ($5: bytes 0, 1;
$6: bytes 2, 3); `prmt` first orders the bytes 0, 2, 1, 3, so that a 16-bit
lane pair of the result holds bytes 0 and 1 (or 2 and 3).

Every rounding is the one of the value times its scale, once (fma.rn with
-0.0 added), so either function gives the bfloat16 of the exact product:
INT4's q * scale, MXFP4's e2m1 value times a power of two (exact, subnormal
results included: bfloat16 fma keeps subnormals).  fma.rn.bf16x2 is sm80's,
so sm80 and sm90 compile the same code."""
import triton
import triton.language as tl


@triton.jit
def int4_pairs(b, s):
    """INT4, nibble u standing for q = u - 8: each nibble placed in the
    mantissa of 128.0 (bfloat16 0x4300, 128 + u exact), less 136, times s."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 p, t, one, less, nz;
        mov.b32 one, 0x3F803F80;
        mov.b32 less, 0xC308C308;
        mov.b32 nz, 0x80008000;
        prmt.b32 p, $4, 0, 0x3120;
        lop3.b32 t, p, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 t, t, one, less;
        fma.rn.bf16x2 $0, t, $5, nz;
        shr.b32 t, p, 8;
        lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 t, t, one, less;
        fma.rn.bf16x2 $1, t, $6, nz;
        shr.b32 t, p, 4;
        lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 t, t, one, less;
        fma.rn.bf16x2 $2, t, $5, nz;
        shr.b32 t, p, 12;
        lop3.b32 t, t, 0x000F000F, 0x43004300, 0xEA;
        fma.rn.bf16x2 t, t, one, less;
        fma.rn.bf16x2 $3, t, $6, nz;
        }
        """,
        "=r,=r,=r,=r,r,r,r", [b, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def e2m1_pairs(b, s):
    """MXFP4's e2m1 nibbles (sign, 2 exponent bits, 1 mantissa bit): the
    sign to bit 15 and the other three bits to 8..6 make the bfloat16 of the
    value times 2^-126 (subnormal for 0 and 0.5), times 2^126 (exact), times
    s (a power of two: MXFP4's scale)."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 p, t, u, bias, nz;
        mov.b32 bias, 0x7E807E80;
        mov.b32 nz, 0x80008000;
        prmt.b32 p, $4, 0, 0x3120;
        shl.b32 t, p, 6;
        shl.b32 u, p, 12;
        and.b32 u, u, 0x80008000;
        lop3.b32 t, t, 0x01C001C0, u, 0xEA;
        fma.rn.bf16x2 t, t, bias, nz;
        fma.rn.bf16x2 $0, t, $5, nz;
        shr.b32 t, p, 2;
        shl.b32 u, p, 4;
        and.b32 u, u, 0x80008000;
        lop3.b32 t, t, 0x01C001C0, u, 0xEA;
        fma.rn.bf16x2 t, t, bias, nz;
        fma.rn.bf16x2 $1, t, $6, nz;
        shl.b32 t, p, 2;
        shl.b32 u, p, 8;
        and.b32 u, u, 0x80008000;
        lop3.b32 t, t, 0x01C001C0, u, 0xEA;
        fma.rn.bf16x2 t, t, bias, nz;
        fma.rn.bf16x2 $2, t, $5, nz;
        shr.b32 t, p, 6;
        and.b32 u, p, 0x80008000;
        lop3.b32 t, t, 0x01C001C0, u, 0xEA;
        fma.rn.bf16x2 t, t, bias, nz;
        fma.rn.bf16x2 $3, t, $6, nz;
        }
        """,
        "=r,=r,=r,=r,r,r,r", [b, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def e8m0_scales(raw):
    """MXFP4's e8m0 scale bytes as bfloat16 2^(e - 127): the exponent field
    is e itself, except e = 0 (2^-127, bfloat16's subnormal 0x0040); 255
    becomes infinity, so a NaN scale still makes its products non-finite."""
    bits = tl.where(raw == 0, 0x40, raw.to(tl.uint16) << 7).to(tl.uint16)
    return bits.to(tl.bfloat16, bitcast=True)
