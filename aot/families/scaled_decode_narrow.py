"""scaled_decode_narrow: moe_experts' fp8 decode forward in one kernel, as
scaled_experts_decode's warp-specialised kernel (kernels/experts_decode_ws.py)
with units of 64 columns of h (BN = 128 w13 rows a step) in place of 128:
twice the units, each reading half the weights, so that twice the SMs
stream them.  Taken where a call's units at 64 columns still fit in one wave
(csrc/ops/expert_products_fp8_decode.cc decode_unit_columns): there each
unit's program reads its weights at the rate one SM streams, and the units,
not the bytes, set the time.  h is quantized per 64 columns, inside the
kernel (it never leaves it); the parts are [S, cdiv(I, 64), H].  The
family's dtype is the tokens' (16-bit); the weights are float8_e4m3fn, by
TMA, sm90."""
from dataclasses import replace

from ..family import Config
from .scaled_experts_decode import FAMILY as DECODE
from .scaled_experts_decode import FEW_SLOTS

# As the wide kernel's few-unit config (one program an SM): a ring slot holds
# half its bytes, so five of them fit where three did.
CONFIGS = (Config(16, 128, 256, 4, 5, ws=True, when="few_slots"),)

FAMILY = replace(
    DECODE,
    name="scaled_decode_narrow",
    configs={(90, "tma"): CONFIGS},
    conditions={"few_slots": FEW_SLOTS},
    tiles="0 if S == 0 else (cdiv(S, BM) + min(S, G)) * cdiv(N, BN)",
)
