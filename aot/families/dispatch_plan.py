"""dispatch_plan: where each of a rank's tokens goes in expert parallelism
(aot/kernels/expert_parallel_plan.py), its rows' places and metadata in one
launch.  Integer work with plain loads: every arch, `basic` only, one dtype
(the pointers' types are fixed)."""
from ..family import Config, Family, Param
from ..kernels.expert_parallel_plan import dispatch_plan_kernel

# Most slots a token has (k): BK covers them in one load.
MOST_SLOTS = 64
CONDITIONS = {"k_16": "K <= 16", "k_64": f"K <= {MOST_SLOTS}"}
# BM tokens x BK slots x BN ranks compared at once: 4 warps over 4096 values.
CONFIGS = (Config(32, 8, 16, 4, 1, when="k_16"), Config(8, 8, MOST_SLOTS, 4, 1, when="k_64"))

FAMILY = Family(
    name="dispatch_plan",
    kernel=dispatch_plan_kernel,
    params=(
        Param("ids_ptr", "*i64", "operand"),
        Param("weights_ptr", "*fp32", "scale"),
        Param("dest_ptr", "*i64", "output"),
        Param("index_ptr", "*i64", "output"),
        Param("meta_ptr", "*i32", "output"),
        Param("T", "i32", "extent"),
        Param("K", "i32", "extent"),
        Param("W", "i32", "extent"),
        Param("EPR", "i32", "extent"),
        Param("RANK", "i32", "extent"),
        Param("CAP", "i32", "extent"),
    ),
    dtypes=("bfloat16",),
    conditions=CONDITIONS,
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    tiles="cdiv(T, BM)",
    rows="T",
    constants={"kMostSlots": MOST_SLOTS},
)
