"""Turn the family descriptions and the compiled variant records into what the
runtime needs: a JSON manifest (shipped in the wheel for `info()` and the
tests), the C++ tables compiled into the core extension (kernel_table.inc):
archs, dtypes, every Choice's values, every family's parameters with their
roles, its axes and constants, its size expressions as C++ functions, and one
row per variant (its axis values as one code); and what the torch operators
compile against (family_args.h): an enum per Choice and one for the dtypes,
and per family its typed Axes (a variant's code computed from them), its
dtypes, its constants and its argument struct.  Every initializer names its fields (C++20
designated initializers), so a row whose fields do not match csrc/registry.h,
or an operator that leaves out an argument or an axis, does not compile; nor
does an axis given another Choice's value.  Output is deterministic."""
from __future__ import annotations

import json
from pathlib import Path

from . import expr
from .families import FAMILIES
from .axes import Choice
from .variants import ARCHS, DTYPES, FLAVOURS, compiled_dtypes

KINDS = {"i32": "i", "i64": "l"}  # anything else is a pointer, 'p'
RULE_ENUMS = {"tma": "Rule::kTma", "aligned": "Rule::kAligned", "none": "Rule::kNone"}
ROLE_ENUMS = {"operand": "kOperand", "output": "kOutput", "offsets": "kOffsets", "scale": "kScale",
              "bias": "kBias", "flag": "kFlag", "choice": "kChoice", "extent": "kExtent",
              "row_length": "kRowLength", "stride": "kStride", "count": "kCount",
              "group_table": "kGroupTable", "tile_prefix": "kTilePrefix"}


def param_kind(type_: str) -> str:
    return KINDS.get(type_, "p")


def _init(**fields) -> str:
    return "{" + ", ".join(f".{name} = {value}" for name, value in fields.items()) + "}"


def _string(text: str) -> str:
    return json.dumps(text)  # a valid C++ literal for the ASCII names used here


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _params_array(name: str, params) -> list:
    rows = [_init(name=_string(p.name), kind=f"'{param_kind(p.type)}'",
                  role=f"Role::{ROLE_ENUMS[p.role]}", tma_limit=p.tma_limit,
                  aligned=_bool(p.aligned)) for p in params]
    return [f"const ParamInfo {name}[] = {{", *(f"    {r}," for r in rows), "};"]


def _size_function(name: str, text: str, params) -> list:
    body = expr.to_cpp(text, [p.name for p in params])
    return [f"int64_t {name}([[maybe_unused]] const int64_t* v, "
            "[[maybe_unused]] const KernelInfo& k) {", f"  return {body};", "}"]


def _axes_arrays(prefix: str, family) -> list:
    """Each axis' value names, then the axes (registry.h AxisInfo)."""
    if not family.axes:
        return []
    lines = [f"const char* const {prefix}_{axis.name}[] = {{"
             + ", ".join(map(_string, axis.choice.values)) + "};" for axis in family.axes]
    rows = [_init(name=_string(axis.name), values=f"{prefix}_{axis.name}",
                  value_count=len(axis.choice.values)) for axis in family.axes]
    return lines + [f"const AxisInfo {prefix}_axes[] = {{", *(f"    {r}," for r in rows), "};"]


def _constants_array(prefix: str, family) -> list:
    if not family.constants:
        return []
    rows = [_init(name=_string(name), value=value) for name, value in family.constants.items()]
    return [f"const ConstantInfo {prefix}_constants[] = {{", *(f"    {r}," for r in rows), "};"]


def _choices_arrays() -> list:
    """Every Choice's value names (registry.h ChoiceInfo): the vocabulary the
    Python layer checks str arguments against before the operators parse them."""
    lines = [f"const char* const kChoice{c.name}[] = {{" + ", ".join(map(_string, c.values))
             + "};" for c in choices()]
    rows = [_init(name=_string(c.name), values=f"kChoice{c.name}", value_count=len(c.values))
            for c in choices()]
    return lines + ["const ChoiceInfo kChoices[] = {", *(f"    {r}," for r in rows), "};"]


def _family_lines(index: int, family) -> tuple:
    """(definitions, initializer) for one family."""
    prefix = f"k{index}_{family.name}"
    fields = family.group_fields if family.has_group_table else family.params
    lines = _params_array(f"{prefix}_params", family.params)
    if family.has_group_table:
        lines += _params_array(f"{prefix}_group_fields", family.group_fields)
    lines += _axes_arrays(prefix, family) + _constants_array(prefix, family)
    lines += _size_function(f"{prefix}_tiles", family.group_tiles or family.tiles, fields)
    lines += _size_function(f"{prefix}_rows", family.group_rows or family.rows, fields)
    conditions = [f"{prefix}_when_{name}" for name in family.conditions]
    for function, text in zip(conditions, family.conditions.values()):
        lines += _size_function(function, text, fields)
    if conditions:
        lines += [f"const SizeFn {prefix}_conditions[] = {{{', '.join(conditions)}}};"]
    initializer = _init(
        name=_string(family.name),
        params=f"{prefix}_params", param_count=len(family.params),
        group_fields=f"{prefix}_group_fields" if family.has_group_table else "nullptr",
        group_field_count=len(family.group_fields),
        axes=f"{prefix}_axes" if family.axes else "nullptr", axis_count=len(family.axes),
        constants=f"{prefix}_constants" if family.constants else "nullptr",
        constant_count=len(family.constants),
        tiles=f"{prefix}_tiles", rows=f"{prefix}_rows",
        conditions=f"{prefix}_conditions" if conditions else "nullptr",
        condition_count=len(conditions))
    return lines, initializer


def axes_code(record: dict) -> int:
    """The code of a manifest record's axis values (registry.h KernelInfo::axes)."""
    family = FAMILIES[record["family"]]
    return family.code(tuple(record["axes"][name] for name in family.axis_names))


def table_entry(r: dict, family_index: dict, dtype_index: dict) -> str:
    c = r["config"]
    return "    " + _init(
        key=_string(r["key"]), cubin=_string(r["cubin"]), ptx=_string(r["ptx"]),
        kernel_name=_string(r["kernel_name"]),
        family=family_index[r["family"]], arch=r["arch"], dtype=dtype_index[r["dtype"]],
        out_dtype=dtype_index[r["out_dtype"]], axes=axes_code(r),
        flavour=list(FLAVOURS).index(r["flavour"]),
        block_m=c["BM"], block_n=c["BN"], block_k=c["BK"], max_rows=c["max_rows"],
        num_warps=r["num_warps"], num_ctas=r["num_ctas"], shared=r["shared"],
        scratch_size=r["scratch_size"], scratch_align=r["scratch_align"],
        when=when_index(r)) + ","


def when_index(record: dict) -> int:
    """The index into its family's conditions of the one a manifest record's
    config needs (registry.h KernelInfo::when), -1 for none."""
    when = record["config"].get("when", "")
    return list(FAMILIES[record["family"]].conditions).index(when) if when else -1


def kernel_table_source(records: list, triton_version: str) -> str:
    family_index = {name: i for i, name in enumerate(FAMILIES)}
    dtype_index = {name: i for i, name in enumerate(DTYPES)}
    lines = [
        "// Generated by `python -m aot build` from aot/families/ and the compiled",
        "// variants; do not edit.  Types are declared in csrc/registry.h.",
        f"#define GG_TRITON_VERSION {_string(triton_version)}",
        "const ArchInfo kArchs[] = {",
        *(f"    {_init(arch=a.arch, exact=_bool(a.exact), ptx=_bool(a.ptx))}," for a in ARCHS),
        "};",
        "const FlavourInfo kFlavours[] = {",
        *(f"    {_init(name=_string(f), rule=RULE_ENUMS[rule])}," for f, rule in FLAVOURS.items()),
        "};",
        "const DTypeInfo kDTypes[] = {",
        *(f"    {_init(name=_string(d.name), bytes=d.bytes)}," for d in DTYPES.values()), "};",
        *_choices_arrays(),
    ]
    initializers = []
    for index, family in enumerate(FAMILIES.values()):
        definitions, initializer = _family_lines(index, family)
        lines += definitions
        initializers.append(f"    {initializer},")
    lines += ["const FamilyInfo kFamilies[] = {", *initializers, "};"]
    lines += ["const KernelInfo kKernelTable[] = {",
              *(table_entry(r, family_index, dtype_index) for r in records), "};"]
    return "\n".join(lines) + "\n"


def _struct_name(family_name: str) -> str:
    return "".join(part.capitalize() for part in family_name.split("_"))


def _fields(params) -> list:
    return [f"  int64_t {p.name};  // {p.type}, {p.role}" for p in params]


DTYPE = Choice("DType", tuple(DTYPES))  # the runtime's dtypes, in its table's order


def choices() -> list:
    """Every Choice an axis or a parameter takes, once, by name; a name given
    two value sets is refused."""
    found = {}
    for family in FAMILIES.values():
        taken = [axis.choice for axis in family.axes] + [p.choice for p in family.params
                                                         if p.choice is not None]
        for choice in taken:
            known = found.setdefault(choice.name, choice)
            if known != choice:
                raise ValueError(f"choice {known.name} has values {known.values} and, in "
                                 f"family {family.name}, {choice.values}")
    return [found[name] for name in sorted(found)]


# What every Choice enum has: its value names, name() and parse() (for values
# that arrive as strings: the operators' str arguments).
CHOICE_TEMPLATES = """\
// A Choice's value names, in its enumerators' order (specialised below for each).
template <typename Choice>
struct Names;
template <typename Choice>
constexpr std::string_view name(Choice value) {
  return Names<Choice>::kValues[static_cast<size_t>(value)];
}
// What a kernel parameter of a Choice (role "choice") carries: the value's index.
template <typename Choice>
constexpr int64_t choice_code(Choice value) {
  return static_cast<int64_t>(value);
}
template <typename Choice>
constexpr std::optional<Choice> parse(std::string_view text) {
  const auto& values = Names<Choice>::kValues;
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] == text) return static_cast<Choice>(i);
  }
  return std::nullopt;
}"""


def _choice_enum(choice: Choice) -> list:
    values = ", ".join(map(_string, choice.values))
    return [f"enum class {choice.name} : int {{ "
            + ", ".join(map(choice.enumerator, choice.values)) + " };",
            f"template <> struct Names<{choice.name}> {{",
            f"  static constexpr std::array<std::string_view, {len(choice.values)}> kValues{{"
            f"{values}}};", "};"]


def _dtype_array(name: str, dtypes) -> str:
    return (f"  static constexpr std::array<DType, {len(dtypes)}> {name}{{"
            + ", ".join(f"DType::{DTYPE.enumerator(d)}" for d in dtypes) + "};")


def _axes_lines(family) -> list:
    """The family's Axes struct and code(): its axis values as the mixed-radix
    number of Family.code, the first axis the most significant digit."""
    fields = [f"{axis.choice.name} {axis.name};" for axis in family.axes]
    code = "0"
    for axis in family.axes:
        digit = f"static_cast<int>(axes.{axis.name})"
        code = digit if code == "0" else f"({code}) * {len(axis.choice.values)} + {digit}"
    unused = "" if family.axes else "[[maybe_unused]] "
    return [f"  struct Axes {{ {' '.join(fields)} }};" if fields else "  struct Axes {};",
            f"  static constexpr int code({unused}const Axes& axes) {{ return {code}; }}"]


def _family_struct(index: int, family) -> list:
    """One family's typed axes, its input dtypes (kDTypes; kOutDTypes where it
    names its outputs'), its constants and its arguments: the parameters its
    caller gives, in ABI order, and abi(), every parameter in ABI order (those
    the runtime fills as 0).  A group-table family gives a Group struct of its
    per-group words instead."""
    name = _struct_name(family.name)
    lines = [f"struct {name} {{", f"  static constexpr int kIndex = {index};",
             f"  static constexpr const char* kName = {_string(family.name)};",
             f"  static constexpr size_t kParamCount = {len(family.params)};",
             *_axes_lines(family),
             _dtype_array("kDTypes", compiled_dtypes(family.name)),
             *([_dtype_array("kOutDTypes", family.out_dtypes)] if family.out_dtypes else []),
             *(f"  static constexpr int64_t {name} = {value};"
               for name, value in family.constants.items())]
    if family.has_group_table:
        words = ", ".join(p.name for p in family.group_fields)
        lines += ["  struct Group {", *("  " + f for f in _fields(family.group_fields)),
                  f"    void append_to(std::vector<int64_t>& table) const {{ "
                  f"table.insert(table.end(), {{{words}}}); }}",
                  "  };", f"  static constexpr size_t kGroupWidth = {len(family.group_fields)};",
                  "  std::vector<int64_t> abi() const {",
                  "    return std::vector<int64_t>(kParamCount, 0);  // the runtime fills them",
                  "  }"]
    else:
        values = ", ".join(p.name for p in family.params)
        lines += [*_fields(family.params),
                  f"  std::vector<int64_t> abi() const {{ return {{{values}}}; }}"]
    return lines + ["};"]


def family_args_source() -> str:
    lines = ["// Generated by `python -m aot build` from aot/families/; do not edit.",
             "// The Choices the families' axes take, the runtime's dtypes, and each kernel",
             "// family's typed axes, dtypes, constants and arguments, as structs the torch",
             "// operators fill with designated initializers (csrc/ops/); its index in the",
             "// kernel table.",
             "#pragma once", "#include <array>", "#include <cstddef>", "#include <cstdint>",
             "#include <optional>", "#include <string_view>", "#include <vector>",
             "namespace gg::family {", CHOICE_TEMPLATES]
    for choice in [*choices(), DTYPE]:
        lines += _choice_enum(choice)
    for index, family in enumerate(FAMILIES.values()):
        lines += _family_struct(index, family)
    lines += ["// Every family in index order: the runtime's table must agree (checked at import).",
              "struct Key { const char* name; size_t param_count; };",
              "inline constexpr Key kAll[] = {",
              *(f"    {{{_string(f.name)}, {len(f.params)}}}," for f in FAMILIES.values()), "};"]
    return "\n".join(lines + ["}  // namespace gg::family"]) + "\n"


def write_outputs(records: list, out_dir: Path, triton_version: str, partial: bool,
                  sources_sha256: str) -> None:
    """The manifest (sources_sha256: aot.sources' digest of the sources compiled),
    the kernel table and the argument structs."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"triton_version": triton_version, "variants": records, "partial": partial,
                "sources_sha256": sources_sha256}
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    (out_dir / "kernel_table.inc").write_text(kernel_table_source(records, triton_version))
    (out_dir / "family_args.h").write_text(family_args_source())
