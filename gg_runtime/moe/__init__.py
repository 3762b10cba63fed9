"""The experts of an MoE layer as one differentiable function, with no bf16
atomics and no host sync.  The forward is one operator
(torch.ops.gg_runtime.moe_experts): routing on the GPU, the up projection
reading the tokens through the routing's order with SwiGLU in its epilogue,
the down projection, and the weighted combine of each token's k outputs
read through the inverse permutation.  The backward, in Python, composes
operators: one kernel for SwiGLU's backward (swiglu_backward), grouped
products (those of the tokens' or the gradient's rows read them through the
routing's order, gathered_mm and gathered_mm_k, where the forward's did:
the operator decides, by aot/families/ragged_glu.py's GATHER_MAX_INTER),
and combine.  With an fp8 recipe (moe_experts(fp8=...)) the forward is the
fp8 weights' operator on the weights quantized (or on fp8_expert_weights'
copies, made once), and the backward's products are fp8_training's; with
the blockwise recipe SwiGLU's backward kernel quantizes what it makes as
those products read it (swiglu_backward_fp8) where its blocks allow.

What the autograd function keeps for backward is the routing, the inputs
and the up projection's output (freed as soon as the backward has read it:
_release); everything else is recomputed.  Every
gather, scatter and combine is a permutation or a sum over the k slots of a
token, never an index_add."""
from __future__ import annotations

from .choices import ACTIVATIONS, GATE_UP_VALUES
from .experts import moe_experts
from .expert_parallelism import ExpertParallelExperts, expert_parallel
from .module import MoEExperts
from .stages import Routing, combine, route
from .torchtitan_glue import TorchtitanExpertParallel, shard_torchtitan_experts
from .transformers_glue import shard_transformers_experts, transformers_experts_forward

__all__ = ["ACTIVATIONS", "GATE_UP_VALUES", "ExpertParallelExperts", "MoEExperts", "Routing",
           "TorchtitanExpertParallel", "combine", "expert_parallel", "moe_experts", "route",
           "shard_torchtitan_experts", "shard_transformers_experts",
           "transformers_experts_forward"]
