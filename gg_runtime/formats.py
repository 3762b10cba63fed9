"""How gg_runtime scales fp8 (float8_e4m3fn) values: the scale layouts
(quantize_fp8's granularities), and by name the layouts of a product's two
operands (scaled_grouped_mm's granularity, fp8_grouped_mm's recipe,
moe_experts' `fp8`, the fp8 expert weights served).  Every map from such a
name to its layouts reads this table."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# quantize_fp8's granularities: a scale per row, per 128 columns of a row, per
# 128 x 128 block.
ROWWISE = "rowwise"
ROW_BLOCKS = "1x128"
SQUARE_BLOCKS = "128x128"
GRANULARITIES = (ROWWISE, ROW_BLOCKS, SQUARE_BLOCKS)


@dataclass(frozen=True)
class Scaling:
    """The granularities of a product's operands: `rows`, of the operand
    whose rows the product reduces (activations and gradients; the weight
    gradient quantizes both its operands so, along their columns within each
    group), and `weights`."""
    rows: str
    weights: str


SCALINGS = {"rowwise": Scaling(ROWWISE, ROWWISE),
            "blockwise": Scaling(ROW_BLOCKS, SQUARE_BLOCKS),
            "blockwise_rowwise": Scaling(ROW_BLOCKS, ROWWISE)}
# fp8 training's recipes (fp8_grouped_mm's `recipe`, moe_experts' `fp8`), each
# a scaling of SCALINGS; the recipe's name is also its weight gradient's.
RECIPES = ("rowwise", "blockwise")
# fp8 expert weights served (moe_experts given fp8 weights), by their scales'
# layout: per 128 x 128 block, or per output channel (a row of the weights).
WEIGHT_FORMATS = {"blockwise": SCALINGS["blockwise"], "channelwise": SCALINGS["rowwise"]}
# The weight format each training recipe's forward quantizes the weights to.
RECIPE_WEIGHT_FORMATS = {recipe: next(name for name, scaling in WEIGHT_FORMATS.items()
                                      if scaling == SCALINGS[recipe]) for recipe in RECIPES}


def served_weight_format(w: torch.Tensor, scale: torch.Tensor) -> str:
    """The WEIGHT_FORMATS key of served fp8 weights w `[E, N, K]` scaled by
    `scale`: `"channelwise"` where it has a scale per output channel (`[E, N]`
    or `[E, N, 1]`: as many rows as w, which 128 x 128 blocks never have),
    else `"blockwise"` (`[E, ceil(N/128), ceil(K/128)]`).  The operators
    check the scales' shape in full."""
    channels = scale.dim() >= 2 and w.dim() >= 2 and scale.shape[1] == w.shape[1]
    return "channelwise" if channels else "blockwise"
