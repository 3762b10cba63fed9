"""fp8_grouped_mm (fp8 training) on the GPU: its output and both gradients
against gg_runtime.testing.fp8_training's float64 reference, which quantizes
as the implementation does, for both recipes: T and groups of sizes that
are multiples of no tile (0, 1, 127, 128, 129 rows), one group, 256 and
1,000 groups, rows past the last group, weights as w.transpose(1, 2) and
contiguous (grad_b in their strides), a strided mat_a, groups from 1e-30 to
1e10 in magnitude and all-zero ones (each group judged against its own
magnitude), blocks along T starting at each group's first row, float32
inputs (their gradients the float32 products); then what fp8 costs against
bfloat16 grouped_mm, CUDA graphs and torch.compile.  Outputs poisoned."""
import pytest
import torch

import gg_runtime
from gg_runtime import _C
from gg_runtime.testing import (FP8_TOLERANCE, effective_ends, forced, offsets_from_counts,
                                randn, ref_grouped_mm, ref_grouped_mm_grads, rel_error)
from gg_runtime.testing.fp8_training import (RECIPES, fp8_grouped_mm_grads_ref,
                                             fp8_grouped_mm_ref, fp8_training_inputs,
                                             stepped_within_groups)

from conftest import device_arch

pytestmark = [pytest.mark.skipif(device_arch() != 90, reason="fp8 kernels run on sm90 cubins"),
              pytest.mark.usefixtures("poison")]
TOLERANCE = FP8_TOLERANCE[torch.bfloat16]
# One group's few elements average less: twice the whole result's tolerance
# (as test_gpu_scaled.py's random problems).
GROUP_TOLERANCE = 2 * TOLERANCE
NAMES = ("out", "grad_a", "grad_b")
# (rows per group, N, K, rows past the last group); N and K multiples of 16.
SHAPES = {
    "tile_tails": ([0, 1, 127, 128, 129, 0, 300, 5], 336, 208, 9),  # 1x128 blocks cut by groups
    "one_group": ([1000], 256, 384, 0),
    "g256": ([(37 * g) % 61 for g in range(256)], 128, 256, 3),
    "g1000": ([(13 * g) % 9 for g in range(1000)], 32, 48, 5),
}


def forward_backward(mm, a, b, offs, grad) -> tuple:
    """(out, grad_a, grad_b) of mm(a, b, offs), a and b as leaves needing grad."""
    a, b = a.detach().requires_grad_(), b.detach().requires_grad_()
    out = mm(a, b, offs)
    return (out, *torch.autograd.grad(out, (a, b), grad))


def fp8_mm(recipe):
    return lambda a, b, offs: gg_runtime.fp8_grouped_mm(a, b, offs, recipe=recipe)


def assert_part_close(got, want, where):
    """A group's part within GROUP_TOLERANCE of its own reference; a zero
    reference (an empty or all-zero group, rows past the groups) exactly."""
    if want.eq(0).all():
        assert got.eq(0).all(), f"{where}: not zero"
    else:
        error = rel_error(got, want)
        assert error <= GROUP_TOLERANCE, f"{where}: relative error {error:.2e}"


def assert_matches_reference(got, a, b, offs, grad, recipe):
    """got = (out, grad_a, grad_b) against the reference: of the inputs'
    shapes and dtypes (out a's), grad_b in b's strides, each whole within its
    dtype's tolerance, each group's part within GROUP_TOLERANCE."""
    want = (fp8_grouped_mm_ref(a, b, offs, recipe),
            *fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe))
    for name, x, y, dtype in zip(NAMES, got, want, (a.dtype, a.dtype, b.dtype)):
        assert x.dtype == dtype and x.shape == y.shape, name
        error = rel_error(x, y)
        assert error <= FP8_TOLERANCE[dtype], f"{name}: relative error {error:.2e}"
    assert got[2].stride() == b.stride()
    start = 0
    for g, end in enumerate(effective_ends(offs, a.shape[0])):
        for name, x, y in zip(NAMES[:2], got, want):
            assert_part_close(x[start:end], y[start:end], f"{name}, group {g}")
        assert_part_close(got[2][g], want[2][g], f"grad_b, group {g}")
        start = end
    for name, x in zip(NAMES[:2], got):
        assert x[start:].eq(0).all(), f"{name}: rows past the groups not zero"


def check(a, b, offs, grad, recipe):
    got = forward_backward(fp8_mm(recipe), a, b, offs, grad)
    assert_matches_reference(got, a, b, offs, grad, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("weight_layout", ["nk", "kn"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES)
def test_output_and_gradients(recipe, weight_layout, shape):
    counts, n, k, extra_rows = shape
    check(*fp8_training_inputs(counts, n, k, weight_layout, extra_rows), recipe)


@pytest.mark.parametrize("variant", [v for v in _C.variants() if v["arch"] == 90
                                     and v["family"] == "scaled_ragged_k"],
                         ids=lambda v: v["key"])
def test_every_weight_gradient_kernel(variant):
    """Each of the weight gradient's kernels forced, through its operator,
    in its output dtype (fp8_grouped_mm asks for bfloat16 only): grad^T a of
    the operands quantize_fp8_columns makes, which is the reference's grad_b
    transposed."""
    recipe = variant["axes"]["scaling"]
    granularity = "rowwise" if recipe == "rowwise" else "1x128"
    a, b, offs, grad = fp8_training_inputs(*SHAPES["tile_tails"][:3], extra_rows=9)
    q_grad, scale_grad = torch.ops.gg_runtime.quantize_fp8_columns(grad, offs, granularity)
    q_a, scale_a = torch.ops.gg_runtime.quantize_fp8_columns(a, offs, granularity)
    out_dtype = getattr(torch, variant["out_dtype"])
    with forced(variant["key"]):
        got = torch.ops.gg_runtime.scaled_grouped_mm_k(q_grad, q_a, scale_grad, scale_a, offs,
                                                       a.shape[0], recipe, out_dtype)
    want = fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe)[1].mT
    assert got.dtype == out_dtype and got.shape == want.shape
    assert rel_error(got, want) <= FP8_TOLERANCE[out_dtype]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("counts, extra_rows", [([], 5), ([0, 0], 0), ([0, 0, 0], 7)],
                         ids=["no_groups", "no_rows", "rows_past_empty_groups"])
def test_nothing_to_multiply(recipe, counts, extra_rows):
    """No groups, or groups without rows: zero outputs and gradients of the
    inputs' shapes, nothing read out of bounds (outputs poisoned)."""
    check(*fp8_training_inputs(counts, 32, 48, extra_rows=extra_rows), recipe)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("float32", ["mat_a", "mat_b", "both"])
def test_float32_inputs(recipe, float32):
    """float32 inputs (master weights): quantized from their float32 values,
    each gradient the float32 product (within float32's tolerance, and not
    rounded to bfloat16), the output in mat_a's dtype."""
    a, b, offs, grad = fp8_training_inputs(*SHAPES["tile_tails"][:3], extra_rows=9)
    if float32 != "mat_b":
        a, grad = a.float().mul_(1 + 2 ** -12), grad.float()  # values bfloat16 cannot hold
    if float32 != "mat_a":
        b = b.float().mul_(1 + 2 ** -12)
    got = forward_backward(fp8_mm(recipe), a, b, offs, grad)
    assert_matches_reference(got, a, b, offs, grad, recipe)
    for x in got:
        if x.dtype == torch.float32:
            assert not torch.equal(x, x.to(torch.bfloat16).float())


@pytest.mark.parametrize("recipe", RECIPES)
def test_strided_mat_a(recipe):
    """mat_a a column slice of a wider tensor (row stride K + 40)."""
    a, b, offs, grad = fp8_training_inputs([40, 0, 150], 96, 160, extra_rows=4)
    wide = torch.zeros(a.shape[0], a.shape[1] + 40, dtype=a.dtype, device="cuda")
    wide[:, 8:8 + a.shape[1]] = a
    check(wide[:, 8:8 + a.shape[1]], b, offs, grad, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_column_major_mat_a(recipe):
    """mat_a stored transposed (a view of [K, T]): the reference's output
    and gradients, grad_a row-major (the docstring's promise)."""
    a, b, offs, grad = fp8_training_inputs([40, 0, 150], 96, 160, extra_rows=4)
    got = forward_backward(fp8_mm(recipe), a.t().contiguous().t(), b, offs, grad)
    assert_matches_reference(got, a, b, offs, grad, recipe)
    assert got[1].is_contiguous()


# Per group, the magnitudes of a's rows, w and grad's rows: the output (a w),
# grad_a (grad w) and grad_b (a grad) of the first five groups from 1e-20 to
# 1e20, every product of two scales a normal float32; then 1e-30, below
# quantize_fp8's floor on amax (1e-12), which quantizes to zero; then a zero
# operand in each.
MAGNITUDES = [(1e-10, 1, 1), (1e10, 1e-10, 1e-10), (1, 1e-10, 1), (1e-10, 1e10, 1e10),
              (1, 1, 1e-10), (1e-30, 1, 1), (1, 1e-30, 1), (0, 1, 1), (1, 0, 1), (1, 1, 0)]
MAGNITUDE_COUNTS = [40, 129, 3, 200, 1, 17, 130, 64, 5, 20]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("weight_layout", ["nk", "kn"])
def test_groups_of_far_apart_magnitudes(recipe, weight_layout):
    a, b, offs, grad = fp8_training_inputs(MAGNITUDE_COUNTS, 144, 272, weight_layout,
                                           extra_rows=6)
    magnitudes = torch.tensor(MAGNITUDES, dtype=torch.float64, device="cuda")
    rows = torch.arange(len(MAGNITUDE_COUNTS), device="cuda").repeat_interleave(
        torch.tensor(MAGNITUDE_COUNTS, device="cuda"))
    a[:rows.numel()] = (a[:rows.numel()] * magnitudes[rows, 0, None]).to(a.dtype)
    b.copy_(b * magnitudes[:, 1, None, None])
    grad[:rows.numel()] = (grad[:rows.numel()] * magnitudes[rows, 2, None]).to(grad.dtype)
    check(a, b, offs, grad, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_blocks_along_t_start_at_each_group(recipe):
    """stepped_within_groups' data, groups starting at no multiple of 128:
    blocks of a's columns aligned to T's multiples of 128 instead of each
    group's first row would lose half of grad_b (blockwise)."""
    a, b, offs, grad = fp8_training_inputs([5, 200, 300, 129, 60], 144, 272, extra_rows=3)
    a, grad = stepped_within_groups(a, grad, offs)
    check(a, b, offs, grad, recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_gradient_of_one_input(recipe):
    """Only b needs a gradient (the first layer's input), then only a."""
    a, b, offs, grad = fp8_training_inputs([70, 0, 130], 144, 272, extra_rows=5)
    grad_a, grad_b = fp8_grouped_mm_grads_ref(a, b, offs, grad, recipe)
    w = b.detach().requires_grad_()
    (got,) = torch.autograd.grad(gg_runtime.fp8_grouped_mm(a, w, offs, recipe=recipe), w, grad)
    assert rel_error(got, grad_b) <= TOLERANCE and got.stride() == b.stride()
    x = a.detach().requires_grad_()
    (got,) = torch.autograd.grad(gg_runtime.fp8_grouped_mm(x, b, offs, recipe=recipe), x, grad)
    assert rel_error(got, grad_a) <= TOLERANCE


def test_default_recipe_is_blockwise():
    a, b, offs, _ = fp8_training_inputs([70, 0, 130], 144, 272)
    assert torch.equal(gg_runtime.fp8_grouped_mm(a, b, offs),
                       gg_runtime.fp8_grouped_mm(a, b, offs, recipe="blockwise"))


@pytest.mark.parametrize("recipe", RECIPES)
def test_end_to_end_error(recipe, record_property):
    """What fp8 costs: the output and gradients of fp8_grouped_mm and of
    bfloat16 grouped_mm against float32 products of the same bfloat16
    inputs, and against each other; printed (pytest -s) and recorded
    (--junitxml)."""
    inputs = fp8_training_inputs([300, 0, 700, 24, 1000], 1024, 512)
    fp8 = forward_backward(fp8_mm(recipe), *inputs)
    bf16 = forward_backward(gg_runtime.grouped_mm, *inputs)
    exact = (ref_grouped_mm(*inputs[:3]), *ref_grouped_mm_grads(*inputs))
    errors = {}
    for name, x, y, z in zip(NAMES, fp8, bf16, exact):
        errors[name] = {"fp8_vs_exact": rel_error(x, z), "bf16_vs_exact": rel_error(y, z),
                        "fp8_vs_bf16": rel_error(x, y.float())}
        for kind, error in errors[name].items():
            record_property(f"{name}_{kind}", error)
    (tokens, k), n = inputs[0].shape, inputs[1].shape[2]
    print(f"\nfp8_grouped_mm, {recipe}, T {tokens}, N {n}, K {k}: " + "; ".join(
        f"{name} " + ", ".join(f"{kind} {e:.2e}" for kind, e in kinds.items())
        for name, kinds in errors.items()))
    for name, kinds in errors.items():
        assert kinds["bf16_vs_exact"] < kinds["fp8_vs_exact"], (name, kinds)
        assert kinds["fp8_vs_bf16"] < 0.1, (name, kinds)


@pytest.mark.parametrize("recipe", RECIPES)
def test_cuda_graph_replays_new_offsets(recipe):
    """Forward and backward captured in one graph (nothing may wait for the
    host), replayed with new offsets, rows and output gradient copied into
    the captured inputs."""
    a, b, offs, grad = fp8_training_inputs([50, 0, 130, 70], 144, 272, extra_rows=20)
    a.requires_grad_()
    b.requires_grad_()

    def step():
        out = gg_runtime.fp8_grouped_mm(a, b, offs, recipe=recipe)
        return (out, *torch.autograd.grad(out, (a, b), grad))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # loads the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    for counts in ([100, 0, 80, 90], [0, 0, 0, 0], [3, 129, 0, 1]):
        offs.copy_(offsets_from_counts(counts))
        with torch.no_grad():
            a.copy_(randn(*a.shape, dtype=a.dtype))
        grad.copy_(randn(*grad.shape, dtype=grad.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(got, a, b, offs, grad, recipe)


class TwoLayers(torch.nn.Module):
    """An MoE expert block's two grouped products, weights nn.Linear-style."""

    def __init__(self, experts, dim, hidden, recipe):
        super().__init__()
        self.recipe = recipe
        self.up = torch.nn.Parameter(randn(experts, hidden, dim, dtype=torch.bfloat16,
                                           scale=dim ** -0.5))
        self.down = torch.nn.Parameter(randn(experts, dim, hidden, dtype=torch.bfloat16,
                                             scale=hidden ** -0.5))

    def forward(self, x, offs):
        h = gg_runtime.fp8_grouped_mm(x, self.up.transpose(1, 2), offs, recipe=self.recipe)
        return gg_runtime.fp8_grouped_mm(torch.nn.functional.silu(h), self.down.transpose(1, 2),
                                         offs, recipe=self.recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_torch_compile(recipe):
    """Compiled (graph breaks allowed) as eager: the output and every gradient."""
    torch._dynamo.reset()
    model = TwoLayers(4, 64, 128, recipe)
    x = randn(300, 64, dtype=torch.bfloat16).requires_grad_()
    offs = offsets_from_counts([100, 50, 0, 140])
    grad = randn(300, 64, dtype=torch.bfloat16)
    results = []
    for layer in (torch.compile(model, fullgraph=False, backend="aot_eager"), model):
        out = layer(x, offs)
        results.append((out, *torch.autograd.grad(out, (x, model.up, model.down), grad)))
    for name, got, want in zip(("out", "x", "up", "down"), *results):
        assert got.shape == want.shape, name
        assert rel_error(got, want.double()) < 1e-2, name
