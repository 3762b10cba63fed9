"""How gg_runtime stores values quantized: the formats (the scale layouts of
fp8, float8_e4m3fn, values: quantize_fp8's granularities; MXFP4; INT4), a
tensor held in one (`Quantized`: what quantize_fp8 and the 4-bit weight
converters return and moe_experts takes), and by name the layouts of a
product's two operands (scaled_grouped_mm's granularity, fp8_grouped_mm's
recipe, the tokens fp8 expert weights ask for).  Every map from such a name
to its layouts reads this table."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

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
# The layouts fp8 expert weights are served in (moe_experts given fp8
# weights), by the weights' layout: per 128 x 128 block, or per output
# channel (a row of each expert's weight); each with the tokens' layout it asks.
FP8_WEIGHT_SCALINGS = {s.weights: s for s in (SCALINGS["blockwise"], SCALINGS["rowwise"])}


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
# torch's dtypes of MXFP4's values and scales, each stored in a byte.
MXFP4_BYTE_DTYPES = (torch.float4_e2m1fn_x2, torch.float8_e8m0fnu)


# moe_experts' weight formats: fp8's layouts, then the 4-bit ones; and
# torch.ops.gg_runtime.moe_experts' `weight_format` (csrc/ops/moe_experts.cc
# parses it), which adds 16-bit weights in the tokens' dtype.
WEIGHT_FORMATS = (*FP8_WEIGHT_SCALINGS, *W4_FORMATS)
UNQUANTIZED = "unquantized"
OPERATOR_WEIGHT_FORMATS = (UNQUANTIZED, *WEIGHT_FORMATS)


class Quantized(NamedTuple):
    """A tensor stored quantized: its `values`, their `scales` and the
    `format` that says how the two combine and what each scale covers.

    - fp8 (`values` float8_e4m3fn, `scales` float32, `value ~ q * scale`):
      `format` is the scales' layout, quantize_fp8's granularity:
      `"rowwise"` (a scale a row: `[T]` or `[G, N]`, or with a trailing 1),
      `"1x128"` (128 columns of a row) or `"128x128"` (a block);
      quantize_fp8 makes them.
    - `"mxfp4"`: OCP microscaling, `values` two e2m1 values a byte along K
      (float4_e2m1fn_x2 or uint8), `scales` e8m0 (float8_e8m0fnu or uint8),
      one a group of 32 along K; `mxfp4_expert_weights` makes them.
    - `"int4"`: symmetric integers q in -8 .. 7 stored as q + 8, two a byte
      along K (uint8), `scales` bfloat16, one a group of 32 or 128 along K
      (the scales' last dimension gives which); `int4_expert_weights` and
      `gptq_expert_weights` make them.

    A NamedTuple: `values, scales, format = q` unpacks it, and
    `torch.compile` traces through it.  The functions that take one check
    its fields in full, naming the argument."""
    values: torch.Tensor
    scales: torch.Tensor
    format: str
