"""The vocabulary of a kernel family description (aot/families/<name>.py).

A family is one Triton kernel and everything the build, the runtime and the
tests need to know about it: its runtime parameters in ABI order, each with a
type and a role; its layouts (constexprs); which layouts have a TMA flavour;
how many tiles a call has (the grid) and how many rows a group typically has
(the tuned-table bucket key).  `make build` generates the runtime's C++ tables
from these descriptions; csrc/ packs arguments by name and checks TMA's
alignment rules from the roles, and names no family.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import expr
from .kernels.ws import EPILOGUE_COLS

# '*T': pointer to the variant's input dtype, '*O': to its output dtype.
TYPES = ("*T", "*O", "*fp32", "*i32", "*i64", "i32", "i64")

# What the runtime does with a parameter of each role.
ROLES = {
    "operand": "pointer to an input the kernel reads (TMA: 16-byte aligned base)",
    "output": "pointer to the output the kernel writes (TMA: 16-byte aligned base)",
    "offsets": "pointer to int32 cumulative group end offsets, read on the GPU",
    "scale": "pointer to float32 scale factors the kernel reads",
    "bias": "pointer to values the epilogue adds, read only where the flag after it is 1",
    "flag": "0 or 1",
    "extent": "a size; must fit the parameter's type",
    "row_length": "a size (elements a row) that the TMA flavour reads in 16-byte copies (TMA: a "
                  "multiple of 16 bytes)",
    "stride": "an element stride (TMA: a positive multiple of 16 bytes)",
    "count": "the number of groups",
    "group_table": "int64 words per group (group_fields), copied to the GPU by the runtime",
    "tile_prefix": "int64 inclusive prefix of the groups' tile counts, made by the runtime",
}


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    role: str
    tma_limit: int = 0  # the TMA flavour needs value <= tma_limit (0: no limit)
    # The `aligned` flavour compiles this value as a multiple of 16 (bytes for a
    # pointer, elements for an int): vectorised loads; the runtime checks it.
    aligned: bool = False

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"parameter {self.name}: type {self.type!r} is not one of {TYPES}")
        if self.role not in ROLES:
            raise ValueError(f"parameter {self.name}: role {self.role!r} is not one of "
                             f"{sorted(ROLES)}")


@dataclass(frozen=True)
class Config:
    """Tile shape and schedule.  `max_rows` bounds the rows per group this config
    is chosen for (the runtime takes the smallest bound that fits; 0 = no bound).
    `ws`: the family's warp-specialised Gluon kernel (Family.ws_kernel): a
    loader warp feeds a num_stages-deep ring to BM / (16 x num_warps) MMA
    partitions of num_warps warps each (aot/kernels/ws.py).  `ctas`: a `ws`
    kernel's program is a cluster of that many CTAs (2: Triton >= 3.8), each
    holding BM / ctas of the tile's rows, B's block multicast to all."""
    BM: int
    BN: int
    BK: int
    num_warps: int
    num_stages: int
    max_rows: int = 0
    ws: bool = False
    ctas: int = 1

    @property
    def tag(self) -> str:
        ws = "_ws" if self.ws else ""
        cluster = f"_c{self.ctas}" if self.ctas > 1 else ""
        return f"{self.BM}x{self.BN}x{self.BK}_w{self.num_warps}_s{self.num_stages}{ws}{cluster}"

    def shared_estimate(self, dtype, out, tma: bool) -> int:
        """Shared memory of the pipeline as Triton 3.6 allocates it (measured),
        what configs are fitted by: TMA pipelines keep num_stages A and B tiles,
        the output tile a TMA store stages (the `ws` kernel at most
        EPILOGUE_COLS columns of it at a time) and, for tf32x3, one more A tile
        (its split into high and low parts); sm80's cp.async pipelines keep
        num_stages - 1 tiles (sm90's non-TMA kernels up to twice that: far
        below its limit; the build refuses any variant over it).  dtype, out:
        aot/variants.py DTypes."""
        rows = self.BM // self.ctas  # a CTA's
        tiles = (rows + self.BN) * self.BK * dtype.bytes
        if not tma:
            return max(self.num_stages - 1, 1) * tiles
        split = rows * self.BK * dtype.bytes if dtype.precision == "tf32x3" else 0
        out_cols = min(self.BN, EPILOGUE_COLS) if self.ws else self.BN
        return self.num_stages * tiles + split + rows * out_cols * out.bytes


@dataclass(frozen=True)
class Family:
    """One kernel family.  Exactly one of `tiles` (a call's tile count, from the
    parameters) and `group_tiles` (one group's, from its group fields; the
    call's is their sum) is given, and likewise `rows` / `group_rows`: rows
    per group for the tuned-table bucket (group_rows: averaged over the groups
    that have tiles).  Expressions are in aot/expr.py's language."""
    name: str
    kernel: object  # a triton.jit function
    params: tuple  # Param, in the kernel's declaration order
    layouts: dict  # layout name -> the layout's constexprs
    tma_layouts: tuple  # layouts that get a `tma` flavour where the arch has TMA
    aligned_layouts: tuple = ()  # layouts that get an `aligned` flavour where the arch has one
    # Layouts compiled only for archs with TMA, the only loads that read them
    # well (the runtime copies such operands elsewhere).
    tma_only_layouts: tuple = ()
    tiles: str = ""
    rows: str = ""
    group_fields: tuple = ()  # Param, in group-table word order
    group_tiles: str = ""
    group_rows: str = ""
    dtype_constexpr: bool = False  # the kernel takes DTYPE (its pointers are untyped)
    # Names of the input dtypes (aot/variants.py) compiled; () = all but the opt-in ones.
    dtypes: tuple = ()
    float32_output: bool = False  # 16-bit inputs may also write a float32 output ('*O')
    out_dtypes: tuple = ()  # output dtype names for every input; () = see float32_output
    archs: tuple = ()  # the archs (80, 90, ...) compiled; () = all of aot/variants.py's
    basic: bool = True  # compile the `basic` flavour (any alignment); False: inputs
    #                     must meet another flavour's rule, which the Python API checks
    # (arch, flavour) or (arch, flavour, layout) -> Configs, in place of
    # aot/variants.py's defaults for GEMMs (the layout's own entry first).
    configs: dict = field(default_factory=dict)
    # A Gluon kernel with `kernel`'s parameters, run by the `ws` configs of the
    # TMA flavour (16-bit and fp8 inputs); None: the family has none.
    ws_kernel: object = None
    # Integer constants the family's operator needs (a scratch size, a limit),
    # emitted into its generated C++ struct (family_args.h) under these names.
    constants: dict = field(default_factory=dict)

    def __post_init__(self):
        self._check_abi()
        self._check_expressions()

    @property
    def has_group_table(self) -> bool:
        return bool(self.group_fields)

    @property
    def takes_clusters(self) -> bool:
        """Whether ws_kernel runs as a cluster of CTAs (it takes CTAS: Config.ctas)."""
        return self.ws_kernel is not None and any(
            p.name == "CTAS" for p in self.ws_kernel.params if p.is_constexpr)

    def runtime_params(self) -> list:
        """The kernel's non-constexpr parameters, in declaration order."""
        return [p.name for p in self.kernel.params if not p.is_constexpr]

    def signature(self, short_dtype: str, short_out: str) -> dict:
        return {p.name: p.type.replace("*T", f"*{short_dtype}").replace("*O", f"*{short_out}")
                for p in self.params}

    def _check_abi(self):
        """The description lists the kernel's parameters by name in order, so a
        swapped pair (two int64 strides, say) fails here, at build time."""
        described = [p.name for p in self.params]
        for kernel in filter(None, (self.kernel, self.ws_kernel)):
            declared = [p.name for p in kernel.params if not p.is_constexpr]
            if described != declared:
                raise ValueError(f"family {self.name}: parameters {described} do not match "
                                 f"{kernel.__name__}'s runtime parameters {declared} (names "
                                 "and order)")
        for name in self.tma_layouts + self.aligned_layouts + self.tma_only_layouts:
            if name not in self.layouts:
                raise ValueError(f"family {self.name}: flavour layout {name!r} is not a layout")
        roles = [p.role for p in self.params]
        if self.has_group_table != ("group_table" in roles):
            raise ValueError(f"family {self.name}: group_fields and a group_table parameter "
                             "go together")

    def _check_expressions(self):
        per_call = bool(self.tiles) and bool(self.rows)
        per_group = bool(self.group_tiles) and bool(self.group_rows)
        if per_call == per_group or per_group != self.has_group_table:
            raise ValueError(f"family {self.name}: give tiles and rows, or (with a group table) "
                             "group_tiles and group_rows")
        names = [p.name for p in (self.group_fields if per_group else self.params)]
        for text in (self.tiles, self.rows, self.group_tiles, self.group_rows):
            if text:
                expr.to_cpp(text, names)  # raises ExprError naming the problem
