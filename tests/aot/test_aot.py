"""Build-time tests (need Triton, no GPU): the compiler, the manifest it wrote
for the wheel, and the ABI the launcher relies on."""
import json
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from aot import codegen
from aot.compile import CompileError, compile_variant, ptx_entry_params
from aot.variants import FAMILIES, Config, Variant, all_variants

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "build" / "aot" / "kernels"
PTX_TYPES = {"p": ".u64", "l": ".u64", "i": ".u32"}


def cubin_arch(cubin: bytes) -> int:
    """SM version from a CUDA ELF header: the low byte of e_flags (0x50 = sm_80, 0x5a = sm_90a)."""
    assert cubin[:4] == b"\x7fELF"
    (e_flags,) = struct.unpack_from("<I", cubin, 0x30)
    return e_flags & 0xFF


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
    kinds = codegen.param_kinds(compiled.record["params"])
    assert ptx_entry_params(compiled.ptx) == [PTX_TYPES[k] for k in kinds] + [".u64", ".u64"]


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


def test_manifest_abi_matches_ptx_and_family(manifest):
    for record in manifest["variants"]:
        family = FAMILIES[record["family"]]
        assert [name for name, _ in record["params"]] == [name for name, _ in family.params]
        ptx = (KERNELS / f"{record['key']}.ptx").read_text()
        kinds = codegen.param_kinds(record["params"])
        expected = [PTX_TYPES[k] for k in kinds] + [".u64", ".u64"]  # + global/profile scratch
        assert ptx_entry_params(ptx) == expected, record["key"]
        assert f".entry {record['kernel_name']}(" in ptx


def test_cubins_match_manifest(manifest):
    import hashlib
    for record in manifest["variants"]:
        cubin = (KERNELS / record["cubin"]).read_bytes()
        assert hashlib.sha256(cubin).hexdigest() == record["cubin_sha256"]
        assert cubin_arch(cubin) == record["arch"], record["key"]
        assert record["num_ctas"] == 1
        if record["arch"] == 80:
            assert record["flavour"] == "basic" and record["shared"] <= 99 * 1024


def test_kernel_table_is_deterministic(manifest, tmp_path):
    codegen.write_outputs(manifest["variants"], tmp_path, manifest["triton_version"])
    assert (tmp_path / "kernel_table.inc").read_text() == (KERNELS / "kernel_table.inc").read_text()
    assert (tmp_path / "kernel_table.inc").read_text().count("\n    {") == len(manifest["variants"])


def test_variant_keys_describe_themselves():
    for v in all_variants():
        assert v.key.startswith(f"{v.family}.sm{v.arch}.{v.dtype}.{v.layout}.{v.flavour}.")
        assert v.flavour != "tma" or v.arch == 90
        assert isinstance(v, Variant)
