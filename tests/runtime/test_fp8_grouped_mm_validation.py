"""fp8_grouped_mm refuses bad input with an error naming the argument,
before anything launches.  Runs on CPU: fake CUDA tensors carry shapes,
dtypes and strides without a GPU (a launch would find no data)."""
import pytest
import torch

import gg_runtime

from conftest import cuda

T, K, N, G = 10, 64, 32, 3
RECIPES = ("rowwise", "blockwise")


def offsets(groups=G, dtype=torch.int32):
    return torch.empty(groups, dtype=dtype, device="cuda")


def call(recipe="blockwise", **changes):
    """fp8_grouped_mm on valid inputs (b a transposed view of a [G, N, K]
    weight), `changes` replacing some; made under the fake fixture."""
    given = {"mat_a": cuda(T, K), "mat_b": cuda(G, N, K).transpose(1, 2), "offs": offsets()}
    given.update(changes)
    return gg_runtime.fp8_grouped_mm(given["mat_a"], given["mat_b"], given["offs"],
                                     recipe=recipe)


@pytest.mark.parametrize("recipe", RECIPES)
def test_valid_inputs_pass(fake, recipe):
    padded_rows = torch.empty_strided((T, K), (K + 16, 1), dtype=torch.bfloat16, device="cuda")
    for changes in ({}, {"mat_b": cuda(G, K, N)}, {"mat_a": padded_rows},
                    {"offs": offsets(1), "mat_b": cuda(1, K, N)},
                    {"mat_b": cuda(G, K, N, dtype=torch.float32)}):
        out = call(recipe, **changes)
        assert out.shape == (T, N) and out.dtype == torch.bfloat16
    out = call(recipe, mat_a=cuda(T, K, dtype=torch.float32))
    assert out.shape == (T, N) and out.dtype == torch.float32  # mat_a's dtype


# Each case replaces some of the valid inputs; made in the test, under fake mode.
CASES = {
    "mat_a float16": (lambda: {"mat_a": cuda(T, K, dtype=torch.float16)}, TypeError, "mat_a"),
    "mat_a float64": (lambda: {"mat_a": cuda(T, K, dtype=torch.float64)}, TypeError, "mat_a"),
    "mat_a fp8": (lambda: {"mat_a": cuda(T, K, dtype=torch.float8_e4m3fn)}, TypeError, "mat_a"),
    "mat_b float16": (lambda: {"mat_b": cuda(G, K, N, dtype=torch.float16)}, TypeError,
                      "mat_b"),
    "mat_b float64": (lambda: {"mat_b": cuda(G, K, N, dtype=torch.float64)}, TypeError,
                      "mat_b"),
    "K not 16n": (lambda: {"mat_a": cuda(T, 40), "mat_b": cuda(G, N, 40).transpose(1, 2)},
                  ValueError, "16"),
    "N not 16n": (lambda: {"mat_b": cuda(G, 24, K).transpose(1, 2)}, ValueError, "16"),
    "K differs": (lambda: {"mat_b": cuda(G, N, K + 16).transpose(1, 2)}, ValueError,
                  "K|mat_b"),
    "mat_a 3-D": (lambda: {"mat_a": cuda(G, T, K)}, ValueError, "mat_a"),
    "mat_b 2-D": (lambda: {"mat_b": cuda(K, N)}, ValueError, "mat_b"),
    "offs int64": (lambda: {"offs": offsets(dtype=torch.int64)}, TypeError, "offs"),
    "offs float": (lambda: {"offs": offsets(dtype=torch.float32)}, TypeError, "offs"),
    "offs short": (lambda: {"offs": offsets(G - 1)}, ValueError, "offs"),
    "offs 2-D": (lambda: {"offs": torch.empty(1, G, dtype=torch.int32, device="cuda")},
                 ValueError, "offs"),
    "offs None": (lambda: {"offs": None}, (TypeError, ValueError), "offs"),
    # Fake tensors: torch's fake mode compares devices before any kernel runs.
    "mat_a on cpu": (lambda: {"mat_a": torch.empty(T, K, dtype=torch.bfloat16)},
                     (ValueError, RuntimeError), "mat_a|same device|different devices"),
    "mat_b on cpu": (lambda: {"mat_b": torch.empty(G, K, N, dtype=torch.bfloat16)},
                     (ValueError, RuntimeError), "mat_b|same device|different devices"),
    "offs on cpu": (lambda: {"offs": torch.empty(G, dtype=torch.int32)},
                    (ValueError, RuntimeError), "offs|same device|different devices"),
}


@pytest.mark.parametrize("name", CASES)
def test_refused(fake, name):
    changes, error, message = CASES[name]
    with pytest.raises(error, match=message):
        call(**changes())


@pytest.mark.parametrize("recipe", ["tensorwise", "1x128", "Rowwise", ""])
def test_unknown_recipe_refused(fake, recipe):
    with pytest.raises(ValueError, match="recipe"):
        call(recipe)


@pytest.mark.parametrize("requires_grad", [False, True])
def test_cpu_tensors_refused(requires_grad):
    """No fake mode: real CPU tensors, as a model on the CPU passes them."""
    a = torch.zeros(T, K, dtype=torch.bfloat16, requires_grad=requires_grad)
    w = torch.zeros(G, N, K, dtype=torch.bfloat16, requires_grad=requires_grad)
    with pytest.raises(ValueError, match="mat_a.*CUDA"):
        gg_runtime.fp8_grouped_mm(a, w.transpose(1, 2), torch.zeros(G, dtype=torch.int32))
