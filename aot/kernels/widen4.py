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
$6: bytes 2, 3); `prmt` first orders the bytes 0, 2, 1, 3 (into p), so that
a 16-bit lane pair of the result holds bytes 0 and 1 (or 2 and 3).  Each
output register is one step of the same shape: the nibbles it takes are
shifted into place, made a bfloat16 pair, and scaled.

INT4_WORDS_ASM and E2M1_WORDS_ASM are the same steps over two int32 words,
eight values each, for kernels/w4_decode.py (_words_asm says the registers).

Every rounding is the one of the value times its scale, once (fma.rn with
-0.0 added), so either function gives the bfloat16 of the exact product:
INT4's q * scale, MXFP4's e2m1 value times a power of two (exact, subnormal
results included: bfloat16 fma keeps subnormals; infinity past bfloat16's
range, which only the values of 2 and more at e = 254 reach).
fma.rn.bf16x2 is sm80's, so sm80 and sm90 compile the same code.
tests/aot/test_widen4.py runs this PTX through an emulator on every byte."""
import triton
import triton.language as tl

# Output register -> (the scale register of its bytes, the bit offset in p
# of its two nibbles: the low nibbles of bytes 0 and 1 at 0, of bytes 2 and 3
# at 8; the high nibbles 4 bits above).
STEPS = ((0, 5, 0), (1, 6, 8), (2, 5, 4), (3, 6, 12))


def _asm(registers: str, step) -> tl.constexpr:
    """The PTX of one instance: `registers` declared (and set), p made, then
    step(output, scale register, offset) for each of STEPS."""
    body = "".join(step(out, scale, offset) for out, scale, offset in STEPS)
    return tl.constexpr("{\n.reg .b32 p, t, nz, " + registers + "mov.b32 nz, 0x80008000;\n"
                        "prmt.b32 p, $4, 0, 0x3120;\n" + body + "}")


def _shifted(source: str, bits: int) -> str:
    """The PTX moving `source` left by `bits` (right where negative) into t
    (nothing where 0: t's users read `source`)."""
    if bits == 0:
        return ""
    return f"{'shl' if bits > 0 else 'shr'}.b32 t, {source}, {abs(bits)};\n"


def _int4_step(out: int, scale: int, offset: int) -> str:
    """Nibble u into the mantissa of 128.0 (bfloat16 0x4300: 128 + u, exact),
    less 136 (exact: q = u - 8), times the scale."""
    return (_shifted("p", -offset)
            + f"lop3.b32 t, {'t' if offset else 'p'}, 0x000F000F, 0x43004300, 0xEA;\n"
            "fma.rn.bf16x2 t, t, one, less;\n"
            f"fma.rn.bf16x2 ${out}, t, ${scale}, nz;\n")


def _e2m1_step(out: int, scale: int, offset: int) -> str:
    """The nibble's sign (bit offset + 3) to bit 15 (u) and its other three
    bits to 8..6 (t): the bfloat16 of the e2m1 value times 2^-126; times
    2^126, times the scale."""
    sign = 12 - offset
    sign_bits = f"shl.b32 u, p, {sign};\nand.b32 u, u, 0x80008000;\n" if sign else \
        "and.b32 u, p, 0x80008000;\n"
    return (_shifted("p", 6 - offset) + sign_bits
            + "lop3.b32 t, t, 0x01C001C0, u, 0xEA;\n"
            "fma.rn.bf16x2 t, t, bias, nz;\n"
            f"fma.rn.bf16x2 ${out}, t, ${scale}, nz;\n")


INT4_ASM = _asm("one, less;\nmov.b32 one, 0x3F803F80;\nmov.b32 less, 0xC308C308;\n",
                _int4_step)
E2M1_ASM = _asm("u, bias;\nmov.b32 bias, 0x7E807E80;\n", _e2m1_step)


def _words_asm(asm: tl.constexpr, step) -> tl.constexpr:
    """asm's PTX (its steps by `step`) for two int32 words of eight values each
    ($8, $9: K 8w .. 8w + 7, value j in nibble j) and their scales, a
    bfloat16 pair ($10: the first word's, the second's): output j ($j) holds
    value j of the first word in its low half and of the second in its high
    half.  kernels/w4_decode.py's order: a word's eight values are one K of
    eight products."""
    head = asm.value[:asm.value.index("prmt.b32 p, $4")]
    halves = [f"prmt.b32 p, $8, $9, {sel};\n"
              + "".join(step(4 * half + j, 10, 4 * j) for j in range(4))
              for half, sel in enumerate(("0x5410", "0x7632"))]  # bytes 0, 1; then 2, 3
    return tl.constexpr(head + "".join(halves) + "}")


INT4_WORDS_ASM = _words_asm(INT4_ASM, _int4_step)
E2M1_WORDS_ASM = _words_asm(E2M1_ASM, _e2m1_step)


@triton.jit
def int4_pairs(b, s):
    """INT4, nibble u standing for q = u - 8, times s."""
    return tl.inline_asm_elementwise(INT4_ASM, "=r,=r,=r,=r,r,r,r", [b, s],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def e2m1_pairs(b, s):
    """MXFP4's e2m1 nibbles (sign, 2 exponent bits, 1 mantissa bit) times s
    (a power of two: MXFP4's scale)."""
    return tl.inline_asm_elementwise(E2M1_ASM, "=r,=r,=r,=r,r,r,r", [b, s],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def e8m0_scales(raw):
    """MXFP4's e8m0 scale bytes as bfloat16 2^(e - 127): the exponent field
    is e itself, except e = 0 (2^-127, bfloat16's subnormal 0x0040); 255
    becomes infinity, so a NaN scale still makes its products non-finite."""
    bits = tl.where(raw == 0, 0x40, raw.to(tl.uint16) << 7).to(tl.uint16)
    return bits.to(tl.bfloat16, bitcast=True)
