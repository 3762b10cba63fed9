"""Build-time tests (need Triton, no GPU): the compiler, the manifest it wrote
for the wheel, and the ABI the launcher relies on."""
import json
import re
import struct
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from aot import codegen, expr
from aot.axes import ACTIVATION, GATE_UP
from aot.compile import (TWIN_FIELDS, CompileError, compile_all, compile_variant,
                         ptx_entry_params, sm80_twin)
from aot.families import FAMILIES
from aot.families.ragged_m import FAMILY as RAGGED_M
from aot.family import NO_AXES_KEY, Family, Param
from aot.variants import DTYPES, Arch, Config, Variant, all_variants

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "build" / "aot" / "kernels"
PTX_TYPES = {"p": ".u64", "l": ".u64", "i": ".u32"}


def ptx_types(params) -> list:
    """The .entry parameter types a parameter list compiles to: one per
    parameter in order, then Triton's global and profile scratch pointers."""
    return [PTX_TYPES[codegen.param_kind(kind)] for _, kind, _ in params] + [".u64", ".u64"]


def cubin_arch(cubin: bytes) -> int:
    """SM version from a CUDA ELF header's e_flags (0x50 = sm_80, 0x5a = sm_90a): its low
    byte up to ELF ABI version 7, the byte above from version 8 (ptxas 12.9's sm_90a
    cubins, Triton 3.9's)."""
    assert cubin[:4] == b"\x7fELF"
    (e_flags,) = struct.unpack_from("<I", cubin, 0x30)
    abi_version = cubin[8]
    return (e_flags >> 8 if abi_version >= 8 else e_flags) & 0xFF


@pytest.fixture(scope="module")
def manifest():
    path = KERNELS / "manifest.json"
    if not path.exists():
        pytest.fail(f"{path} missing: run `make build` first")
    return json.loads(path.read_text())


@pytest.mark.parametrize("arch", [80, 90])
def test_compile_one_variant_per_arch(arch):
    variant = next(v for v in all_variants() if v.arch == arch and v.family == "ragged_m")
    compiled = compile_variant(variant)
    assert cubin_arch(compiled.cubin) == arch
    assert f".target sm_{arch}" in compiled.ptx
    assert ptx_entry_params(compiled.ptx) == ptx_types(compiled.record["params"])


def test_a_later_archs_twin_is_assembled_from_sm80s_ptx(tmp_path):
    """A variant of an sm80_ptx family whose sm80 twin is compiled beside it is
    ptxas's code for its arch from the twin's PTX: the same kernel (the twin's
    record fields), an sm90 cubin, no PTX of its own."""
    sm90 = next(v for v in all_variants() if v.arch == 90 and v.family == "swiglu")
    twin = sm80_twin(sm90)
    sm80, assembled = compile_all([twin, sm90], tmp_path, jobs=1)
    assert twin.key == sm80["key"] and sm90.key == assembled["key"]
    assert {f: assembled[f] for f in TWIN_FIELDS} == {f: sm80[f] for f in TWIN_FIELDS}
    assert cubin_arch((tmp_path / assembled["cubin"]).read_bytes()) == 90
    assert assembled["ptx"] == "" and sm80["ptx"]
    assert sm80_twin(next(v for v in all_variants() if v.family == "ragged_m"
                          and v.arch == 90)) is None  # its sm90 kernels use sm90's MMAs


def test_aligned_variant_loads_16_bytes_at_a_time():
    """The aligned flavour's divisibility hints turn the masked scalar loads of
    basic into 16-byte cp.async copies."""
    key = "ragged_m.sm80.bfloat16.row-column-row.{}.64x64x32_w4_s4"
    ptx = {f: (KERNELS / f"{key.format(f)}.ptx").read_text() for f in ("basic", "aligned")}
    assert "cp.async.cg.shared.global" in ptx["aligned"] and "0x10" in ptx["aligned"]
    assert "cp.async.cg.shared.global" not in ptx["basic"]


def test_tma_variant_compiled_on_what_the_runtime_checks():
    """A TMA variant compiles as multiples what csrc/run.cc's TMA rule checks
    of every call it launches: operand and output bases 16-byte aligned,
    strides and row lengths whole 16 bytes of the narrower element type
    (bfloat16 here: 8 elements), nothing of scales and extents; with the
    kernel's own hints from the operator's fp8 rules (H, I and the weights'
    strides multiples of 16), the split decode forward reads w2's rows in
    vectors.  A family with a group table gets none: the rule checks its
    groups' fields, not its arguments."""
    split = next(v for v in all_variants() if v.family == "scaled_decode_split"
                 and v.flavour == "tma")
    names = FAMILIES[split.family].kernel.arg_names
    assert {names[i]: d for i, d in split.divisible_params().items()} == {
        **dict.fromkeys(("x_ptr", "xq_ptr", "ids_ptr", "w13_ptr", "w2_ptr", "gu_ptr", "h_ptr",
                         "h_scale_ptr", "counters_ptr", "out_ptr"), 16),
        **dict.fromkeys(("H", "N", "w13_group_stride", "ld13", "w2_group_stride", "ld2"), 8)}
    ptx = (KERNELS / f"{split.key}.ptx").read_text()
    assert re.search(r"ld\.global(\.[a-z0-9]+)*\.v[24]\.b32", ptx)
    grouped = next(v for v in all_variants() if v.family == "grouped_gemm"
                   and v.flavour == "tma")
    assert grouped.divisible_params() == {}


def test_tma_variant_uses_wgmma_and_scratch():
    variant = next(v for v in all_variants() if v.flavour == "tma" and v.family == "ragged_m")
    compiled = compile_variant(variant)
    assert "wgmma" in compiled.ptx
    assert compiled.record["scratch_size"] > 0 and compiled.record["scratch_align"] >= 64


def test_compile_error_names_the_variant():
    good = next(v for v in all_variants() if v.arch == 80)
    broken = replace(good, config=Config(48, 64, 32, 4, 2))  # 48 is not a power of two
    with pytest.raises(CompileError, match=broken.key.replace(".", r"\.")):
        compile_variant(broken)


def test_manifest_lists_every_variant(manifest):
    keys = [r["key"] for r in manifest["variants"]]
    assert keys == [v.key for v in all_variants()]
    assert len(set(keys)) == len(keys)
    import triton
    assert manifest["triton_version"] == triton.__version__


def test_register_caps_hold(manifest):
    """A config's max_registers, else its family's, is what ptxas compiled its
    kernel to (the warp-specialised configs take ws.max_registers instead)."""
    def cap(record):
        return record["config"]["max_registers"] or FAMILIES[record["family"]].max_registers
    capped = [r for r in manifest["variants"] if cap(r) and not r["config"]["ws"]]
    # quantize_fp8_columns caps its family, w4_decode_glu one config
    assert {r["family"] for r in capped} >= {"quantize_fp8_columns", "w4_decode_glu"}
    for record in capped:
        assert record["registers"] <= cap(record), record["key"]


def test_manifest_abi_matches_ptx_and_family(manifest):
    """Every variant's parameter list, in order: the description's names and
    roles, the kernel's declared names, and the PTX .entry types."""
    for record in manifest["variants"]:
        family = FAMILIES[record["family"]]
        assert [(name, role) for name, _, role in record["params"]] == \
            [(p.name, p.role) for p in family.params]
        assert [name for name, _, _ in record["params"]] == family.runtime_params()
        ptx = (KERNELS / f"{record['key']}.ptx").read_text()
        assert ptx_entry_params(ptx) == ptx_types(record["params"]), record["key"]
        assert f".entry {record['kernel_name']}(" in ptx


def test_swapped_parameters_in_a_description_are_refused():
    """lda and ldb are both int64 strides: swapping them changes no type, so
    only the names can catch it, when the description is made."""
    params = list(RAGGED_M.params)
    i, j = [p.name for p in params].index("lda"), [p.name for p in params].index("ldb")
    params[i], params[j] = params[j], params[i]
    with pytest.raises(ValueError, match="do not match .*'s runtime parameters"):
        Family(name="swapped", kernel=RAGGED_M.kernel, params=tuple(params),
               axes=RAGGED_M.axes, constexprs=RAGGED_M.constexprs, tma=RAGGED_M.tma,
               tiles=RAGGED_M.tiles, rows=RAGGED_M.rows)


def test_description_needs_known_roles_and_names_in_expressions():
    with pytest.raises(ValueError, match="role 'pointer'"):
        Param("a_ptr", "*T", "pointer")
    with pytest.raises(expr.ExprError, match="unknown name 'rows'"):
        Family(name="bad", kernel=RAGGED_M.kernel, params=RAGGED_M.params,
               axes=RAGGED_M.axes, constexprs=RAGGED_M.constexprs, tiles="rows * 2", rows="T")


def test_a_choice_parameter_names_its_choice():
    with pytest.raises(ValueError, match="the role 'choice' goes with a Choice"):
        Param("activation", "i32", "choice")
    with pytest.raises(ValueError, match="the role 'choice' goes with a Choice"):
        Param("activation", "i64", "choice", choice=ACTIVATION)
    with pytest.raises(ValueError, match="the role 'choice' goes with a Choice"):
        Param("flag", "i32", "flag", choice=ACTIVATION)


def test_the_activation_is_a_run_time_choice_in_every_family():
    """One way to bind it: an `activation` parameter of the Activation
    Choice, never an axis (which would compile each form apart)."""
    with_activation = [f.name for f in FAMILIES.values()
                       if any(p.name == "activation" for p in f.params)]
    assert {"swiglu", "swiglu_backward_fp8", "ragged_glu", "w4_glu"} <= set(with_activation)
    for family in FAMILIES.values():
        assert all(axis.choice != ACTIVATION for axis in family.axes), family.name
        for p in family.params:
            if p.name == "activation":
                assert (p.role, p.choice, p.type) == ("choice", ACTIVATION, "i32"), family.name
            assert p.choice is None or p.role == "choice"


def test_every_choice_reaches_the_runtime_once():
    """The kernel table lists every Choice an axis or a parameter takes (the
    Python layer's vocabulary, _C.choices()), each value in code order."""
    found = {c.name: c for c in codegen.choices()}
    assert found["Activation"] == ACTIVATION and found["GateUp"] == GATE_UP
    assert [ACTIVATION.code(v) for v in ACTIVATION.values] == [0, 1]
    lines = codegen._choices_arrays()
    assert 'const char* const kChoiceActivation[] = {"swiglu", "gpt_oss"};' in lines
    assert sum(line.strip().startswith("{.name =") for line in lines) == len(found)


@pytest.mark.parametrize("text", [
    "0 if T == 0 else (cdiv(T, BM) + G + 1) * cdiv(N, BN)", "T // max(G, 1)",
    "min(T, N) - 1 if T > 3 and N >= 2 or G != 0 else 7"])
def test_size_expressions_mean_the_same_in_python_and_cpp(text, tmp_path):
    """The C++ the runtime compiles computes what `aot tune` evaluates."""
    names = ["T", "N", "G"]
    cases = [(0, 5, 3), (1000, 4096, 8), (17, 1, 0), (5, 300, 2)]
    tile = {"BM": 128, "BN": 64, "BK": 32}
    source = tmp_path / "e.cc"
    source.write_text(
        "#include <algorithm>\n#include <cstdint>\n#include <cstdio>\n"
        "struct KernelInfo { int block_m, block_n, block_k; };\n"
        "int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }\n"
        "int main() { KernelInfo k{128, 64, 32};\n"
        + "".join(f"{{ int64_t v[] = {{{', '.join(map(str, c))}}}; "
                  f"std::printf(\"%lld\\n\", (long long)({expr.to_cpp(text, names)})); }}\n"
                  for c in cases) + "}\n")
    subprocess.run(["g++", "-std=c++20", "-o", str(tmp_path / "e"), str(source)], check=True)
    got = subprocess.run([str(tmp_path / "e")], capture_output=True, text=True, check=True)
    want = [expr.evaluate(text, {**dict(zip(names, c)), **tile}) for c in cases]
    assert [int(x) for x in got.stdout.split()] == want


def test_cubins_match_manifest(manifest):
    import hashlib
    for record in manifest["variants"]:
        cubin = (KERNELS / record["cubin"]).read_bytes()
        assert hashlib.sha256(cubin).hexdigest() == record["cubin_sha256"]
        assert cubin_arch(cubin) == record["arch"], record["key"]
        assert record["num_ctas"] == record["config"].get("ctas", 1), record["key"]
        assert record["shared"] <= Arch.of(record["arch"]).shared_ceiling, record["key"]
        assert 0 < record["registers"] <= 255 and record["stack"] >= 0, record["key"]
        assert bool(record["ptx"]) == Arch.of(record["arch"]).ptx
        if record["ptx"]:
            assert f".target sm_{record['arch']}" in (KERNELS / record["ptx"]).read_text()
        if record["arch"] == 80:
            assert record["flavour"] in ("basic", "aligned")


def test_no_variant_spills_on_few_registers(manifest):
    """ptxas's fallback where a tile's fragments cannot fit in 255 registers a
    thread: a few dozen registers and KBs of stack, two orders of magnitude
    slower (sm80's 128 x 128 tiles of 4 warps did).  The configs are fitted
    so that none does (aot/variants.py _fitted)."""
    fallen = [(r["key"], r["registers"], r["stack"]) for r in manifest["variants"]
              if r["stack"] and r["registers"] < 64]
    assert not fallen, fallen


def test_kernel_table_is_deterministic(manifest, tmp_path):
    codegen.write_outputs(manifest["variants"], tmp_path, manifest["triton_version"],
                          partial=False, sources_sha256=manifest["sources_sha256"])
    assert (tmp_path / "kernel_table.inc").read_text() == (KERNELS / "kernel_table.inc").read_text()
    table = (tmp_path / "kernel_table.inc").read_text()
    assert table.count("\n    {.key = ") == len(manifest["variants"])


def test_kernel_table_rows_carry_each_variants_axis_code(manifest):
    """A row's code is its axis values' index among the family's combinations
    (Family.code, a mixed-radix number, the first axis most significant), one
    code per combination."""
    table = (KERNELS / "kernel_table.inc").read_text()
    for record in manifest["variants"]:
        family = FAMILIES[record["family"]]
        values = family.ordered(record["axes"])
        code = codegen.axes_code(record)
        assert code == family.axis_values().index(values), record["key"]
        assert f'{{.key = "{record["key"]}", ' in table
        assert f".axes = {code}, " in table.split(f'"{record["key"]}"', 1)[1].split("\n", 1)[0]
    for family in FAMILIES.values():
        codes = [family.code(values) for values in family.axis_values()]
        assert codes == list(range(len(codes))), family.name


def test_kernel_table_rows_carry_the_condition_their_config_needs(manifest):
    """A row's `when` is the index among its family's conditions of the one its
    config needs (-1: none), and the family lists a function per condition."""
    table = (KERNELS / "kernel_table.inc").read_text()
    needing = [r for r in manifest["variants"] if r["config"].get("when")]
    assert needing  # scaled_ragged_glu's warp-specialised kernel needs whole_halves or odd_halves
    for record in manifest["variants"]:
        family = FAMILIES[record["family"]]
        when = record["config"].get("when", "")
        index = list(family.conditions).index(when) if when else -1
        row = table.split(f'"{record["key"]}"', 1)[1].split("\n", 1)[0]
        assert row.endswith(f".when = {index}}},"), record["key"]
    for i, family in enumerate(FAMILIES.values()):
        count = f".condition_count = {len(family.conditions)}}}"
        assert count in table.split(f'{{.name = "{family.name}", ', 1)[1].split("\n", 1)[0]
        for name in family.conditions:
            assert f"k{i}_{family.name}_when_{name}(" in table


def test_a_config_needs_a_condition_its_family_declares():
    """Config.when names one of Family.conditions, which are on a call's
    parameters (no tile sizes), in the size expressions' language."""
    family = FAMILIES["scaled_ragged_glu"]
    assert family.conditions == {"whole_halves": "N // 2 == cdiv(N // 2, 128) * 128",
                                 "odd_halves": "cdiv(N // 2, 128) * 128 - N // 2 == 64"}
    needs = Config(128, 256, 128, 4, 3, ws=True, when="aligned_rows")
    with pytest.raises(ValueError, match="needs condition 'aligned_rows'"):
        replace(family, configs={(90, "tma"): (needs, )})
    with pytest.raises(ValueError, match="names a tile size"):
        replace(family, conditions={"whole_tiles": "N == cdiv(N, BN) * BN"})
    with pytest.raises(expr.ExprError):
        replace(family, conditions={"unknown": "Q == 1"})
    for inter, holds in {256: "whole_halves", 320: "odd_halves", 208: None}.items():
        for name, text in family.conditions.items():
            assert bool(expr.evaluate(text, {"N": 2 * inter})) == (name == holds)
    with pytest.raises(ValueError, match="when_constexprs"):
        replace(family, when_constexprs={"unknown": {"BLOCK_COLUMNS": 64}})
    with pytest.raises(ValueError, match="when_constexprs"):
        replace(family, when_constexprs={"odd_halves": {"NOT_A_PARAM": 64}})


def test_a_config_for_a_condition_compiles_that_conditions_constexprs():
    """Family.when_constexprs: scaled_ragged_glu's kernels for odd halves scale
    64-column blocks, the others the kernel's default."""
    widths = {v.config.when: v.constexprs().get("BLOCK_COLUMNS") for v in all_variants()
              if v.family == "scaled_ragged_glu" and v.config.ws}
    assert widths == {"": None, "whole_halves": None, "odd_halves": 64}


def compile_against_family_args(tmp_path, body: str) -> subprocess.CompletedProcess:
    """g++ -fsyntax-only of `body` after the generated family_args.h, with the
    operators' flags for designated initializers."""
    (tmp_path / "family_args.h").write_text(codegen.family_args_source())
    source = tmp_path / "snippet.cc"
    source.write_text("#include \"family_args.h\"\nusing namespace gg::family;\n" + body)
    return subprocess.run(["g++", "-std=c++20", "-fsyntax-only", "-Wall",
                           "-Werror=missing-field-initializers", str(source)],
                          capture_output=True, text=True)


def cpp_axes(family, values: tuple) -> str:
    fields = ", ".join(f".{axis.name} = {axis.choice.name}::{axis.choice.enumerator(value)}"
                       for axis, value in zip(family.axes, values))
    return f"{codegen._struct_name(family.name)}::Axes{{{fields}}}"


def test_generated_axes_give_the_tables_codes_and_parse_names(tmp_path):
    """Every family's typed Axes computes the code Python gives the table
    (checked at compile time), and parse<Choice> reads the value names."""
    asserts = [f"static_assert({codegen._struct_name(f.name)}::code({cpp_axes(f, values)}) == "
               f"{f.code(values)});" for f in FAMILIES.values() for values in f.axis_values()]
    asserts += ['static_assert(parse<GateUp>("interleaved") == GateUp::kInterleaved);',
                'static_assert(!parse<GateUp>("split").has_value());',
                'static_assert(name(Granularity::k1x128) == "1x128");',
                'static_assert(name(DType::kTf32) == "tf32");']
    result = compile_against_family_args(tmp_path, "\n".join(asserts) + "\n")
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("axes, error", [
    ("{.b_major = Major::kRow, .gate_up = Major::kColumn}", "cannot convert"),  # another Choice's
    ("{.b_major = 1, .gate_up = GateUp::kInterleaved}", "cannot convert"),  # a number
    ("{.b_major = Major::kRow}", "missing initializer"),  # an axis left out
    ("{.b_major = Major::kRow, .gate_up = GateUp::kInterleaved, .activation = 0}",
     "no non-static data member"),  # an axis the family does not have
])
def test_a_wrong_axis_value_does_not_compile(tmp_path, axes, error):
    good = compile_against_family_args(
        tmp_path, "constexpr RaggedGlu::Axes ok{.b_major = Major::kRow, "
                  ".gate_up = GateUp::kInterleaved};\n")
    assert good.returncode == 0, good.stderr[-3000:]
    bad = compile_against_family_args(tmp_path, f"constexpr RaggedGlu::Axes wrong{axes};\n")
    assert bad.returncode != 0 and error in bad.stderr, bad.stderr[-3000:]


def test_variant_keys_describe_themselves():
    for v in all_variants():
        types = v.dtype if v.out.name == DTYPES[v.dtype].storage else f"{v.dtype}-{v.out.name}"
        axes = "-".join(v.axes) or NO_AXES_KEY
        assert v.key.startswith(f"{v.family}.sm{v.arch}.{types}.{axes}.{v.flavour}.")
        assert v.describe()["axes"] == dict(zip(FAMILIES[v.family].axis_names, v.axes))
        assert v.flavour != "tma" or v.arch == 90
        assert isinstance(v, Variant)


def test_wheel_tag_is_manylinux_and_auditwheel_agrees():
    """make build retags the wheel from the glibc its extensions need; where
    auditwheel is installed (the build environment `make build` creates) its
    symbol versions must give exactly that tag, and the only libraries outside
    the manylinux policy must be torch's own (gg_runtime._ops's, which the
    torch dependency provides)."""
    import importlib.util
    import json
    import subprocess
    import sys
    from aot.manylinux import TORCH_LIBRARIES
    wheels = sorted((ROOT / "dist").glob("gg_runtime-*.whl"))
    assert len(wheels) == 1, wheels
    tag = wheels[0].name.rsplit("-", 1)[1].removesuffix(".whl")
    assert tag.startswith("manylinux_2_") and tag.endswith("_x86_64"), tag
    if importlib.util.find_spec("auditwheel") is None:
        pytest.skip("auditwheel is not installed here")
    out = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheels[0])],
                         capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    assert report["sym_tag"] == tag, report
    assert set(report["external_libs"]) <= TORCH_LIBRARIES, report["external_libs"]


def test_every_sm80_choice_loads_on_99_kib_devices(manifest):
    """8.6 / 8.9 allow 99 KiB a block: each sm80 (family, dtype, output,
    axis values, flavour) keeps an unbounded-rows config within it, beside any
    larger one that only 8.0 (and the PTX path on 9.0) loads."""
    limit = Arch.of(80).shared_limit
    choices = {}
    for r in manifest["variants"]:
        if r["arch"] == 80:
            key = (r["family"], r["dtype"], r["out_dtype"], tuple(r["axes"].items()), r["flavour"])
            fits = r["shared"] <= limit and r["config"]["max_rows"] == 0
            choices[key] = choices.get(key, False) or fits
    assert choices and all(choices.values()), [k for k, ok in choices.items() if not ok]


def test_shared_estimate_covers_what_triton_allocates(manifest):
    """Configs are fitted by the estimate: it must not undercount where a
    limit binds (TMA variants and sm80's cp.async pipelines)."""
    for r in manifest["variants"]:
        if r["flavour"] == "tma" or r["arch"] == 80:
            config, family = Config(**r["config"]), FAMILIES[r["family"]]
            staged = (config.ws and family.staged(r["axes"])) or r["out_dtype"]
            estimate = config.shared_estimate(DTYPES[r["dtype"]], DTYPES[staged],
                                              r["flavour"] == "tma", family.ring_scales,
                                              DTYPES.get(family.weights), family.weight_rows)
            assert r["shared"] <= estimate + 1024, (r["key"], r["shared"], estimate)


def test_fp8_variants_are_opt_in_and_sm90_tma_only():
    fp8 = [v for v in all_variants() if v.dtype == "float8_e4m3fn"]
    assert {v.family for v in fp8} == {"scaled_ragged_m", "scaled_ragged_glu", "scaled_ragged_k"}
    assert {(v.arch, v.flavour) for v in fp8} == {(90, "tma")}
    # The decode kernels read fp8 weights beside the 16-bit tokens they quantize.
    decode = [v for v in all_variants() if v.family == "scaled_experts_decode"]
    assert {v.dtype for v in decode} == {"bfloat16", "float16"}
    assert {(v.arch, v.flavour, v.out.name) for v in decode} == {(90, "tma", "float32")}
    scaled = [v for v in fp8 if v.family == "scaled_ragged_m"]
    assert {v.out.name for v in scaled} == {"bfloat16", "float32"}
    assert {v.axes for v in scaled} == {(s, a) for s in ("rowwise", "blockwise",
                                                         "blockwise_rowwise")
                                        for a in ("promoted", "fast")}
    assert {v.axes for v in scaled if v.config.ws} == {v.axes for v in scaled}
    # The fused up projection: fp8 h out, the tokens scaled as the weights
    # (an axis restricted to two of Scaling's values), gu dropped (serving) or
    # kept (training).
    glu = [v for v in fp8 if v.family == "scaled_ragged_glu"]
    assert {v.out.name for v in glu} == {"float8_e4m3fn"}
    assert {v.axes for v in glu} == {(s, g, gu) for s in ("rowwise", "blockwise")
                                     for g in ("concatenated", "interleaved")
                                     for gu in ("dropped", "kept")}
    assert {v.axes for v in glu if v.config.ws} == {v.axes for v in glu}
    # The weight gradient: rowwise and blockwise, bfloat16 or float32 out.
    grad = [v for v in fp8 if v.family == "scaled_ragged_k"]
    assert {(v.axes, v.out.name) for v in grad} == {((s,), o) for s in ("rowwise", "blockwise")
                                                    for o in ("bfloat16", "float32")}


def test_warp_specialised_variants_are_gluon_where_they_can_run():
    """A `ws` config compiles the family's Gluon kernel only for TMA, 16- or
    8-bit inputs of a family that has one; elsewhere its tiles compile as a
    Triton config (no variant is lost), and a 16-bit ragged_m table entry of
    each kind exists."""
    for v in all_variants():
        if v.config.ws:
            assert FAMILIES[v.family].ws_kernel is not None, v.key
            assert v.flavour == "tma" and DTYPES[v.dtype].bytes <= 2, v.key
    keys = {v.key for v in all_variants()}
    forward = "row-column-row"  # the tokens times the nn.Linear weight
    assert any(k.startswith(f"ragged_m.sm90.bfloat16.{forward}.tma.") and k.endswith("_ws")
               for k in keys)
    assert any(k.startswith(f"ragged_m.sm90.float32.{forward}.tma.128x256") for k in keys)


def test_cluster_kernels_compile_where_triton_multicasts(manifest):
    """ragged_m's warp-specialised kernel compiles as a 2-CTA cluster (B's
    block multicast, the cluster size in the PTX) under a Triton whose Gluon
    has TMA multicast (3.8 on), though no shipped config asks for one (the
    dispatch never preferred it: aot/tuning/sm90.json's note)."""
    from aot.kernels.gluon_api import CLUSTERS
    assert all(r["num_ctas"] == r["config"].get("ctas", 1) for r in manifest["variants"])
    if not CLUSTERS:
        pytest.skip("this Triton's Gluon has no TMA multicast")
    one_cta = next(v for v in all_variants() if v.family == "ragged_m" and v.arch == 90
                   and v.config.ws and v.key.startswith("ragged_m.sm90.bfloat16.row-row-row."))
    clustered = replace(one_cta, config=replace(one_cta.config, BM=2 * one_cta.config.BM, ctas=2))
    compiled = compile_variant(clustered)
    assert compiled.record["num_ctas"] == 2
    assert ".reqnctapercluster 2" in compiled.ptx and "multicast::cluster" in compiled.ptx


def test_warp_specialised_register_budget_fits_an_sm(manifest):
    """The maxnreg a ws variant is compiled with, times the warps its kernel
    launches (the build's count, from Triton), fits an SM's 64K registers: the
    budget's count of MMA partitions matches the kernel's."""
    from aot.kernels.ws import max_registers
    ws = [r for r in manifest["variants"] if r["config"].get("ws")]
    assert ws
    for r in ws:
        assert r["num_warps"] * 32 * max_registers(Config(**r["config"])) <= 65536, r["key"]
        assert r["num_warps"] % 4 == 0, r["key"]  # whole warpgroups (setmaxnreg's unit)


def test_pingpong_configs_need_a_kernel_that_takes_turns(monkeypatch):
    """A pingpong config compiles a ws kernel that takes PINGPONG (its two MMA
    partitions take turns at whole tiles: kernels/ragged_ws.py); a family whose
    ws kernel does not is refused one, rather than given the split tile."""
    from aot import variants
    pingpong = [v for v in all_variants() if v.config.pingpong]
    assert pingpong
    for v in pingpong:
        assert v.config.ws and FAMILIES[v.family].takes_pingpong, v.key
        assert v.constexprs()["PINGPONG"] is True, v.key
    assert not FAMILIES["gathered_k"].takes_pingpong
    config = Config(128, 128, 64, 4, 4, ws=True, pingpong=True)
    family = replace(FAMILIES["gathered_k"], configs={(90, "tma"): (config, )})
    monkeypatch.setitem(variants.FAMILIES, "gathered_k", family)
    arch = next(a for a in variants.ARCHS if a.arch == 90)
    with pytest.raises(ValueError, match="gathered_k: a pingpong config"):
        variants.configs_for("gathered_k", arch, "tma", DTYPES["bfloat16"], DTYPES["bfloat16"],
                             family.axis_values()[0])


def test_warp_specialised_kernel_uses_mbarriers_and_partitions():
    variant = next(v for v in all_variants() if v.config.ws and v.family == "ragged_m")
    ptx = compile_variant(variant).ptx
    assert "setmaxnreg" in ptx and "mbarrier.try_wait" in ptx and "wgmma.mma_async" in ptx
    assert "wgmma.wait_group.sync.aligned 1" in ptx  # one MMA group kept in flight


def test_prebuilt_kernels_are_reused_only_when_current(manifest, tmp_path):
    """aot.prebuilt (make build's first question) accepts the build's own
    kernels for its Triton, and refuses another Triton, a partial build, other
    sources and a missing manifest, saying which."""
    import triton

    from aot.prebuilt import reason_to_compile
    from aot.sources import sources_digest

    assert manifest["sources_sha256"] == sources_digest() and not manifest["partial"]
    assert reason_to_compile(KERNELS, triton.__version__) == ""
    assert "compiled by Triton" in reason_to_compile(KERNELS, "0.0.1")
    assert reason_to_compile(tmp_path, triton.__version__).startswith("no ")
    for change, reason in (({"partial": True}, "partial build"),
                           ({"sources_sha256": "0" * 64}, "other sources")):
        (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **change}))
        assert reason in reason_to_compile(tmp_path, triton.__version__)


def test_sources_digest_follows_every_compiled_file(tmp_path):
    from aot.sources import sources_digest

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("a")
    before = sources_digest(tmp_path)
    (tmp_path / "kernels" / "k.py").write_text("b")
    changed = sources_digest(tmp_path)
    (tmp_path / "kernels" / "k.py").write_text("a")
    (tmp_path / "tuning.json").write_text("{}")
    assert len({before, changed, sources_digest(tmp_path)}) == 3
    (tmp_path / "tuning.json").unlink()
    assert sources_digest(tmp_path) == before
    (tmp_path / "tune.py").write_text("runs beside the build")
    assert sources_digest(tmp_path) == before
