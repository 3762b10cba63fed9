"""aot/kernels/widen_fp8.py's widening on any machine: its PTX run by
tests/aot/ptx_emulator.py on every byte value at every position and every
shift of a word's scale group below its block's largest (0 .. 20: exact,
then rounded, then zero), with the tables the kernel uses (the closed form's
constants where it takes them, the per-magnitude bytes' rule elsewhere,
written here as the kernel's e4m3_byte computes them), against e4m3's
rounding to nearest even of the values the format defines: e2m1 * 2^(6 -
shift).  The GPU tests check the kernel through moe_experts."""
import math

import ptx_emulator
import pytest

from aot.kernels.widen_fp8 import (FAST_SHIFT, TABLE_HIGH, TABLE_LOW, TABLE_STEP_HIGH,
                                   TABLE_STEP_LOW, WIDEN_WORD_ASM)

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e4m3_byte(value: float) -> int:
    """value (|value| <= 448, exact in float64) as e4m3 bits, rounded to
    nearest even (subnormals' step 2^-9), its sign kept for zero."""
    sign = 0x80 if math.copysign(1, value) < 0 else 0
    magnitude = abs(value)
    if magnitude < 2.0 ** -6:  # subnormal: M * 2^-9
        return sign | round(magnitude / 2.0 ** -9)  # round() is to nearest even
    exponent = math.floor(math.log2(magnitude))
    mantissa = round((magnitude / 2.0 ** exponent - 1) * 8)
    if mantissa == 8:
        exponent, mantissa = exponent + 1, 0
    return sign | (exponent + 7) << 3 | mantissa


def e4m3_byte_as_the_kernel(magnitude: int, shift: int) -> int:
    """widen_fp8.e4m3_byte's steps, in Python."""
    e = magnitude >> 1
    m = magnitude & 1 if e > 0 else 0
    field = (e + 12 if e > 0 else 12) - shift
    if field >= 1:
        return field << 3 | m << 2
    return {0: (2 + m) << 1, -1: 2 + m, -2: 1 + m, -3: m}.get(field, 0)


def table(shift: int) -> tuple:
    """The kernel's (low, high) table words at `shift`."""
    if shift <= FAST_SHIFT.value:
        return ((TABLE_LOW.value - shift * TABLE_STEP_LOW.value) & ptx_emulator.MASK,
                (TABLE_HIGH.value - shift * TABLE_STEP_HIGH.value) & ptx_emulator.MASK)
    b = [0] + [e4m3_byte_as_the_kernel(m, shift) for m in range(1, 8)]
    return (b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24, b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24)


def words():
    """Every byte value in every position of a word, with the others varied."""
    for byte in range(256):
        for position in range(4):
            others = [(byte * 7 + 3) & 0xFF, (byte * 13 + 5) & 0xFF, (byte * 31 + 11) & 0xFF]
            others.insert(position, byte)
            yield sum(b << 8 * i for i, b in enumerate(others))


@pytest.mark.parametrize("shift", range(21))
def test_word_widened_as_e4m3_rounds(shift):
    low, high = table(shift)
    for word in words():
        out = ptx_emulator.run_ptx(WIDEN_WORD_ASM.value, {"$2": word, "$3": low, "$4": high})
        got = [(out["$0"] >> 8 * i) & 0xFF for i in range(4)] + \
              [(out["$1"] >> 8 * i) & 0xFF for i in range(4)]
        for j in range(8):
            nibble = (word >> 4 * j) & 0xF
            value = math.copysign(E2M1_VALUES[nibble & 7], -1 if nibble & 8 else 1)
            assert got[j] == e4m3_byte(value * 2.0 ** (6 - shift)), (hex(word), j, shift)


def test_closed_form_table_is_the_rule_where_it_is_taken():
    for shift in range(FAST_SHIFT.value + 1):
        b = [0] + [e4m3_byte_as_the_kernel(m, shift) for m in range(1, 8)]
        assert table(shift) == (b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24,
                                b[4] | b[5] << 8 | b[6] << 16 | b[7] << 24)
