"""route: moe_experts' routing (aot/kernels/route.py), a stable counting sort
of the token slots by expert in three launches, one phase each (count, scan,
place), or one (single) where the slots fit one program's chunk.  Integer
work with plain loads: every arch, `basic` only, one 16-bit dtype (the ids
are int64 whatever the tokens' dtype).  Its chunk and bin counts are
constants the operator sizes its scratch by (csrc/ops/route.cc)."""
from ..axes import Axis, Choice, Where
from ..family import Config, Family, Param
from ..kernels.route import SCAN_BINS, route_kernel

# BM: the token slots a program of the three launches sorts at a time, and
# the most slots the one launch sorts (one program).  A chunk's sort and
# histograms take time that grows with BM whatever the slots: many small
# chunks in parallel beat a few large ones once there are three launches to
# pay for.
SLOTS_PER_CHUNK = 256
SINGLE_SLOTS = 512
# Decode's few slots take a smaller single chunk still.
FEW_SLOTS = 64
# BN: one bin per expert and one for dropped slots (E <= BN - 1).  Each
# kernel's histograms and scans run over all its bins, so a call takes the
# fewest that hold its experts; the scan takes SCAN_BINS at a time.
BINS = (SCAN_BINS.value, 128, 256, 512, 1024)
MOST_BINS = BINS[-1]

# The sort's launches (aot/kernels/route.py): the kernel's PHASE is the value's index.
PHASE = Choice("Phase", ("count", "scan", "place", "single"))


def bins_condition(bins: int, few_slots: bool = False) -> str:
    """The name of the condition for `bins` bins ('' for the most: any E the
    kernels take), and for the small single chunk where few_slots."""
    names = (["few_slots"] if few_slots else []) + ([f"bins_{bins}"] if bins < MOST_BINS else [])
    return "_".join(names)


def bins_rule(bins: int, few_slots: bool) -> str:
    """The expression of the condition bins_condition(bins, few_slots) names."""
    rules = ([f"N <= {FEW_SLOTS}"] if few_slots else []) + ([f"E < {bins}"] if bins < MOST_BINS
                                                             else [])
    return " and ".join(rules)


CONDITIONS = {bins_condition(bins, few): bins_rule(bins, few)
              for bins in BINS for few in (False, True) if bins_condition(bins, few)}
# Fewest bins first: of the configs a call meets, the dispatch takes the one listed first.
CONFIGS = tuple(Config(SLOTS_PER_CHUNK, bins, 16, 4, 1, when=bins_condition(bins))
                for bins in BINS)
SINGLE_CONFIGS = tuple(config for bins in BINS for config in (
    Config(FEW_SLOTS, bins, 16, 4, 1, max_rows=FEW_SLOTS, when=bins_condition(bins, True)),
    Config(SINGLE_SLOTS, bins, 16, 4, 1, when=bins_condition(bins))))

FAMILY = Family(
    name="route",
    sm80_ptx=True,
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
    conditions=CONDITIONS,
    configs={**{(arch, "basic"): CONFIGS for arch in (80, 90)},
             **{(arch, "basic", Where(phase="single")): SINGLE_CONFIGS for arch in (80, 90)}},
    tiles="CHUNKS",
    rows="N",
    constants={"kSlotsPerChunk": SLOTS_PER_CHUNK, "kSingleSlots": SINGLE_SLOTS,
               "kBins": MOST_BINS},
)
