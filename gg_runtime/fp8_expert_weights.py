"""moe_experts' 16-bit weights quantized once for fp8 training
(`quantize_expert_weights`, an `Fp8ExpertWeights`), for the calls that follow
while the weights do not change: what moe_experts(fp8=...) and
MoEExperts(fp8=...) take instead of quantizing on every call."""
from __future__ import annotations

import torch

from . import fp8_training
from .formats import RECIPES
from ._native import check_types


def _fingerprint(w):
    """What changes when a weight does: its storage (Fp8ExpertWeights keeps
    it alive, so that no other takes its place), offset, shape, strides and
    version (bumped by every in-place write, an optimizer's step included)."""
    return (w.untyped_storage()._cdata, w.storage_offset(), tuple(w.shape), w.stride(),
            w._version)


class Fp8ExpertWeights:
    """moe_experts' w13 and w2 quantized for fp8 training, once, for the
    calls that follow while the weights do not change: what
    `quantize_expert_weights` returns, given to `moe_experts` as `fp8`.

    Holds each weight in fp8 in both orientations a training step reads (the
    forward's, and the transposed one of the input gradients), with their
    scales: as many bytes as the 16-bit weights.  Attributes: `recipe`;
    `forward` and `backward`, (w13, w2) each a `Quantized` in the recipe's
    weight layout, in the forward's and the transposed orientation
    (fp8_training.quantize_weight's).  `forward` is what `moe_experts`
    serves as fp8 weights: `moe_experts(x, ids, weights, *w.forward)`.
    """

    __slots__ = ("recipe", "forward", "backward", "_sources", "_storages")

    def __init__(self, w13, w2, recipe):
        self.recipe = recipe
        self._sources = (_fingerprint(w13), _fingerprint(w2))
        self._storages = (w13.untyped_storage(), w2.untyped_storage())
        with torch.no_grad():
            (forward13, backward13), (forward2, backward2) = (
                fp8_training.quantize_weight_both(w, recipe) for w in (w13, w2))
        self.forward = (forward13, forward2)
        self.backward = (backward13, backward2)

    def matches(self, w13, w2) -> bool:
        """Whether w13 and w2 are the weights these were made from, unchanged since."""
        return (_fingerprint(w13), _fingerprint(w2)) == self._sources

    def check(self, w13, w2):
        """A ValueError unless they match (matches)."""
        if not self.matches(w13, w2):
            raise ValueError("fp8 is an Fp8ExpertWeights of other weights, or of w13 and w2 "
                             "before they changed (an optimizer step): quantize them again "
                             "(quantize_expert_weights) after each change")


def quantize_expert_weights(w13: torch.Tensor, w2: torch.Tensor, *,
                            fp8: str = "blockwise") -> Fp8ExpertWeights:
    """moe_experts' 16-bit weights quantized once for fp8 training (`moe_experts(..., fp8=...)`).

    `moe_experts(x, ids, weights, w13, w2, fp8="blockwise")` quantizes w13 and
    w2 on every call, in the forward's orientation and again, in the
    backward, in the transposed one.  Where the same weights serve several
    calls (gradient accumulation's micro-batches, activation checkpointing's
    recomputed forward) they can be quantized once, after each optimizer
    step, and given to each call instead of the recipe:

        fp8_weights = gg_runtime.quantize_expert_weights(w13, w2, fp8="blockwise")
        for x, ids, weights in micro_batches:
            out = gg_runtime.moe_experts(x, ids, weights, w13, w2, fp8=fp8_weights)
            ...backward...
        optimizer.step()  # then quantize again before the next call

    The calls then compute what `fp8="blockwise"` (the same recipe) does,
    bit for bit, and the gradients still go to w13 and w2.  A call whose
    w13 or w2 is not the tensor these were made from (its memory, shape or
    strides), or has been written since (its version counter), raises a
    ValueError rather than run on stale copies.  Writes through `w.data`
    bypass the version counter and are not seen: quantize again after them
    (or write under `torch.no_grad()`, which counts).  The result
    holds fp8 copies of both weights in both orientations, as many bytes as
    the 16-bit weights, until it is dropped.

    Args:
        w13: `[E, 2I, H]`, float16, bfloat16 or float32 on a CUDA device,
            any strides (as `moe_experts` takes it).
        w2: `[E, H, I]` of w13's dtype and device.
        fp8: the recipe, `"blockwise"` or `"rowwise"` (`moe_experts`' `fp8`).

    Returns:
        An `Fp8ExpertWeights`, for `moe_experts(..., fp8=...)`.

    Raises:
        TypeError: w13 or w2 not a tensor, or not float16, bfloat16 or float32
            of one dtype.
        ValueError: an unknown recipe; weights not 3-D, or on different devices;
            H or I not multiples of 16.
        UnsupportedDeviceError: a GPU of another compute capability than 9.0.
    """
    if fp8 not in RECIPES:
        raise ValueError(f"fp8 must be one of {RECIPES}, got {fp8!r}")
    check_types(tensors=(("w13", w13), ("w2", w2)))
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype not in (torch.float16, torch.bfloat16, torch.float32) or w.dtype != w13.dtype:
            raise TypeError(f"w13 and w2 must be float16, bfloat16 or float32 of one dtype, got "
                            f"{w13.dtype} and {w2.dtype}")
        if w.dim() != 3 or w.device != w13.device:
            raise ValueError(f"{name} must be 3-D on w13's device {w13.device}, got shape "
                             f"{tuple(w.shape)} on {w.device}")
    experts, two_inter, hidden = w13.shape
    if tuple(w2.shape) != (experts, hidden, two_inter // 2) or two_inter % 2:
        raise ValueError(f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} must be [E, 2I, H] "
                         "and [E, H, I]")
    if hidden % 16 or two_inter // 2 % 16:
        raise ValueError(f"fp8 needs H and I to be multiples of 16, got H={hidden}, "
                         f"I={two_inter // 2}")
    return Fp8ExpertWeights(w13, w2, fp8)
