"""route: moe_experts' routing (aot/kernels/route.py), a stable counting sort
of the token slots by expert in three launches, one phase each (count, scan,
place), or one (single) where the slots fit one chunk.  Integer work with
plain loads: every arch, `basic` only, one 16-bit dtype (the ids are int64
whatever the tokens' dtype).  Its chunk and bin counts are constants the
operator sizes its scratch by (csrc/ops/route.cc)."""
from ..family import Axis, Choice, Config, Family, Param
from ..kernels.route import route_kernel

SLOTS_PER_CHUNK = 1024  # BM: token slots a program sorts at a time
BINS = 1024  # BN: one per expert and one for dropped slots, so E <= BINS - 1

# The sort's launches (aot/kernels/route.py): the kernel's PHASE is the value's index.
PHASE = Choice("Phase", ("count", "scan", "place", "single"))

CONFIGS = (Config(SLOTS_PER_CHUNK, BINS, 16, 4, 1),)

FAMILY = Family(
    name="route",
    kernel=route_kernel,
    params=(
        Param("ids_ptr", "*i64", "operand"),
        Param("hist_ptr", "*i32", "output"),
        Param("order_ptr", "*i64", "output"),
        Param("inverse_ptr", "*i64", "output"),
        Param("offs_ptr", "*i32", "output"),
        Param("N", "i32", "extent"),
        Param("E", "i32", "extent"),
        Param("CHUNKS", "i32", "extent"),
    ),
    axes=(Axis("phase", PHASE),),
    constexprs=lambda v: {"PHASE": PHASE.values.index(v["phase"])},
    dtypes=("float16",),
    configs={(arch, "basic"): CONFIGS for arch in (80, 90)},
    tiles="CHUNKS",
    rows="N",
    constants={"kSlotsPerChunk": SLOTS_PER_CHUNK, "kBins": BINS},
)
