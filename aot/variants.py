"""The variant space: family (aot/families/) x arch x dtype x output dtype x
layout x flavour x config.

The compiler builds exactly `all_variants()`, the code generator turns them
into the runtime's kernel table, and the tests parametrise over the same
list (the wheel's `_C.variants()`).

Layout names give how A and B are stored, one letter each: 'n' as the math
reads (A [M, K], B [K, N], row-major), 't' stored transposed (A as [K, M],
B as [N, K] -- the nn.Linear weight layout).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import triton.language as tl

from .families import FAMILIES


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
    aligned: bool = False  # compile `aligned` flavours (vectorised loads where TMA is missing)

    @staticmethod
    def of(arch: int) -> "Arch":
        return next(a for a in ARCHS if a.arch == arch)


ARCHS = (Arch(80, exact=False, tma=False, shared_limit=99 * 1024, ptx=True, aligned=True),
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


DTYPES = {d.name: d for d in (
    DType("float16", "float16", "fp16", tl.float16, 2),
    DType("bfloat16", "bfloat16", "bf16", tl.bfloat16, 2),
    DType("float32", "float32", "fp32", tl.float32, 4, precision="tf32x3"),
    DType("tf32", "float32", "fp32", tl.float32, 4, precision="tf32"),
)}
# Groups scanned per step by the persistent kernels' tile -> group lookup.
GROUP_CHUNK = 64
TUNING_DIR = Path(__file__).parent / "tuning"


@dataclass(frozen=True)
class Config:
    """Tile shape and schedule.  `max_rows` bounds the rows per group this config
    is chosen for (the runtime takes the smallest bound that fits; 0 = no bound)."""
    BM: int
    BN: int
    BK: int
    num_warps: int
    num_stages: int
    max_rows: int = 0

    @property
    def tag(self) -> str:
        return f"{self.BM}x{self.BN}x{self.BK}_w{self.num_warps}_s{self.num_stages}"

    def shared_estimate(self, dtype: "DType", out: "DType", tma: bool) -> int:
        """Shared memory of the pipeline, the output tile a TMA store stages,
        and for tf32x3 one more A tile (its split into high and low parts;
        measured: Triton 3.6 allocates BM * BK * 4 bytes more)."""
        ring = self.num_stages * (self.BM + self.BN) * self.BK * dtype.bytes
        split = self.BM * self.BK * dtype.bytes if dtype.precision == "tf32x3" else 0
        return ring + split + (self.BM * self.BN * out.bytes if tma else 0)


# Flavours in the runtime's order of preference, each with the rule an input
# must meet to take it (csrc/run.cc checks the rules from the parameters' roles
# and `aligned` marks).
FLAVOURS = {"tma": "tma", "aligned": "aligned", "basic": "none"}

# Heuristic sets, used where no tuned table exists.  sm80 configs keep shared
# memory under 99 KiB so they also load on 8.6 / 8.9.
DEFAULT_CONFIGS = {
    (80, "basic"): (
        Config(64, 64, 32, 4, 4, max_rows=64),
        Config(128, 128, 32, 4, 3),
    ),
    (80, "aligned"): (
        Config(64, 64, 32, 4, 4, max_rows=64),
        Config(128, 128, 32, 4, 3),
    ),
    (90, "basic"): (
        Config(64, 64, 32, 4, 4, max_rows=64),
        Config(128, 128, 32, 8, 3),
    ),
    (90, "tma"): (
        Config(64, 128, 64, 4, 4, max_rows=64),
        Config(128, 128, 64, 8, 4, max_rows=256),
        Config(128, 256, 64, 8, 3),
    ),
}


def flavours(family: str, layout: str, arch: Arch) -> tuple:
    """`basic` everywhere (any alignment); `tma` where the hardware has it and
    `aligned` where the arch compiles it, each for the layouts the family's
    description lists for it."""
    desc = FAMILIES[family]
    out = ["basic"]
    if arch.aligned and layout in desc.aligned_layouts:
        out.append("aligned")
    if arch.tma and layout in desc.tma_layouts:
        out.append("tma")
    return tuple(out)


def _fitted(config: Config, arch: Arch, dtype: DType, out: DType, tma: bool) -> Config:
    """The config, with fewer stages or a shorter BK where wider elements would
    overflow the arch's shared memory (tuned tables are measured for 16-bit)."""
    while config.shared_estimate(dtype, out, tma) > arch.shared_limit:
        if config.num_stages > 2:
            config = Config(**{**asdict(config), "num_stages": config.num_stages - 1})
        elif config.BK > 16:
            config = Config(**{**asdict(config), "BK": config.BK // 2})
        else:
            break
    return config


def configs_for(family: str, arch: Arch, flavour: str, dtype: DType, out: DType) -> tuple:
    """The tuned table for (arch, family, flavour) if `aot tune` wrote one, else
    the defaults; fitted to the element sizes."""
    table = TUNING_DIR / f"sm{arch.arch}.json"
    configs = DEFAULT_CONFIGS[(arch.arch, flavour)]
    if table.exists():
        entries = json.loads(table.read_text()).get(family, {}).get(flavour)
        if entries:
            configs = tuple(Config(**e) for e in entries)
    fitted = [_fitted(c, arch, dtype, out, flavour == "tma") for c in configs]
    return tuple(dict.fromkeys(fitted))  # fitting can make two configs one


def out_dtypes(family: str, dtype: DType) -> tuple:
    """The input's own type, and float32 for 16-bit inputs where the family
    writes a separate output type."""
    own = DTYPES[dtype.storage]
    if FAMILIES[family].float32_output and dtype.bytes < 4:
        return (own, DTYPES["float32"])
    return (own,)


@dataclass(frozen=True)
class Variant:
    family: str
    arch: int
    dtype: str
    layout: str
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
        return f"{self.family}.sm{self.arch}.{types}.{self.layout}.{self.flavour}.{self.config.tag}"

    def signature(self) -> dict:
        return FAMILIES[self.family].signature(DTYPES[self.dtype].short, self.out.short)

    def divisible_params(self) -> list:
        """Indices (in the kernel's arguments) of the values the `aligned`
        flavour compiles as multiples of 16."""
        if self.flavour != "aligned":
            return []
        family = FAMILIES[self.family]
        return [family.kernel.arg_names.index(p.name) for p in family.params if p.aligned]

    def constexprs(self) -> dict:
        family = FAMILIES[self.family]
        c = self.config
        values = dict(family.layouts[self.layout])
        values.update(USE_TMA=self.flavour == "tma", BM=c.BM, BN=c.BN, BK=c.BK, CHUNK=GROUP_CHUNK,
                      PRECISION=DTYPES[self.dtype].precision)
        if family.dtype_constexpr:
            values["DTYPE"] = DTYPES[self.dtype].triton
        return values

    def describe(self) -> dict:
        return {"key": self.key, "family": self.family, "arch": self.arch, "dtype": self.dtype,
                "out_dtype": self.out.name, "layout": self.layout, "flavour": self.flavour,
                "config": asdict(self.config)}


def all_variants() -> list:
    return [
        Variant(family, arch.arch, dtype.name, layout, flavour, config, out.name)
        for family, desc in FAMILIES.items()
        for arch in ARCHS
        for dtype in map(DTYPES.get, desc.dtypes or DTYPES)
        for out in out_dtypes(family, dtype)
        for layout in desc.layouts
        for flavour in flavours(family, layout, arch)
        for config in configs_for(family, arch, flavour, dtype, out)
    ]
