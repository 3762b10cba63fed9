"""float32 functions as single PTX approximations, for Gluon kernels.

Where a kernel's operands stay in float32's normal range, `a / b` and
`gl.exp` cost several instructions around their one MUFU operation: the
range fixups of div.full.f32 (operands near 2^126 or subnormal) and of a
subnormal-preserving ex2.  These are the MUFU operation alone (.ftz: a
subnormal input or result is zero).  For normal operands whose results stay
normal, `x * reciprocal(y)` is bit-identical to `x / y` (div.full.f32 is x
times the same rcp.approx, scaled only at the range's ends)."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

LOG2_E = gl.constexpr(1.4426950408889634)


@gluon.jit
def approximate(x, op: gl.constexpr):
    """PTX `op`.approx.ftz.f32 of each element of x (float32)."""
    return gl.inline_asm_elementwise(op + ".approx.ftz.f32 $0, $1;", "=f,f", [x],
                                     dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def reciprocal(x):
    """1 / x, within an ulp; 0 where |x| >= 2^126."""
    return approximate(x, "rcp")


@gluon.jit
def sigmoid(x):
    """1 / (1 + e^-x): 1 where x > 87 (e^-x below float32's normal range),
    0 where x < -87."""
    return reciprocal(1.0 + approximate(x * -LOG2_E, "ex2"))
