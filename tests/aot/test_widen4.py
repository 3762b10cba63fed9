"""aot/kernels/widen4.py's PTX run by a small emulator of the instructions it
uses (tests/aot/ptx_emulator.py, with fma.rn.bf16x2 here), on every byte value, against
the values the formats define: INT4's (u - 8) * scale rounded once to
bfloat16, MXFP4's e2m1 value times 2^(e - 127) (infinity past bfloat16's
range, which only e = 254's largest values reach).  The GPU tests check the
kernels; these check the bit arithmetic on any machine, every nibble, the
outputs' order and the edge scales (MXFP4's e = 0, its subnormal products,
e = 255)."""
import math
import re
import struct

import ptx_emulator
import pytest

from aot.kernels.widen4 import E2M1_ASM, E2M1_WORDS_ASM, INT4_ASM, INT4_WORDS_ASM

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MASK = ptx_emulator.MASK


def bf16_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def bf16_bits(value: float) -> int:
    """value (exact in float32 here) rounded to bfloat16, to nearest even."""
    if math.isnan(value):
        return 0x7FC0
    if math.isinf(value):
        return 0xFF80 if value < 0 else 0x7F80
    f32 = struct.unpack("<I", struct.pack("<f", value))[0]
    assert struct.unpack("<f", struct.pack("<I", f32))[0] == value, "not exact in float32"
    return ((f32 + 0x7FFF + ((f32 >> 16) & 1)) >> 16) & 0xFFFF


def fma_bf16x2(a: int, b: int, c: int) -> int:
    lanes = []
    for shift in (0, 16):
        x, y, z = (bf16_value(v >> shift) for v in (a, b, c))
        lanes.append(bf16_bits(in_bf16(x * y + z)))
    return lanes[0] | lanes[1] << 16


def run_ptx(asm: str, inputs: dict) -> dict:
    return ptx_emulator.run_ptx(asm, inputs, {"fma.rn.bf16x2": fma_bf16x2})


def widen(asm: str, word: int, scales: tuple) -> list:
    """The four bytes of word widened: [(low nibble's value, high's)] a byte,
    as bfloat16 values, given each byte's scale as bfloat16 bits."""
    pairs = [scales[0] | scales[1] << 16, scales[2] | scales[3] << 16]
    out = run_ptx(asm, {"$4": word, "$5": pairs[0], "$6": pairs[1]})
    low = [out["$0"] & 0xFFFF, out["$0"] >> 16, out["$1"] & 0xFFFF, out["$1"] >> 16]
    high = [out["$2"] & 0xFFFF, out["$2"] >> 16, out["$3"] & 0xFFFF, out["$3"] >> 16]
    return [(bf16_value(lo), bf16_value(hi)) for lo, hi in zip(low, high)]


def widen_words(asm: str, first: int, second: int, scales: tuple) -> list:
    """Two words' eight values each widened: [(the first's value j, the
    second's)] for j = 0 .. 7, given each word's scale as bfloat16 bits."""
    out = run_ptx(asm, {"$8": first, "$9": second, "$10": scales[0] | scales[1] << 16})
    return [(bf16_value(out[f"${j}"]), bf16_value(out[f"${j}"] >> 16)) for j in range(8)]


def e2m1(nibble: int) -> float:
    return (-1 if nibble & 8 else 1) * E2M1_VALUES[nibble & 7]


def in_bf16(value: float) -> float:
    """value, or the infinity of its sign where past bfloat16's largest
    ((2 - 2^-7) * 2^127): MXFP4's largest values at e = 254."""
    return value if abs(value) <= (2 - 2 ** -7) * 2.0 ** 127 else math.copysign(math.inf, value)


def e8m0_bits(exponent: int) -> int:
    """widen4.e8m0_scales' bfloat16 of an e8m0 byte."""
    return 0x40 if exponent == 0 else (exponent << 7) & 0xFFFF


def words():
    """Every byte value in every position of a word, with the others varied."""
    for byte in range(256):
        yield byte | ((byte * 7 + 3) & 0xFF) << 8 | ((byte * 13 + 5) & 0xFF) << 16 | \
            ((byte * 31 + 11) & 0xFF) << 24


def test_emulator_is_checked():
    """The registers the two programs write are the outputs read above."""
    for asm in (INT4_ASM.value, E2M1_ASM.value):
        assert sorted(set(re.findall(r"\$\d+", asm))) == ["$0", "$1", "$2", "$3", "$4", "$5",
                                                            "$6"]
    for asm in (INT4_WORDS_ASM.value, E2M1_WORDS_ASM.value):
        assert set(re.findall(r"\$\d+", asm)) == {f"${i}" for i in (*range(8), 8, 9, 10)}


@pytest.mark.parametrize("scale", [1.0, 1.6875 * 2.0 ** -7, 49 * 2.0 ** -14, -0.75, 2.0 ** 100])
def test_int4(scale):
    scale_bits = bf16_bits(scale)
    s = bf16_value(scale_bits)
    for word in words():
        got = widen(INT4_ASM.value, word, (scale_bits,) * 4)
        for i, (low, high) in enumerate(got):
            byte = (word >> 8 * i) & 0xFF
            assert low == bf16_value(bf16_bits(((byte & 15) - 8) * s))
            assert high == bf16_value(bf16_bits(((byte >> 4) - 8) * s))


@pytest.mark.parametrize("exponent", [0, 1, 6, 118, 127, 140, 254])
def test_mxfp4(exponent):
    s = 2.0 ** (exponent - 127)
    for word in words():
        got = widen(E2M1_ASM.value, word, (e8m0_bits(exponent),) * 4)
        for i, (low, high) in enumerate(got):
            byte = (word >> 8 * i) & 0xFF
            assert (low, high) == (in_bf16(e2m1(byte & 15) * s), in_bf16(e2m1(byte >> 4) * s))
            # The sign of zero is kept too (its nibble's sign bit).
            assert math.copysign(1, low) == (-1 if byte & 8 else 1)


def test_mxfp4_nan_scale_is_not_finite():
    got = widen(E2M1_ASM.value, 0x2F2F2F2F, (e8m0_bits(255),) * 4)
    assert all(math.isinf(v) for pair in got for v in pair)


def word_pairs():
    """Word pairs whose nibbles take every value at every position."""
    for first in words():
        yield first, (first * 2654435761 + 12345) & MASK


@pytest.mark.parametrize("scales", [(1.0, -0.75), (1.6875 * 2.0 ** -7, 2.0 ** 100)])
def test_int4_words(scales):
    bits = tuple(bf16_bits(s) for s in scales)
    s = tuple(bf16_value(b) for b in bits)
    for first, second in word_pairs():
        for j, got in enumerate(widen_words(INT4_WORDS_ASM.value, first, second, bits)):
            want = tuple(bf16_value(bf16_bits((((w >> 4 * j) & 15) - 8) * si))
                         for w, si in ((first, s[0]), (second, s[1])))
            assert got == want


@pytest.mark.parametrize("exponents", [(0, 127), (118, 254)])
def test_mxfp4_words(exponents):
    bits = tuple(e8m0_bits(e) for e in exponents)
    s = tuple(2.0 ** (e - 127) for e in exponents)
    for first, second in word_pairs():
        for j, got in enumerate(widen_words(E2M1_WORDS_ASM.value, first, second, bits)):
            want = tuple(in_bf16(e2m1((w >> 4 * j) & 15) * si)
                         for w, si in ((first, s[0]), (second, s[1])))
            assert got == want
