"""gg_runtime.testing.fp8_training's float64 reference of fp8_grouped_mm,
checked on CPU so that the GPU tests can trust it: on data that fp8 holds
exactly it is the plain grouped product and its gradients (grouped_mm's
float32 references, exact on that data), and on normal data it rounds as
each recipe's quantization should (per group along T, blocks starting at
each group's first row)."""
import pytest
import torch

from gg_runtime.testing import effective_ends, ref_grouped_mm, ref_grouped_mm_grads, rel_error
from gg_runtime.testing.fp8_training import (RECIPES, fp8_grouped_mm_grads_ref,
                                             fp8_grouped_mm_ref, fp8_training_inputs,
                                             stepped_within_groups)

# Offsets read as grouped_mm reads them: groups of 0, 1, 127, 128 rows, a
# decreasing offset (an empty group), 129 rows twice, 16 rows past the last
# group; the second set's last offset lies past T (clamped).
OFFSETS = {"tails": ([0, 1, 128, 256, 250, 385, 514], 530), "past_t": ([100, 700], 530)}
N, K = 144, 208  # multiples of 16, not of 128


def exact(*shape, unit: float) -> torch.Tensor:
    """bfloat16 values that fp8 holds at every granularity: 0 or +-7 * 2**-j
    (j in 0..3) times `unit`, a power of two.  Every block's amax is
    7 * 2**-i * unit, its scale unit * 2**-i / 64, and each element 0 or
    448 * 2**(i - j) times that (i <= j): no rounding anywhere."""
    sevens = 7.0 * 2.0 ** -torch.randint(0, 4, shape) * (2 * torch.randint(0, 2, shape) - 1)
    return (sevens * (torch.rand(shape) < 0.8) * unit).to(torch.bfloat16)


def exact_inputs(ends, total, weight_layout):
    """(a, b, offs, grad) of exact data, each group's rows of a and grad and
    each group's weight scaled by a power of two of its own (2**-20 to 2**20)."""
    offs = torch.tensor(ends, dtype=torch.int32)
    a, grad = exact(total, K, unit=1.0), exact(total, N, unit=0.25)
    w = exact(len(ends), N, K, unit=2.0 ** -6)
    start = 0
    for g, end in enumerate(effective_ends(offs, total)):
        for x in (a[start:end], grad[start:end], w[g]):
            x *= 2.0 ** torch.randint(-20, 21, ()).item()
        start = end
    return a, w.transpose(1, 2) if weight_layout == "nk" else w.mT.contiguous(), offs, grad


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("weight_layout", ["nk", "kn"])
@pytest.mark.parametrize("offsets", OFFSETS.values(), ids=OFFSETS)
def test_exact_data_gives_the_plain_products(recipe, weight_layout, offsets):
    a, b, offs, grad = exact_inputs(*offsets, weight_layout)
    assert torch.equal(fp8_grouped_mm_ref(a, b, offs, recipe), ref_grouped_mm(a, b, offs).double())
    grads = fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe)
    for name, got, want in zip(("grad_a", "grad_b"), grads, ref_grouped_mm_grads(a, b, offs, grad)):
        assert got.dtype == torch.float64 and got.shape == want.shape, name
        assert torch.equal(got, want.double()), name


def plain_and_fp8(a, b, offs, grad, recipe) -> list:
    """[(name, fp8 reference, plain product)] for the output and both gradients."""
    fp8 = (fp8_grouped_mm_ref(a, b, offs, recipe), *fp8_grouped_mm_grads_ref(a, b, offs, grad,
                                                                            recipe))
    plain = (ref_grouped_mm(a, b, offs), *ref_grouped_mm_grads(a, b, offs, grad))
    return list(zip(("out", "grad_a", "grad_b"), fp8, plain))


@pytest.mark.parametrize("recipe", RECIPES)
def test_normal_data_is_quantized(recipe):
    """fp8's error, neither none (nothing quantized) nor more (a coarser
    granularity, a group quantized as zero)."""
    inputs = fp8_training_inputs([70, 0, 300, 129], N, K, extra_rows=7, device="cpu")
    for name, fp8, plain in plain_and_fp8(*inputs, recipe):
        assert 5e-3 < rel_error(fp8, plain) < 6e-2, name


def test_recipes_differ():
    inputs = fp8_training_inputs([70, 300], N, K, device="cpu")
    for (name, rowwise, _), (_, blockwise, _) in zip(*(plain_and_fp8(*inputs, r)
                                                        for r in RECIPES)):
        assert rel_error(rowwise, blockwise) > 1e-3, name


def grad_b_errors(a, b, offs, grad, recipe) -> list:
    """Each group's grad_b error, the reference's against the plain product's."""
    got = fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe)[1]
    return [rel_error(x, y) for x, y in zip(got, ref_grouped_mm_grads(a, b, offs, grad)[1])]


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_group_is_quantized_alone_along_t(recipe):
    """A group of a 2**-30 times smaller than the other: its columns get
    scales of their own (one per column over all of T would make it zero)."""
    a, b, offs, grad = fp8_training_inputs([150, 90], N, K, device="cpu")
    a[150:] *= 2.0 ** -30
    assert max(grad_b_errors(a, b, offs, grad, recipe)) < 6e-2


def test_blocks_along_t_start_at_each_group():
    """stepped_within_groups' data on groups that start at no multiple of
    128: blockwise grad_b keeps fp8's error (the small rows have blocks of
    their own), rowwise loses a's small rows (one scale per column and
    group): the data tells the two apart."""
    a, b, offs, grad = fp8_training_inputs([5, 200, 300, 129], N, K, device="cpu")
    a, grad = stepped_within_groups(a, grad, offs)
    errors = {recipe: max(grad_b_errors(a, b, offs, grad, recipe)) for recipe in RECIPES}
    assert errors["blockwise"] < 6e-2 and errors["rowwise"] > 0.3, errors


def test_unknown_recipe_is_refused():
    a, b, offs, grad = fp8_training_inputs([3], 16, 16, device="cpu")
    with pytest.raises(ValueError, match="recipe"):
        fp8_grouped_mm_ref(a, b, offs, "1x128")
