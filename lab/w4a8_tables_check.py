"""The MXFP4 -> e4m3 conversion docs/notes/2026-11-29-w4a8-prefill-design.md
proposes, modelled in Python (no GPU): a packed word's eight e2m1 nibbles
shifted down by d binades (d = 0 .. 14, a group's distance below its row's
largest scale) and up by 2^6, through two `prmt` lookups of an 8-byte table
of e4m3 magnitudes and two more for the signs; checked against the exact
e4m3 encoding of every nibble at every d.

    python lab/w4a8_tables_check.py
"""
from __future__ import annotations

import random

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# d = 12 .. 14: the smallest magnitudes are e4m3 subnormals (no shift of one table).
SUBNORMAL_TABLES = {12: (0x0C080400, 0x1C181410), 13: (0x06040200, 0x14100C08),
                    14: (0x03020100, 0x0C080604)}


def e4m3_bits(value: float, negative: bool) -> int:
    """The e4m3 byte of value (exact in e4m3, else ValueError), sign by `negative`."""
    sign = 0x80 if negative else 0
    if value == 0:
        return sign
    for exponent in range(1, 16):
        for mantissa in range(8):
            if 2.0 ** (exponent - 7) * (1 + mantissa / 8) == value:
                return sign | exponent << 3 | mantissa
    for mantissa in range(1, 8):
        if mantissa * 2.0 ** -9 == value:
            return sign | mantissa
    raise ValueError(f"{value} is not exact in e4m3")


def prmt(a: int, b: int, selector: int) -> int:
    """PTX prmt.b32's default mode (selectors' bit 3 clear)."""
    source = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    return sum(source[(selector >> 4 * i) & 7] << 8 * i for i in range(4))


def tables(d: int) -> tuple:
    """The e4m3 bytes of magnitude codes 0 .. 3 and 4 .. 7 at shift d."""
    if d <= 11:
        return ((0x6C686000 - d * 0x08080800) & 0xFFFFFFFF,
                (0x7C787470 - d * 0x08080808) & 0xFFFFFFFF)
    return SUBNORMAL_TABLES[d]


def convert(word: int, d: int) -> tuple:
    """(values 0 .. 3, values 4 .. 7) of `word` as e4m3 bytes, four a word."""
    low, high = tables(d)
    magnitudes = word & 0x77777777
    even_signs = (word << 4) & 0x80808080  # values 0, 2, 4, 6 in bytes 0 .. 3
    odd_signs = word & 0x80808080  # values 1, 3, 5, 7
    first = prmt(low, high, magnitudes & 0xFFFF) | prmt(even_signs, odd_signs, 0x5140)
    second = prmt(low, high, magnitudes >> 16) | prmt(even_signs, odd_signs, 0x7362)
    return first, second


def main():
    words = [int(f"{n:x}" * 8, 16) for n in range(16)] + [random.getrandbits(32)
                                                         for _ in range(4096)]
    mismatches = 0
    for d in range(15):
        for word in words:
            first, second = convert(word, d)
            got = [(first >> 8 * i) & 0xFF for i in range(4)] + [(second >> 8 * i) & 0xFF
                                                                for i in range(4)]
            for j in range(8):
                nibble = (word >> 4 * j) & 15
                want = e4m3_bits(E2M1[nibble & 7] * 2.0 ** (6 - d), bool(nibble & 8))
                mismatches += got[j] != want
    print(f"{mismatches} mismatches over {len(words)} words x 15 shifts x 8 values")
    return 1 if mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
