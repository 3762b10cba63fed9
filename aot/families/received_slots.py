"""received_slots: what each row a rank received in expert parallelism holds
for its experts (aot/kernels/expert_parallel_plan.py): local ids and
weights, the metadata left blank, in one launch.  Integer work with plain loads: every
arch, `basic` only, one dtype (the pointers' types are fixed)."""
from ..family import Config, Family, Param
from ..kernels.expert_parallel_plan import received_slots_kernel
from .dispatch_plan import CONDITIONS, MOST_SLOTS

# BM rows x BK slots a step, 4 warps.
CONFIGS = (Config(64, 16, 16, 4, 1, when="k_16"), Config(16, 16, MOST_SLOTS, 4, 1, when="k_64"))

FAMILY = Family(
    name="received_slots",
    kernel=received_slots_kernel,
    params=(
        Param("meta_ptr", "*i32", "output"),
        Param("ids_ptr", "*i64", "output"),
        Param("weights_ptr", "*fp32", "output"),
        Param("R", "i32", "extent"),
        Param("K", "i32", "extent"),
        Param("EPR", "i32", "extent"),
        Param("RANK", "i32", "extent"),
    ),
    dtypes=("bfloat16",),
    conditions=CONDITIONS,
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    tiles="cdiv(R, BM)",
    rows="R",
)
