"""torch.ops.gg_runtime.swiglu_backward_fp8 against the operators it fuses:
swiglu_backward, then quantize_fp8(d(gu), "1x128") and quantize_fp8_columns
("1x128") of d(gu) and of h scaled.  The same bytes and scales (the
unwritten ones poisoned alike), the dot's partial sums adding up to
swiglu_backward's (float32 sums in another order) and to a float64
reference, and d(gu)'s sums over the column layout's row blocks against
float64 sums of swiglu_backward's d(gu) (zeros where no rows are).  Both
gate/up layouts and activations; halves of 128 columns and more, and
(interleaved) halves that are no multiple of 64 or 128; groups of
0, 1, 127 and 200 rows with rows past them (dropped slots); one group and
1000; inputs that start off 16 bytes; each variant forced.  Outputs poisoned."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime.testing import forced, last_variant, randn

from conftest import device_arch

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]

OPS = torch.ops.gg_runtime
LAYOUTS = [("concatenated", 128), ("concatenated", 384), ("interleaved", 80),
           ("interleaved", 208), ("interleaved", 256)]


def inputs(counts, dropped, cols):
    """gu, grad, scale and offs for groups of `counts` rows and `dropped` rows after them."""
    rows = sum(counts) + dropped
    gu = randn(rows, 2 * cols, dtype=torch.bfloat16, scale=2.0)
    grad = randn(rows, cols, dtype=torch.bfloat16)
    scale = torch.rand(rows, device="cuda")
    offs = torch.tensor(counts, device="cuda").cumsum(0).int()
    return gu, grad, scale, offs


def same_bits(got, want):
    """Equal byte for byte (NaN where neither was written)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def misaligned(x):
    """x's values in a packed tensor that starts 2 bytes past a 16-byte boundary."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
    return flat.view(x.shape).copy_(x)


def check(counts, dropped, gate_up, cols, activation, variant="", shift=False, sums=True):
    """The operator (with `variant` forced, if given; shift: its inputs
    misaligned; sums: d(gu)'s sums asked for) against the composed operators."""
    gu, grad, scale, offs = inputs(counts, dropped, cols)
    if shift:
        gu, grad = misaligned(gu), misaligned(grad)
        assert gu.data_ptr() % 16 and grad.data_ptr() % 16
    end = sum(counts)
    with forced(variant):
        got = OPS.swiglu_backward_fp8(gu, grad, scale, offs, gate_up, activation, sums)
        assert last_variant() == variant or not variant
    dgu, hs, dot = OPS.swiglu_backward(gu, grad, scale, gate_up, activation)
    q_rows, scale_rows = OPS.quantize_fp8(dgu, "1x128")
    same_bits(got[0][:end], q_rows[:end])
    same_bits(got[1][:end], scale_rows[:end])
    for (q, q_scale), x in zip((got[2:4], got[4:6]), (dgu, hs)):
        want_q, want_scale = OPS.quantize_fp8_columns(x, offs, "1x128")
        same_bits(q, want_q)
        same_bits(q_scale, want_scale)
    got_dot = got[6].sum(0)
    assert got_dot[end:].eq(0).all()
    torch.testing.assert_close(got_dot[:end], dot[:end], rtol=1e-5, atol=1e-5)
    h = OPS.swiglu(gu, gate_up, activation).double()
    reference = (grad.double() * h).sum(1)[:end]
    assert (got_dot[:end].double() - reference).norm() <= 1e-5 * reference.norm()
    if not sums:
        assert got[7].shape == (0, 2 * cols)
        return
    want_sums = block_sums(dgu.double(), offs)
    assert (got[7].double() - want_sums).norm() <= 1e-6 * want_sums.norm()
    assert got[7][want_sums.eq(0).all(1)].eq(0).all()


def block_sums(x, offs):
    """x's rows summed over each group's 128-row blocks, in the column layout's
    rows (quantize_fp8_columns: group g's block j at start // 128 + g + j)."""
    starts = torch.cat([offs.new_zeros(1), offs[:-1]]).long()
    sums = x.new_zeros(x.shape[0] // 128 + offs.shape[0], x.shape[1])
    for g, (start, end) in enumerate(zip(starts.tolist(), offs.long().tolist())):
        for row in range(start, end, 128):
            sums[start // 128 + g + (row - start) // 128] = x[row:min(row + 128, end)].sum(0)
    return sums


@pytest.mark.parametrize("activation", ["swiglu", "gpt_oss"])
@pytest.mark.parametrize("gate_up, cols", LAYOUTS)
def test_groups_of_0_1_127_200_rows_and_dropped(gate_up, cols, activation):
    check([0, 1, 127, 200, 0], 37, gate_up, cols, activation)


@pytest.mark.parametrize("sums", [False, True])
@pytest.mark.parametrize("gate_up, cols", [("concatenated", 256), ("interleaved", 208)])
def test_one_group(gate_up, cols, sums):
    check([300], 0, gate_up, cols, "swiglu", sums=sums)


@pytest.mark.parametrize("gate_up, cols", [("concatenated", 128), ("interleaved", 80)])
def test_1000_groups(gate_up, cols):
    counts = torch.randint(0, 12, (1000,)).tolist()
    counts[10] = 300  # blocks of 128 rows within a group among many
    check(counts, 5, gate_up, cols, "gpt_oss")


@pytest.mark.parametrize("gate_up, cols", [("concatenated", 128), ("interleaved", 80)])
def test_inputs_not_at_16_bytes(gate_up, cols):
    """The kernel copies rows 16 bytes at a time: the operator copies such inputs first."""
    check([0, 1, 127, 200, 0], 37, gate_up, cols, "swiglu", shift=True)


def test_no_rows():
    gu, grad, scale, offs = inputs([0, 0], 0, 128)
    got = OPS.swiglu_backward_fp8(gu, grad, scale, offs, dgu_sums=True)
    assert got[6].shape == (1, 0) and got[0].shape == (0, 256)
    assert got[7].shape == (2, 256) and got[7].eq(0).all()


@pytest.mark.parametrize("variant", [v for v in _C.variants() if v["arch"] == 90
                                     and v["family"] == "swiglu_backward_fp8"],
                         ids=lambda v: v["key"])
@pytest.mark.parametrize("activation", _C.choices()["Activation"])
def test_every_variant(variant, activation):
    """Each compiled variant forced, with each activation, on tile tails."""
    axes = variant["axes"]
    cols = 256 if axes["gate_up"] == "concatenated" else 208
    check([0, 1, 127, 200, 0], 37, axes["gate_up"], cols, activation, variant["key"],
          sums=axes["sums"] == "dgu")
