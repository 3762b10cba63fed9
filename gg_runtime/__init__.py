"""gg_runtime: grouped GEMM for NVIDIA GPUs from ahead-of-time compiled Triton
kernels.  No Triton, compiler or warm-up at run time."""
from ._native import CudaError, UnsupportedDeviceError
from .api import gmm, grouped_gemm, grouped_mm, quantize_fp8, scaled_grouped_mm
from .fp8_training import fp8_grouped_mm
from .formats import Quantized
from .fp8_expert_weights import Fp8ExpertWeights, quantize_expert_weights
from .info import info
from .moe import MoEExperts, moe_experts, transformers_experts_forward
from .w4_expert_weights import gptq_expert_weights, int4_expert_weights, mxfp4_expert_weights
from .serving import fused_experts
from .settings import force_ptx, sm_limit

__version__ = "0.1.0"
__all__ = ["grouped_gemm", "grouped_mm", "gmm", "scaled_grouped_mm", "quantize_fp8", "Quantized",
           "fp8_grouped_mm", "moe_experts", "MoEExperts", "transformers_experts_forward",
           "quantize_expert_weights", "Fp8ExpertWeights", "mxfp4_expert_weights",
           "int4_expert_weights", "gptq_expert_weights",
           "fused_experts", "info", "force_ptx", "sm_limit", "CudaError", "UnsupportedDeviceError"]
