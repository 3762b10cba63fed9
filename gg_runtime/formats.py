"""How gg_runtime scales fp8 (float8_e4m3fn) values: the scale layouts
(quantize_fp8's granularities), and by name the layouts of a product's two
operands (scaled_grouped_mm's granularity, fp8_grouped_mm's recipe,
moe_experts' `fp8`, the fp8 expert weights served); and which format
served expert weights are in (fp8's two, MXFP4, INT4).  Every map from such a
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


# 4-bit expert weights served, two values a byte along K (the first in the
# low nibble): OCP MXFP4, e2m1 values (torch's float4_e2m1fn_x2, or bytes)
# with an e8m0 scale a group of 32 values (float8_e8m0fnu, or bytes); or
# symmetric INT4, integers -8 .. 7 stored offset by 8 (bytes) with a
# bfloat16 scale a group of 32 or 128 values.
MXFP4 = "mxfp4"
INT4 = "int4"
W4_FORMATS = (MXFP4, INT4)
MXFP4_GROUP = 32
INT4_GROUPS = (32, 128)
W4_VALUE_DTYPES = (torch.float4_e2m1fn_x2, torch.uint8)
# torch's dtypes of MXFP4's values and scales, each stored in a byte.
MXFP4_BYTE_DTYPES = (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)


def served_weight_format(w: torch.Tensor, scale: torch.Tensor) -> str:
    """The format of served expert weights w `[E, N, K]` scaled by `scale`:
    where w holds packed 4-bit values (W4_VALUE_DTYPES), INT4 for bytes with
    floating-point scales, else MXFP4; else fp8's WEIGHT_FORMATS key,
    `"channelwise"` where it has a scale per output channel (`[E, N]` or
    `[E, N, 1]`: as many rows as w, which 128 x 128 blocks never have), else
    `"blockwise"` (`[E, ceil(N/128), ceil(K/128)]`).  The operators check
    the scales' shape and dtype in full."""
    if w.dtype in W4_VALUE_DTYPES:
        integers = w.dtype == torch.uint8 and scale.is_floating_point() and \
            scale.dtype != torch.float8_e8m0fnu
        return INT4 if integers else MXFP4
    channels = scale.dim() >= 2 and w.dim() >= 2 and scale.shape[1] == w.shape[1]
    return "channelwise" if channels else "blockwise"


# The weight formats of torch.ops.gg_runtime.moe_experts (its `weight_format`,
# which csrc/ops/moe_experts.cc parses): 16-bit weights in the tokens' dtype,
# then fp8's and the 4-bit ones.
UNQUANTIZED = "unquantized"
OPERATOR_WEIGHT_FORMATS = (UNQUANTIZED, *WEIGHT_FORMATS, *W4_FORMATS)
