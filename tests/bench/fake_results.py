"""A results.json as bench/run.py writes it, every section's data shaped as its
run() returns it (figures made up), for the report's tests."""


def timed(tflops: float) -> dict:
    return {"rel_error": 1e-3, "ms": 100 / tflops, "tflops": tflops}


FAILED = {"error": "RuntimeError: no kernel for this case"}
LAYER_SHAPE = {"T": 16384, "H": 2048, "I": 1024, "E": 64, "k": 8}
LAYER_TIMES = {"forward_ms": 6.0, "train_step_ms": 15.0, "peak_step_gb": 3.1}
EXPERTS_TIMES = {**LAYER_TIMES, "saved_gb": 2.3, "forward_x": 1.5, "train_step_x": 1.7,
                 "saved_x": 0.3}

DATA = {
    "workloads": {
        "ceilings": {"matmul_tflops": 812.0, "copy_tbps": 3.1},
        "workloads": [
            {"name": "mixtral_up_8e_8k", "dtype": "bfloat16", "layout": "ragged", "groups": 8,
             "flops": 10 ** 12, "bytes": 10 ** 9, "floor_ms": 1.2,
             "runs": {"gg_runtime": timed(640.0), "torch_grouped_mm": timed(580.0),
                      "cublas_loop": FAILED, "dense_same_flops": timed(700.0)},
             "roofline_fraction": 0.81, "vs_dense": 0.91, "vs_torch": 1.1, "vs_cublas_loop": None},
            {"name": "seed_square_128", "dtype": "float16", "layout": "list", "groups": 4,
             "flops": 10 ** 8, "bytes": 10 ** 6, "floor_ms": 0.01,
             "runs": {"gg_runtime": timed(20.0), "cublas_loop": timed(10.0),
                      "seed_basic_jit": timed(5.0), "dense_same_flops": timed(30.0)},
             "roofline_fraction": 0.2, "vs_dense": 0.67, "vs_torch": None, "vs_cublas_loop": 2.0},
        ],
        "summary": {"moe_bf16_geomean_vs_torch": 1.1, "moe_bf16_min_vs_torch": 1.1,
                    "moe_bf16_geomean_roofline": 0.81, "moe_bf16_min_roofline": 0.81},
        "plot": "plots/workloads.png",
    },
    "wgrad": {
        "ceilings": {"matmul_tflops": 812.0, "copy_tbps": 3.1},
        "workloads": [{"name": "mixtral_up_8e_8k_wgrad",
                       "runs": {"gg_runtime": timed(600.0), "torch_grouped_mm": timed(500.0),
                                "gg_runtime_transposed": timed(590.0),
                                "torch_grouped_mm_transposed": FAILED},
                       "vs_torch": 1.2, "transposed_vs_torch": None, "roofline_fraction": 0.7}],
    },
    "training": {"layers": [
        {"name": "olmoe", "shape": LAYER_SHAPE, "rel_error_vs_torch": {"out": 1e-3},
         "torch": LAYER_TIMES, "gg_runtime": {**LAYER_TIMES, "forward_ms": 5.0},
         "forward_vs_torch": 1.2, "train_step_vs_torch": 1.0, "peak_vs_torch": 1.0},
        {"name": "gpt_oss_20b (bias)", "shape": LAYER_SHAPE, "rel_error_vs_torch": {"out": 0.5},
         "error": "gg_runtime's layer differs from torch's: {'out': 0.5}"},
    ]},
    "experts": {"layers": [
        {"name": "olmoe", "shape": LAYER_SHAPE, "errors": {"moe_experts": 1e-3},
         **{impl: EXPERTS_TIMES
            for impl in ("torchtitan", "no_atomics", "no_atomics_gg_mm", "moe_experts")}},
        {"name": "gpt_oss_20b_as_is", "shape": LAYER_SHAPE, "errors": {"moe_experts": 0.5},
         "error": "a layer differs from the no_atomics torch layer"},
    ]},
    "bias": {"workloads": [{"name": "mixtral_up_8e_8k",
                            "runs": {"gg_bias": timed(600.0), "torch_grouped_mm_then_add":
                                     timed(450.0), "gg": timed(601.0)},
                            "bias_cost": 1.0, "vs_torch_then_add": 1.33}]},
    "fp16": {"workloads": [{"name": "mixtral_up_8e_8k",
                            "runs": {"float16": timed(630.0), "bfloat16": timed(640.0)},
                            "fp16_vs_bf16": 0.98}]},
    "cases": {"cases": [
        {"name": "ragged_n_3d_2d", "runs": {"gg_runtime": timed(500.0),
                                            "torch_grouped_mm": timed(450.0),
                                            "gg_runtime_out_transposed": timed(520.0)}},
        {"name": "ragged_k_row_major_a", "runs": {"gg_runtime": timed(400.0),
                                                  "torch_grouped_mm": FAILED}},
    ]},
    "fp8": {
        "workloads": [{"name": "mixtral_up_8e_8k",
                       "runs": {"gg_bf16": timed(640.0), "gg_fp8_rowwise_fast": timed(1100.0),
                                "gg_fp8_rowwise": timed(900.0),
                                "torch_scaled_grouped_mm_fast": timed(800.0),
                                "torch_scaled_grouped_mm": timed(600.0),
                                "gg_fp8_blockwise_fast": timed(1000.0),
                                "gg_fp8_blockwise": FAILED},
                       "rowwise_fast_vs_bf16": 1.72, "rowwise_fast_vs_torch_fast": 1.38,
                       "blockwise_fast_vs_rowwise_fast": 0.91, "rowwise_vs_torch": 1.5,
                       "blockwise_vs_rowwise": None}],
        "accumulation": [{"K": 512, "gg_float32": 1.2e-4, "gg_bfloat16": 2.5e-3,
                          "torch_fast_accum_False": 2.5e-3,
                          "torch_fast_accum_True": "not implemented in this build"}],
        "copy_tbps": 3.1,
        "quantize": {"rowwise": {"tbps": 2.6, "vs_copy": 0.84},
                     "128x128": {"tbps": 2.7, "vs_copy": 0.87}},
    },
    "fp8_experts": {
        "copy_tbps": 3.0,
        "cases": [
            {"name": "mixtral_channelwise", "model": "mixtral", "scales": "channelwise",
             "shape": {"H": 4096, "I": 14336, "E": 8, "k": 2},
             "rows": [
                 {"name": "mixtral_channelwise, T=1", "T": 1, "decode": True,
                  "touched_experts": 2,
                  "runs": {"gg_fp8": {"rel_error": 0.045, "ms": 0.2, "tflops": 1.8},
                           "gg_bf16": {"rel_error": 0.0, "ms": 0.3, "tflops": 1.2},
                           "torch_fp8": {"rel_error": 0.045, "ms": 0.5, "tflops": 0.7}},
                  "first_call_ms": {"gg_fp8": 12.5, "gg_bf16": 3.1, "torch_fp8": 40.2},
                  "vs_bf16": 1.5, "vs_torch_fp8": 2.5,
                  "of_bound": {"gg_fp8": 0.59, "gg_bf16": 0.78, "torch_fp8": 0.23}},
                 {"name": "mixtral_channelwise, T=4096", "T": 4096, "decode": False,
                  "touched_experts": 8,
                  "runs": {"gg_fp8": timed(900.0), "gg_bf16": timed(600.0),
                           "torch_fp8": {"error": "wrong result: relative error 1.00e+00"}},
                  "first_call_ms": {"gg_fp8": 2.0, "gg_bf16": 2.5, "torch_fp8": 3.0},
                  "vs_bf16": 1.5, "vs_torch_fp8": None, "of_bound": {}},
             ]},
            {"name": "deepseek_v3_blockwise", "model": "deepseek_v3", "scales": "blockwise",
             "shape": {"H": 7168, "I": 2048, "E": 256, "k": 8},
             "rows": [{"name": "deepseek_v3_blockwise, T=8", "T": 8, "decode": True,
                       "touched_experts": 62,
                       "runs": {"gg_fp8": {"rel_error": 0.044, "ms": 1.1, "tflops": 0.6},
                                "gg_bf16": {"rel_error": 0.0, "ms": 1.9, "tflops": 0.3}},
                       "first_call_ms": {"gg_fp8": 1.3, "gg_bf16": 2.0},
                       "vs_bf16": 1.73, "vs_torch_fp8": None,
                       "of_bound": {"gg_fp8": 0.83, "gg_bf16": 0.96}}]},
        ],
    },
    "vllm_fp8": {
        "vllm": {"kind": "wheel", "version": "0.33.0", "commit_id": "g4ba787ec9"},
        "triton": "3.6.0",
        "cases": [
            {"name": "deepseek_v3_blockwise", "model": "deepseek_v3",
             "shape": {"H": 7168, "I": 2048, "E": 256, "k": 8},
             "rows": [
                 {"name": "deepseek_v3_blockwise, T=1", "T": 1, "touched_experts": 8,
                  "runs": {"gg_fp8": {"rel_error": 0.0, "ms": 0.1, "tflops": 0.9},
                           "vllm_fp8": {"rel_error": 0.012, "ms": 0.15, "tflops": 0.6}},
                  "first_call_ms": {"gg_fp8": 1.2, "vllm_fp8": 2500.0}, "vs_vllm": 1.5,
                  "vllm_config": {"tuned": None, "naive": True, "swap_ab": True,
                                  "BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128,
                                  "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 4}},
                 {"name": "deepseek_v3_blockwise, T=4096", "T": 4096, "touched_experts": 256,
                  "runs": {"gg_fp8": timed(900.0),
                           "vllm_fp8": {"error": "wrong result: relative error 1.00e+00"}},
                  "first_call_ms": {"gg_fp8": 2.0, "vllm_fp8": 900.0}, "vs_vllm": None,
                  "vllm_config": {"tuned": "E=256,N=2048,...json", "naive": False,
                                  "swap_ab": False, "BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128,
                                  "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32, "num_warps": 4,
                                  "num_stages": 3}},
             ]},
        ],
    },
    "fp8_training": {"workloads": [
        {"name": "mixtral_down", "shape": [16384, 8, 14336, 4096],
         "runs": {"bf16_fwd": timed(700.0), "rowwise_fwd": timed(800.0),
                  "blockwise_fwd": timed(760.0), "bf16_step": timed(650.0),
                  "rowwise_step": timed(600.0), "blockwise_step": FAILED},
         "rowwise_fwd_vs_bf16": 1.14, "blockwise_fwd_vs_bf16": 1.09,
         "rowwise_step_vs_bf16": 0.92, "blockwise_step_vs_bf16": None}]},
    "fp8_moe_training": {"layers": [
        {"name": "olmoe", "shape": {"T": 16384, "H": 2048, "I": 1024, "E": 64, "k": 8},
         "errors": {"rowwise": 0.04, "blockwise": 0.03},
         "bf16": {"forward_ms": 2.0, "step_ms": 6.0, "peak_step_gb": 2.5, "saved_gb": 0.6},
         "rowwise": {"forward_ms": 1.5, "step_ms": 5.0, "peak_step_gb": 2.6, "saved_gb": 0.6,
                     "forward_x": 1.33, "step_x": 1.2, "step_given_ms": 4.5,
                     "step_given_x": 1.33, "quantize_ms": 0.5},
         "blockwise": {"forward_ms": 1.6, "step_ms": 5.2, "peak_step_gb": 2.6, "saved_gb": 0.6,
                       "forward_x": 1.25, "step_x": 1.15, "step_given_ms": 4.6,
                       "step_given_x": 1.3, "quantize_ms": 0.5}},
        {"name": "mixtral_8x7b", "shape": {"T": 8192, "H": 4096, "I": 14336, "E": 8, "k": 2},
         "errors": {"rowwise": 0.5, "blockwise": 0.03},
         "error": "an fp8 recipe differs from bf16 by more than 0.1: {'rowwise': 0.5}"}]},
    "fp8_convergence": {"model": {"vocab": 2048, "dim": 1024, "experts": 8, "inter": 1024,
                                  "top_k": 2, "layers": 4, "batch_tokens": 8192, "steps": 3,
                                  "lr": 1e-3},
                        "entropy": 1.5, "losses": {"bf16": [7.6, 4.0, 2.0],
                                                   "rowwise": [7.6, 4.1, 2.01],
                                                   "moe_experts bf16": [7.6, 4.0, 2.0],
                                                   "moe_experts blockwise": [7.6, 4.0, 2.02]},
                        "final": {"bf16": 2.0, "rowwise": 2.01, "moe_experts bf16": 2.0,
                                  "moe_experts blockwise": 2.02}},
    "model": {"model": {"dim": 2048, "hidden": 1024, "experts": 32, "top_k": 2, "layers": 2},
              "forward": [{"tokens": 2048, "ms": {"gg_runtime": 1.5, "torch": 1.6},
                           "vs_torch": 1.07}]},
    "proxy": {"workloads": [{"name": "mixtral_up_8e_8k", "aligned_variant": "ragged_m.sm80.a",
                             "aligned": 310.0, "basic_variant": "ragged_m.sm80.b",
                             "basic": 120.0, "cublas_loop": 400.0}]},
    "host": {"calls": {"grouped_mm_us": 15.2, "torch_grouped_mm_us": 19.9,
                       "moe_experts_forward_in_turns_us": 40.0,
                       "torch_grouped_mm_in_turns_us": 32.0, "moe_experts_forward_x_torch": 1.25},
             "cold_start": {"import_ms": 16.0, "first_call_ms": 10.8,
                            "import_plus_first_call_ms": 26.8, "rel_error": 1e-3,
                            "triton_loaded": False}},
}

PROVENANCE = {"device": "NVIDIA H200", "date": "2026-11-25", "torch": "2.11.0+cu130",
              "commit": "abc1234",
              "gg_runtime_build": {"triton_version": "3.9.0", "archs": ["sm80", "sm90"],
                                   "dtypes": ["bfloat16"], "families": ["ragged_m"],
                                   "variants": 628},
              "only": ""}


def results(sections=DATA) -> dict:
    """results.json's contents: every section of `sections` run with PROVENANCE."""
    return {name: {**PROVENANCE, "data": data} for name, data in sections.items()}
