"""MXFP4 expert weights widened to float8_e4m3fn in 128 x 128 blocks (the
widen_mxfp4 family), for moe_experts' prefill with 4-bit weights: the
fp8 products then run on the widened copy (W4A8: the 4-bit values mapped to
fp8 before the products rather than inside them).

A block's scale is 2^(top - 127 - 6), top its largest e8m0 exponent (NaN's
255 aside); a scale group `shift` binades below it holds e2m1 * 2^(6 - shift)
in e4m3: the largest value, 6 * 2^6 = 384, within e4m3's 448; every value
exact while shift <= 14 (the smallest, 0.5 * 2^-8, on e4m3's subnormal grid
of 2^-9), rounded to nearest even below that.  A NaN scale (255) makes its
group's values e4m3 NaN.

Four values a prmt: the word's eight nibbles less their signs select bytes
of a table of the eight magnitudes' e4m3 bytes at the word's shift (closed
form where no exponent field underflows, shift <= 11), and prmt's sign mode
places the signs (WIDEN_WORD_ASM).  tests/aot/test_widen_fp8.py runs the PTX
through an emulator against torch's rounding."""
import triton
import triton.language as tl

BLOCK = tl.constexpr(128)  # the fp8 format's block (rows and K): BM = BN
# e4m3's NaN in each byte of a word.
NAN_WORD = tl.constexpr(0x7F7F7F7F)

# word $2 (eight e2m1 nibbles, value 2i the low nibble of byte i) -> $0, $1
# (their e4m3 bytes in order); $3, $4: the table, the e4m3 bytes of
# magnitudes 0-3 and 4-7 at the word's shift.  The selectors are the nibbles
# less their sign bit (a prmt selector nibble's bit 3 is its sign mode); the
# signs come from a second prmt in sign mode (a selector with bit 3 set copies
# its byte's top bit into all eight): bit 7 of (word << 4)'s bytes are the low
# nibbles' signs, of the word's the high nibbles'.
WIDEN_WORD_ASM = tl.constexpr("""{
.reg .b32 m, h, t, s0, s1;
and.b32 m, $2, 0x77777777;
shr.b32 h, m, 16;
prmt.b32 $0, $3, $4, m;
prmt.b32 $1, $3, $4, h;
shl.b32 t, $2, 4;
prmt.b32 s0, t, $2, 0xD9C8;
prmt.b32 s1, t, $2, 0xFBEA;
and.b32 s0, s0, 0x80808080;
and.b32 s1, s1, 0x80808080;
or.b32 $0, $0, s0;
or.b32 $1, $1, s1;
}""")
# The table where no exponent field underflows (shift <= FAST_SHIFT): the
# magnitudes 0, 0.5, 1, 1.5 | 2, 3, 4, 6 at exponent fields 12, 13 | 14, 15
# less the shift, a byte each.
FAST_SHIFT = tl.constexpr(11)
TABLE_LOW = tl.constexpr(0x6C686000)
TABLE_HIGH = tl.constexpr(0x7C787470)
TABLE_STEP_LOW = tl.constexpr(0x08080800)
TABLE_STEP_HIGH = tl.constexpr(0x08080808)


@triton.jit
def e4m3_byte(magnitude: tl.constexpr, shift):
    """The e4m3 byte of e2m1 magnitude `magnitude` (1 .. 7) times
    2^(6 - shift), rounded to nearest even (int32)."""
    e: tl.constexpr = magnitude >> 1
    m: tl.constexpr = magnitude & 1 if e > 0 else 0
    # The value is (2 + m) * 2^(field - 8), field its e4m3 exponent field
    # where >= 1 (e2m1's 0.5, e = 0, as 2 * 2^(field - 8)).
    field = (e + 12 if e > 0 else 12) - shift
    normal = (field << 3) | (m << 2)
    # field <= 0: e4m3's subnormal M * 2^-9, M = (2 + m) * 2^(field + 1)
    sub = tl.where(field >= -1, (2 + m) << tl.maximum(field + 1, 0), 0)
    sub = tl.where(field == -2, 1 + m, sub)  # 1 or 1.5: 1.5 rounds to 2
    sub = tl.where(field == -3, m, sub)  # 0.5 rounds to 0, 0.75 to 1; less: 0
    return tl.where(field >= 1, normal, sub)


@triton.jit
def table(shift, FAST: tl.constexpr):
    """(low, high) words: the e4m3 bytes of magnitudes 0-3 and 4-7 at shift."""
    if FAST:
        return TABLE_LOW - shift * TABLE_STEP_LOW, TABLE_HIGH - shift * TABLE_STEP_HIGH
    low = e4m3_byte(1, shift) << 8 | e4m3_byte(2, shift) << 16 | e4m3_byte(3, shift) << 24
    high = (e4m3_byte(4, shift) | e4m3_byte(5, shift) << 8 | e4m3_byte(6, shift) << 16
            | e4m3_byte(7, shift) << 24)
    return low, high


@triton.jit
def widen_words(words, shift, FAST: tl.constexpr):
    """(first, second): the e4m3 words of each packed word's values 0-3 and 4-7."""
    low, high = table(shift, FAST)
    return tl.inline_asm_elementwise(WIDEN_WORD_ASM, "=r,=r,r,r,r", [words, low, high],
                                     dtype=(tl.int32, tl.int32), is_pure=True, pack=1)


@triton.jit
def block_scale(top):
    """2^(top - 127 - 6) as float32, built from its bits (a subnormal where
    top <= 6)."""
    bits = tl.where(top >= 7, (top - 6) << 23, 1 << tl.maximum(top + 16, 0))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def widen_block(v_ptr, s_ptr, q_ptr, bs_ptr, N, K, e, nb, kb, weights, BLOCK: tl.constexpr):
    """Expert e's block (nb, kb): its e4m3 words and its scale."""
    v_group_stride, ldv, s_group_stride, lds = weights
    WORDS: tl.constexpr = BLOCK // 8  # packed words a block's row
    rows = nb * BLOCK + tl.arange(0, BLOCK)
    words = kb * WORDS + tl.arange(0, WORDS)
    # K is whole groups of 32 (host-checked): a group's 4 words are all in K
    # or all past it, so the words load 16 bytes at a time.
    ok = (rows < N)[:, None] & tl.max_constancy(words < K // 8, 4)[None, :]
    # each word's scale (four words a group: the same byte, read again from L1)
    s = tl.load(s_ptr + e * s_group_stride + rows[:, None] * lds + words[None, :] // 4, mask=ok,
                other=0).to(tl.int32)
    nan = s == 255
    top = tl.max(tl.max(tl.where(nan, 0, s), 1), 0)
    shift = tl.where(ok & ~nan, top - s, 0)
    # Rows and experts 16 bytes apart, 16-byte aligned (host-checked).
    at = v_ptr.to(tl.pointer_type(tl.int32)) + e * (v_group_stride // 4)
    row_at = tl.multiple_of(at + rows[:, None] * (ldv // 4), [16, 16])
    b = tl.load(row_at + words[None, :], mask=ok, other=0)
    if tl.max(tl.max(shift, 1), 0) <= FAST_SHIFT:
        first, second = widen_words(b, shift, True)
    else:
        first, second = widen_words(b, shift, False)
    first = tl.where(nan, NAN_WORD, first)
    second = tl.where(nan, NAN_WORD, second)
    out = tl.join(first, second).reshape(BLOCK, 2 * WORDS)
    out_words = kb * 2 * WORDS + tl.arange(0, 2 * WORDS)
    # q is contiguous and 16-byte aligned, its rows K bytes, a multiple of 32.
    q_words = q_ptr.to(tl.pointer_type(tl.int32))
    q_rows = tl.multiple_of(q_words + (e * N + rows[:, None]) * (K // 4), [16, 16])
    tl.store(q_rows + out_words[None, :], out,
             mask=(rows < N)[:, None] & tl.max_constancy(out_words < K // 4, 8)[None, :])
    tl.store(bs_ptr + (e * tl.cdiv(N, BLOCK) + nb) * tl.cdiv(K, BLOCK) + kb, block_scale(top))


@triton.jit
def widen_mxfp4_kernel(v_ptr, s_ptr, q_ptr, bs_ptr, G, N, K, v_group_stride, ldv, s_group_stride,
                       lds, USE_TMA: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                       BK: tl.constexpr, CHUNK: tl.constexpr, PRECISION: tl.constexpr):
    """v [G, N, K / 2] MXFP4 values (bytes, rows ldv apart, experts
    v_group_stride apart; multiples of 16) and their e8m0 scales s [G, N,
    K / 32] (rows lds apart) -> q [G, N, K] float8_e4m3fn (contiguous) and
    bs [G, cdiv(N, 128), cdiv(K, 128)] float32, q * bs the weights.  K is a
    multiple of 32.  Persistent: program p widens blocks p, p + P, ...
    (BM = BN = 128, the block).  USE_TMA, BK, CHUNK and PRECISION are
    unused."""
    tl.static_assert(BM == BLOCK and BN == BLOCK, "a tile is one 128 x 128 block")
    blocks_n = tl.cdiv(N, BLOCK)
    blocks_k = tl.cdiv(K, BLOCK)
    for t in range(tl.program_id(0), G * blocks_n * blocks_k, tl.num_programs(0)):
        e = (t // (blocks_n * blocks_k)).to(tl.int64)
        widen_block(v_ptr, s_ptr, q_ptr, bs_ptr, N, K, e, (t // blocks_k) % blocks_n,
                    t % blocks_k, (v_group_stride, ldv, s_group_stride, lds), BLOCK)
