"""Helpers for gg_runtime's tests and benchmarks, not part of its API: case
generators, float32/float64 references and tolerances, torch MoE layers to
compare with, an L2-flushing GPU timer, the runtime's test hooks and the
launch of one process a GPU.

Imported only on request (`import gg_runtime` does not import it); it needs
torch, never Triton.  Used by tests/runtime, bench/ and `python -m aot tune`.
"""
from .cases import (list_inputs, moe_inputs, moe_layer_inputs, offsets_from_counts, operand,
                    random_group_sizes, randn, skewed_counts)
from .fp8 import (FP8_BLOCK, FP8_MAX, FP8_TOLERANCE, SCALE_KINDS, column_blocks, dequantize_ref,
                  dequantized, fp8_moe_inputs, quantize_columns_ref, quantize_ref,
                  ref_scaled_grouped_mm)
from .hooks import forced, guarded, last_variant, poisoned
from .moe_layers import (GPT_OSS_ALPHA, GPT_OSS_LIMIT, gated_activation, moe_layer,
                         moe_layer_no_atomics, route_top_k, sorted_by_expert, with_added_bias)
from .ranks import ranks_command, ranks_env
from .references import (FLOAT32_OUTPUT_TOLERANCE, TF32_TOLERANCE, TOLERANCE, effective_ends,
                         group_parts, group_slices, ref_grouped_mm, ref_grouped_mm_grads,
                         ref_list, rel_error, tf32_allowed, tolerance)
from .timing import flush_l2, time_in_turns, time_ms

__all__ = [
    "list_inputs", "moe_inputs", "moe_layer_inputs", "offsets_from_counts", "operand",
    "random_group_sizes", "randn", "skewed_counts",
    "FP8_BLOCK", "FP8_MAX", "FP8_TOLERANCE", "SCALE_KINDS", "column_blocks", "dequantize_ref",
    "dequantized", "fp8_moe_inputs", "quantize_columns_ref", "quantize_ref",
    "ref_scaled_grouped_mm",
    "forced", "guarded", "last_variant", "poisoned",
    "GPT_OSS_ALPHA", "GPT_OSS_LIMIT", "gated_activation", "moe_layer", "moe_layer_no_atomics",
    "route_top_k", "sorted_by_expert", "with_added_bias",
    "ranks_command", "ranks_env",
    "FLOAT32_OUTPUT_TOLERANCE", "TF32_TOLERANCE", "TOLERANCE", "effective_ends", "group_parts",
    "group_slices", "ref_grouped_mm", "ref_grouped_mm_grads", "ref_list", "rel_error",
    "tf32_allowed", "tolerance",
    "flush_l2", "time_in_turns", "time_ms",
]
