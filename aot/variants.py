"""The variant space: family (aot/families/) x arch x dtype x layout x flavour
x config.

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


ARCHS = (Arch(80, exact=False, tma=False), Arch(90, exact=True, tma=True))


@dataclass(frozen=True)
class DType:
    name: str  # torch's name
    short: str  # Triton's signature name
    triton: object
    bytes: int


DTYPES = {d.name: d for d in (DType("float16", "fp16", tl.float16, 2),
                              DType("bfloat16", "bf16", tl.bfloat16, 2))}
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


# Heuristic sets, used where no tuned table exists.  sm80 configs keep shared
# memory under 99 KiB so they also load on 8.6 / 8.9.
DEFAULT_CONFIGS = {
    (80, "basic"): (
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
    the family's description lists the layout among its tma_layouts."""
    if arch.tma and layout in FAMILIES[family].tma_layouts:
        return ("basic", "tma")
    return ("basic",)


def configs_for(family: str, arch: int, flavour: str) -> tuple:
    """The tuned table for (arch, family, flavour) if `aot tune` wrote one, else the defaults."""
    table = TUNING_DIR / f"sm{arch}.json"
    if table.exists():
        entries = json.loads(table.read_text()).get(family, {}).get(flavour)
        if entries:
            return tuple(Config(**e) for e in entries)
    return DEFAULT_CONFIGS[(arch, flavour)]


@dataclass(frozen=True)
class Variant:
    family: str
    arch: int
    dtype: str
    layout: str
    flavour: str
    config: Config

    @property
    def key(self) -> str:
        return f"{self.family}.sm{self.arch}.{self.dtype}.{self.layout}.{self.flavour}.{self.config.tag}"

    def signature(self) -> dict:
        return FAMILIES[self.family].signature(DTYPES[self.dtype].short)

    def constexprs(self) -> dict:
        family = FAMILIES[self.family]
        c = self.config
        values = dict(family.layouts[self.layout])
        values.update(USE_TMA=self.flavour == "tma", BM=c.BM, BN=c.BN, BK=c.BK, CHUNK=GROUP_CHUNK)
        if family.dtype_constexpr:
            values["DTYPE"] = DTYPES[self.dtype].triton
        return values

    def describe(self) -> dict:
        return {"key": self.key, "family": self.family, "arch": self.arch, "dtype": self.dtype,
                "layout": self.layout, "flavour": self.flavour, "config": asdict(self.config)}


def all_variants() -> list:
    return [
        Variant(family, arch.arch, dtype, layout, flavour, config)
        for family, desc in FAMILIES.items()
        for arch in ARCHS
        for dtype in DTYPES
        for layout in desc.layouts
        for flavour in flavours(family, layout, arch)
        for config in configs_for(family, arch.arch, flavour)
    ]
