"""route: moe_experts' routing (aot/kernels/route.py), a stable counting sort
of the token slots by expert in three launches, one phase each (count, scan,
place), or one (single) where the slots fit one chunk (a chunk of 64 slots
where they fit that).  Integer work with plain loads: every arch, `basic`
only, one 16-bit dtype (the ids are int64 whatever the tokens' dtype).  Its
chunk and bin counts are constants the operator sizes its scratch by
(csrc/ops/route.cc)."""
from ..family import Axis, Choice, Config, Family, Param, Where
from ..kernels.route import route_kernel

SLOTS_PER_CHUNK = 1024  # BM: token slots a program sorts at a time
BINS = 1024  # BN: one per expert and one for dropped slots, so E <= BINS - 1
# Decode's few slots take a smaller single chunk: the sort and the
# histograms' work grows with BM whatever the slots.
FEW_SLOTS = 64

# The sort's launches (aot/kernels/route.py): the kernel's PHASE is the value's index.
PHASE = Choice("Phase", ("count", "scan", "place", "single"))

CONFIGS = (Config(SLOTS_PER_CHUNK, BINS, 16, 4, 1),)
SINGLE_CONFIGS = (Config(FEW_SLOTS, BINS, 16, 4, 1, max_rows=FEW_SLOTS, when="few_slots"),
                  *CONFIGS)

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
    conditions={"few_slots": f"N <= {FEW_SLOTS}"},
    configs={**{(arch, "basic"): CONFIGS for arch in (80, 90)},
             **{(arch, "basic", Where(phase="single")): SINGLE_CONFIGS for arch in (80, 90)}},
    tiles="CHUNKS",
    rows="N",
    constants={"kSlotsPerChunk": SLOTS_PER_CHUNK, "kBins": BINS},
)
