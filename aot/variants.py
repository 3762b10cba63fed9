"""The variant space: family (aot/families/) x arch x dtype x output dtype x
the family's axis values x flavour x config.

The compiler builds exactly `all_variants()`, the code generator turns them
into the runtime's kernel table, and the tests parametrise over the same
list (the wheel's `_C.variants()`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import triton.language as tl

from .families import FAMILIES
from .family import Config
from .kernels.gluon_api import CLUSTERS

__all__ = ["ARCHS", "DTYPES", "FLAVOURS", "Arch", "Config", "DType", "Variant", "all_variants"]


@dataclass(frozen=True)
class Arch:
    """A compile target.  `exact`: its cubins run on compute capability
    arch // 10 . arch % 10 only (sm_90a); otherwise on every minor version from
    arch % 10 up within the major (sm_80 on 8.0, 8.6, 8.9)."""
    arch: int
    exact: bool
    tma: bool  # the hardware has TMA (and the build compiles `tma` flavours)
    shared_limit: int  # bytes of shared memory a variant may use on every GPU it runs on
    ptx: bool = False  # also ship PTX: the driver compiles it for newer GPUs
    # The most any GPU of the arch allows: LARGE_CONFIGS are fitted to it, and the
    # runtime picks their variants only where the device's opt-in limit admits them.
    shared_max: int = 0
    # Accumulator registers a thread may hold where the inputs are 4 bytes wide
    # (float32 as tf32x3 splits each operand in two and makes three products),
    # 0 for no bound; such configs also step K at most WIDE_INPUT_BK deep.
    # Past them sm80's kernels, whose mma.sync holds both operands' fragments
    # in registers too, spill, and a 128 x 128 tile on 4 warps, 128 x 256 on 8
    # or a 64-deep K step makes ptxas fall back to 32 registers and KBs of
    # stack a thread (`python -m aot resources`).
    wide_input_accumulator: int = 0

    @property
    def shared_ceiling(self) -> int:
        return max(self.shared_limit, self.shared_max)

    @staticmethod
    def of(arch: int) -> Arch:
        return next(a for a in ARCHS if a.arch == arch)


WIDE_INPUT_BK = 32

# sm80 cubins and PTX run on 8.6 / 8.9 (99 KiB a block) and 8.0 (163 KiB).
ARCHS = (Arch(80, exact=False, tma=False, shared_limit=99 * 1024, ptx=True,
              shared_max=163 * 1024, wide_input_accumulator=64),
         Arch(90, exact=True, tma=True, shared_limit=227 * 1024))


@dataclass(frozen=True)
class DType:
    """An input element type and how products of it are computed.  Two kinds
    share float32 storage: `float32` multiplies with three TF32 products per
    product (tf32x3, near float32 accuracy), `tf32` with one (what torch does
    when torch.backends.cuda.matmul.allow_tf32 is set)."""
    name: str
    storage: str  # torch's name of the element type
    short: str  # Triton's signature name
    triton: object
    bytes: int
    precision: str = "tf32"  # Triton's dot input precision (used for float32 inputs only)
    opt_in: bool = False  # compiled only for families that name it in their dtypes


DTYPES = {d.name: d for d in (
    DType("float16", "float16", "fp16", tl.float16, 2),
    DType("bfloat16", "bfloat16", "bf16", tl.bfloat16, 2),
    DType("float32", "float32", "fp32", tl.float32, 4, precision="tf32x3"),
    DType("tf32", "float32", "fp32", tl.float32, 4, precision="tf32"),
    DType("float8_e4m3fn", "float8_e4m3fn", "fp8e4nv", tl.float8e4nv, 1, opt_in=True),
)}
# Groups scanned per step by the persistent kernels' tile -> group lookup.
GROUP_CHUNK = 64
TUNING_DIR = Path(__file__).parent / "tuning"


# Flavours in the runtime's order of preference, each with the rule an input
# must meet to take it (csrc/run.cc checks the rules from the parameters' roles
# and `aligned` marks).
FLAVOURS = {"tma": "tma", "aligned": "aligned", "basic": "none"}

# Heuristic sets, used where no tuned table exists.  sm80 configs keep shared
# memory under 99 KiB so they also load on 8.6 / 8.9.  `basic` is the fallback
# for inputs no faster flavour takes (strides or sizes off 16 bytes): one
# config, since each costs the build a variant for every dtype and layout
# (docs/build.md's budget), of 64 x 64 tiles: why, in
# docs/notes/2026-11-28-return-in-turns-and-the-build-budget.md.
BASIC_CONFIG = Config(64, 64, 32, 4, 4)
DEFAULT_CONFIGS = {
    (80, "basic"): (BASIC_CONFIG,),
    (80, "aligned"): (
        Config(64, 64, 32, 4, 4, max_rows=64),
        Config(128, 128, 32, 4, 3),
    ),
    (90, "basic"): (BASIC_CONFIG,),
    (90, "tma"): (
        Config(64, 128, 64, 4, 4, max_rows=64),
        Config(128, 128, 64, 8, 4, max_rows=256),
        Config(128, 256, 64, 8, 3),
    ),
}


# Configs for the GPUs of an arch with more shared memory than its least
# (Arch.shared_max): listed first, so where they load they win their bucket.
LARGE_CONFIGS = {
    (80, "aligned"): (Config(128, 256, 64, 8, 4),),
}


def flavours(family: str, axes: tuple, arch: Arch) -> tuple:
    """`basic` (any alignment) unless the family opts out; `tma` where the
    hardware has it, and `aligned` where a variant has no `tma`, each for the
    axis values the family's description gives it; none for a TMA-only
    variant where the hardware has no TMA."""
    desc = FAMILIES[family]
    values = desc.named(axes)

    def holds(where) -> bool:
        return where is not None and where.holds(values)

    if holds(desc.tma_only) and not arch.tma:
        return ()
    out = ["basic"] if desc.basic else []
    has_tma = arch.tma and holds(desc.tma)
    if holds(desc.aligned) and not has_tma:
        out.append("aligned")
    if has_tma:
        out.append("tma")
    return tuple(out)


def _fitted(config: Config, arch: Arch, limit: int, dtype: DType, out: DType, tma: bool,
            ring_scales: bool, weights: DType | None = None, weight_rows: int = 0) -> Config:
    """The config, with more warps or half the columns where 4-byte inputs
    would hold more accumulator registers a thread than the arch takes
    (Arch.wide_input_accumulator), and K steps at most WIDE_INPUT_BK deep
    there; then with fewer stages or a shorter BK where wider elements would
    overflow `limit` bytes of shared memory (tuned tables are measured for
    16-bit)."""
    if dtype.bytes == 4 and arch.wide_input_accumulator:
        while config.BM * config.BN // (32 * config.num_warps) > arch.wide_input_accumulator:
            if config.num_warps < 8:
                config = replace(config, num_warps=config.num_warps * 2)
            else:
                config = replace(config, BN=config.BN // 2)
        config = replace(config, BK=min(config.BK, WIDE_INPUT_BK))
    while config.shared_estimate(dtype, out, tma, ring_scales, weights, weight_rows) > limit:
        if config.num_stages > 2:
            config = Config(**{**asdict(config), "num_stages": config.num_stages - 1})
        elif config.BK > 16:
            config = Config(**{**asdict(config), "BK": config.BK // 2})
        else:
            break
    return config


def configs_for(family: str, arch: Arch, flavour: str, dtype: DType, out: DType,
                axes: tuple) -> tuple:
    """The tuned table for (arch, family, flavour) if `aot tune` wrote one, else
    the family's own configs, else the defaults; fitted to the element sizes."""
    table = TUNING_DIR / f"sm{arch.arch}.json"
    own = FAMILIES[family].configs
    configs = FAMILIES[family].own_configs(arch.arch, flavour, axes) or \
        DEFAULT_CONFIGS[(arch.arch, flavour)]
    if table.exists():
        entries = json.loads(table.read_text()).get(family, {}).get(flavour)
        if entries:
            configs = tuple(Config(**e) for e in entries)
    tma = flavour == "tma"
    scales = FAMILIES[family].ring_scales
    staged = FAMILIES[family].staged(FAMILIES[family].named(axes))
    staged_out = DTYPES[staged] if staged else out  # what a ws kernel's shared memory holds
    weights = DTYPES.get(FAMILIES[family].weights)
    large = [] if own else [_fitted(c, arch, arch.shared_ceiling, dtype, out, tma, scales, weights)
                            for c in LARGE_CONFIGS.get((arch.arch, flavour), ())]
    for c in configs:  # a tuned table's too
        FAMILIES[family].check_when(c)
    if any(c.pingpong for c in configs) and not FAMILIES[family].takes_pingpong:
        raise ValueError(f"{family}: a pingpong config, but its ws kernel takes no PINGPONG")
    if not _runs_clustered(family, flavour, dtype, axes):
        configs = [c for c in configs if c.ctas == 1]
    if not _runs_ws(family, flavour, dtype):
        configs = [replace(c, ws=False, pingpong=False) for c in configs]
    fitted = large + [_fitted(c, arch, arch.shared_limit, dtype, staged_out if c.ws else out,
                              tma, scales, weights, FAMILIES[family].weight_rows)
                      for c in configs]
    return tuple(dict.fromkeys(fitted))  # fitting can make two configs one


def _runs_ws(family: str, flavour: str, dtype: DType) -> bool:
    """Whether `ws` configs compile here (the family's Gluon kernel takes TMA,
    16- and 8-bit inputs); elsewhere their tiles run without warp specialisation."""
    return FAMILIES[family].ws_kernel is not None and flavour == "tma" and dtype.bytes <= 2


def _runs_clustered(family: str, flavour: str, dtype: DType, axes: tuple) -> bool:
    """Whether configs with ctas > 1 compile here: a ws kernel that takes
    clusters (kernels/ragged_ws.py: 16-bit inputs, a row-major a and c) under a
    Triton that launches them (kernels/gluon_api.py); elsewhere they are left out."""
    desc = FAMILIES[family]
    constexprs = desc.constexprs(desc.named(axes))
    transposed = constexprs.get("A_T", False) or constexprs.get("C_T", False)
    return (CLUSTERS and desc.takes_clusters and _runs_ws(family, flavour, dtype)
            and dtype.bytes == 2 and not transposed)


def out_dtypes(family: str, dtype: DType) -> tuple:
    """The family's output types if it names them; else the input's own type,
    and float32 for 16-bit inputs where the family writes a separate output type."""
    if FAMILIES[family].out_dtypes:
        return tuple(map(DTYPES.get, FAMILIES[family].out_dtypes))
    own = DTYPES[dtype.storage]
    if FAMILIES[family].float32_output and dtype.bytes < 4:
        return (own, DTYPES["float32"])
    return (own,)


@dataclass(frozen=True)
class Variant:
    family: str
    arch: int
    dtype: str
    axes: tuple  # the family's axis values, in its axes' order
    flavour: str
    config: Config
    out_dtype: str = ""  # '' = the input's storage type

    @property
    def out(self) -> DType:
        return DTYPES[self.out_dtype or DTYPES[self.dtype].storage]

    @property
    def key(self) -> str:
        types = self.dtype if self.out.name == DTYPES[self.dtype].storage else \
            f"{self.dtype}-{self.out.name}"
        axes = FAMILIES[self.family].axes_key(self.axes)
        return f"{self.family}.sm{self.arch}.{types}.{axes}.{self.flavour}.{self.config.tag}"

    @property
    def path(self) -> tuple:
        """What decides which kernel code a variant compiles beyond its types'
        widths and its tile sizes: its family, arch, axis values, flavour and
        the config's kernel choices (warp-specialised, pingpong, condition,
        cluster size)."""
        c = self.config
        return (self.family, self.arch, self.axes, self.flavour, c.ws, c.pingpong, c.when, c.ctas)

    def signature(self) -> dict:
        return FAMILIES[self.family].signature(DTYPES[self.dtype].short, self.out.short)

    def divisible_params(self) -> dict:
        """{index in the kernel's arguments: what the variant compiles that
        value as a multiple of}: what the runtime's rule for its flavour
        guarantees of every call it launches (csrc/run.cc meets).  `aligned`:
        the aligned parameters, multiples of 16.  `tma` (a family without a
        group table, whose call arguments the rule checks): the operand and
        output bases, 16-byte aligned, and the strides and row lengths,
        multiples of 16 bytes of the narrower of the variant's element types,
        as the runtime counts them.  Without these, Triton takes every value
        as it may come, and the kernel's plain loads and stores go an element
        at a time (docs/notes/2026-11-30-fp8-decode-combine-tiles-and-tma-alignment.md)."""
        family = FAMILIES[self.family]
        index = family.kernel.arg_names.index
        if self.flavour == "aligned":
            return {index(p.name): 16 for p in family.params if p.aligned}
        if self.flavour != "tma" or family.has_group_table:
            return {}
        elements = 16 // min(DTYPES[self.dtype].bytes, self.out.bytes)
        bases = {index(p.name): 16 for p in family.params
                 if p.role in ("operand", "output") and p.type.startswith("*")}
        lengths = {index(p.name): elements for p in family.params
                   if p.role in ("stride", "row_length")}
        return {**bases, **lengths}

    def constexprs(self) -> dict:
        family = FAMILIES[self.family]
        c = self.config
        values = dict(family.constexprs(family.named(self.axes)))
        values.update(USE_TMA=self.flavour == "tma", BM=c.BM, BN=c.BN, BK=c.BK, CHUNK=GROUP_CHUNK,
                      PRECISION=DTYPES[self.dtype].precision)
        if c.ws:
            values["STAGES"] = c.num_stages
            if family.takes_clusters:
                values["CTAS"] = c.ctas
            if family.takes_pingpong:
                values["PINGPONG"] = c.pingpong
        values.update(family.when_constexprs.get(c.when, {}))
        if family.dtype_constexpr:
            values["DTYPE"] = DTYPES[self.dtype].triton
        return values

    def describe(self) -> dict:
        return {"key": self.key, "family": self.family, "arch": self.arch, "dtype": self.dtype,
                "out_dtype": self.out.name, "axes": FAMILIES[self.family].named(self.axes),
                "flavour": self.flavour,
                "config": asdict(self.config)}


def compiled_dtypes(family: str) -> tuple:
    """Names of the input dtypes the family is compiled for: those it names,
    else every dtype but the opt-in ones."""
    return FAMILIES[family].dtypes or tuple(d for d in DTYPES if not DTYPES[d].opt_in)


def all_variants() -> list:
    return [
        Variant(family, arch.arch, dtype.name, axes, flavour, config, out.name)
        for family, desc in FAMILIES.items()
        for arch in ARCHS if arch.arch in (desc.archs or [a.arch for a in ARCHS])
        for dtype in map(DTYPES.get, compiled_dtypes(family))
        for out in out_dtypes(family, dtype)
        for axes in desc.axis_values()
        for flavour in flavours(family, axes, arch)
        for config in configs_for(family, arch, flavour, dtype, out, axes)
    ]
