"""A small emulator of the PTX instructions gg_runtime's widening assembly
uses (prmt, in its default and sign modes, lop3, shifts, and, or, mov), over
32-bit registers, for the tests that run that assembly on any machine;
instructions of other semantics (fma.rn.bf16x2) come from the caller."""
MASK = 0xFFFFFFFF


def prmt(a: int, b: int, selector: int) -> int:
    """prmt.b32's default mode: selector nibble i picks byte (nibble & 7) of
    (a, b) for output byte i; with the nibble's bit 3 set, that byte's top
    bit copied into all eight (sign mode)."""
    source = [(a >> 8 * i) & 0xFF for i in range(4)] + [(b >> 8 * i) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        nibble = (selector >> 4 * i) & 0xF
        byte = source[nibble & 7]
        if nibble & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << 8 * i
    return out


def lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        index = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | (c >> bit) & 1
        out |= ((lut >> index) & 1) << bit
    return out


OPERATIONS = {
    "mov.b32": lambda a: a,
    "prmt.b32": prmt,
    "lop3.b32": lop3,
    "shr.b32": lambda a, b: a >> b,
    "shl.b32": lambda a, b: (a << b) & MASK,
    "and.b32": lambda a, b: a & b,
    "or.b32": lambda a, b: a | b,
}


def run_ptx(asm: str, inputs: dict, operations: dict | None = None) -> dict:
    """Runs asm's instructions over 32-bit registers; inputs: {"$4": word,
    ...}; operations: more instructions, by opcode, beside OPERATIONS."""
    regs = dict(inputs)
    known = {**OPERATIONS, **(operations or {})}

    def value(token: str) -> int:
        return int(token, 16) if token.startswith("0x") else int(token) \
            if token.isdigit() else regs[token]
    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dest, *args = [t.strip() for t in rest.split(",")]
        if op not in known:
            raise AssertionError(f"an instruction the emulator lacks: {op}")
        regs[dest] = known[op](*[value(t) for t in args])
    return regs
