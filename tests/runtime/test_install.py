"""The installed wheel: contents, import without Triton, info() without a GPU."""
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import torch

import gg_runtime
from gg_runtime import _C

from conftest import HAS_GPU

MANIFEST = Path(gg_runtime.__file__).parent / "_kernels" / "manifest.json"


def test_imported_from_installed_wheel_not_source():
    assert "site-packages" in gg_runtime.__file__ or "dist-packages" in gg_runtime.__file__


def fresh_process_output(code: str) -> str:
    """stdout of `code` run by this Python in a new process, which must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


@pytest.mark.parametrize("triton", ["blocked", "as installed"])
def test_runtime_neither_needs_nor_loads_triton(triton):
    """In a fresh process, with Triton unimportable or as this environment has
    it (torch from the package index brings one): import, info() and, where a
    GPU is present, a grouped_mm call run and leave no Triton module loaded."""
    code = ("import sys\n"
            + ("sys.modules['triton'] = None\n" if triton == "blocked" else "") +
            "import torch, gg_runtime\n"
            "if torch.cuda.is_available():\n"
            "    a = torch.randn(64, 32, device='cuda', dtype=torch.bfloat16)\n"
            "    b = torch.randn(2, 32, 16, device='cuda', dtype=torch.bfloat16)\n"
            "    offs = torch.tensor([30, 64], device='cuda', dtype=torch.int32)\n"
            "    gg_runtime.grouped_mm(a, b, offs)\n"
            "    torch.cuda.synchronize()\n"
            "loaded = [m for m in sys.modules if m.split('.')[0] == 'triton' and sys.modules[m]]\n"
            "assert not loaded, loaded\n"
            "print(gg_runtime.info()['build']['variants'])")
    assert int(fresh_process_output(code).splitlines()[-1]) == len(_C.variants())


def test_testing_helpers_are_imported_only_on_request_and_without_triton():
    """gg_runtime.testing (the tests' and benchmarks' helpers) ships in the wheel,
    `import gg_runtime` leaves it unimported, and it imports with Triton blocked."""
    code = ("import sys\n"
            "import gg_runtime\n"
            "assert 'gg_runtime.testing' not in sys.modules\n"
            "sys.modules['triton'] = None\n"
            "import gg_runtime.testing\n"
            "print(gg_runtime.testing.__file__)")
    assert Path(fresh_process_output(code)).parent == Path(gg_runtime.__file__).parent / "testing"


def test_wheel_contents_match_manifest():
    wheel = os.environ.get("GG_WHEEL")
    if not wheel:
        pytest.skip("GG_WHEEL not set (make test sets it)")
    names = zipfile.ZipFile(wheel).namelist()
    manifest = json.loads(zipfile.ZipFile(wheel).read("gg_runtime/_kernels/manifest.json"))
    cubins = {n.rsplit("/", 1)[1] for n in names if n.endswith(".cubin")}
    assert cubins == {r["cubin"] for r in manifest["variants"]}
    ptx = {n.rsplit("/", 1)[1] for n in names if n.endswith(".ptx")}
    assert ptx == {r["ptx"] for r in manifest["variants"] if r["ptx"]}
    assert ptx and all(r["ptx"] == "" or r["arch"] == 80 for r in manifest["variants"])
    assert any(n.startswith("gg_runtime/_C") and n.endswith(".so") for n in names)
    assert "gg_runtime/testing/__init__.py" in names
    assert not any(n.startswith("bench/") for n in names)
    assert not any(n.startswith("aot/") or n.startswith("tests/") for n in names)
    # The budget docs/build.md states, for the wheel of every CPython.
    assert os.path.getsize(wheel) <= 30e6


def test_kernel_table_matches_shipped_manifest():
    manifest = json.loads(MANIFEST.read_text())
    table = _C.variants()
    assert [v["key"] for v in table] == [r["key"] for r in manifest["variants"]]
    families = _C.families()
    for row, record in zip(table, manifest["variants"]):
        assert row["kernel_name"] == record["kernel_name"]
        # The table's axis code names the manifest's values, in the family's axis order.
        assert row["axes"] == record["axes"]
        axes = families[row["family"]]["axes"]
        assert list(axes) == list(row["axes"]) and all(
            row["axes"][name] in values for name, values in axes.items())
        assert row["shared"] == record["shared"] and row["num_warps"] == record["num_warps"]
        assert row["scratch_size"] == record["scratch_size"]
    assert _C.triton_version() == manifest["triton_version"]


def test_choices_are_the_python_vocabulary():
    """_C.choices() holds every Choice of the families, by the C++ enum's
    order; moe_experts checks its str arguments against two of them."""
    from gg_runtime.moe.choices import ACTIVATIONS, GATE_UP_VALUES
    choices = _C.choices()
    assert choices["Activation"] == ["swiglu", "gpt_oss"] == list(ACTIVATIONS)
    assert choices["GateUp"] == ["concatenated", "interleaved"] == list(GATE_UP_VALUES)
    for family in _C.families().values():
        for name, values in family["axes"].items():
            assert any(values == listed for listed in choices.values()), name
        assert all(role != "choice" or name == "activation"
                   for name, _, role, _, _ in family["params"])


def test_build_info():
    build = gg_runtime.info()["build"]
    assert build["archs"] == ["sm80", "sm90"]
    assert build["dtypes"] == ["bfloat16", "float16", "float32", "float8_e4m3fn", "tf32"]
    assert build["families"] == ["combine", "combine_parts", "dispatch_plan", "gathered_k",
                                 "gathered_m", "grouped_gemm", "quantize_fp8",
                                 "quantize_fp8_columns", "ragged_glu", "ragged_k", "ragged_m",
                                 "received_slots", "route", "scaled_decode_split",
                                 "scaled_experts_decode",
                                 "scaled_ragged_glu", "scaled_ragged_k", "scaled_ragged_m",
                                 "send_fp8_rows", "send_rows", "sum_peer_rows", "swiglu",
                                 "swiglu_backward_fp8",
                                 "w4_decode_down", "w4_decode_glu", "w4_decode_split", "w4_glu",
                                 "w4_ragged_m", "widen_mxfp4"]
    assert build["variants"] == len(_C.variants()) > 0


def test_operators_are_registered_for_cuda_meta_and_cpu():
    """The stable-ABI library registered every operator under the running
    torch (any release from the wheel's oldest): shapes come from meta tensors,
    CPU tensors get the error that names the argument."""
    for name in ("grouped_mm", "scaled_grouped_mm", "scaled_grouped_mm_k", "quantize_fp8",
                 "quantize_fp8_both_orientations", "quantize_fp8_columns", "grouped_gemm",
                 "swiglu", "swiglu_backward", "swiglu_backward_fp8", "grouped_mm_glu",
                 "gathered_mm", "gathered_mm_k", "combine", "route", "moe_experts",
                 "moe_experts_for_backward"):
        assert hasattr(torch.ops.gg_runtime, name), name
    a = torch.empty(7, 16, dtype=torch.bfloat16, device="meta")
    b = torch.empty(3, 16, 5, dtype=torch.bfloat16, device="meta")
    offs = torch.empty(3, dtype=torch.int32, device="meta")
    assert gg_runtime.grouped_mm(a, b, offs).shape == (7, 5)
    with pytest.raises(ValueError, match="mat_a must be on a CUDA device, got cpu"):
        gg_runtime.grouped_mm(torch.randn(7, 16), torch.randn(3, 16, 5),
                              torch.ones(3, dtype=torch.int32))


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU report")
def test_info_without_gpu():
    device = gg_runtime.info()["device"]
    assert device["available"] is False and device["supported"] is False
    assert "no CUDA device" in device["reason"]


def test_force_ptx_setting():
    """The Python call and the environment variable set one process-wide switch;
    each accepts only its documented values."""
    before = _C.force_ptx()
    try:
        gg_runtime.force_ptx(True)
        assert _C.force_ptx() is True
        gg_runtime.force_ptx(False)
        assert _C.force_ptx() is False
        for wrong in ("no", 1, None):
            with pytest.raises(TypeError, match="must be a bool"):
                gg_runtime.force_ptx(wrong)
        assert _C.force_ptx() is False
    finally:
        gg_runtime.force_ptx(before)
    code = "import gg_runtime; from gg_runtime import _C; print(_C.force_ptx())"
    for value, expected in (("1", "True"), ("true", "True"), ("ON", "True"), ("yes", "True"),
                            ("0", "False"), ("false", "False"), ("off", "False"), ("", "False")):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={**os.environ, "GG_RUNTIME_FORCE_PTX": value})
        assert out.stdout.strip() == expected, value
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "GG_RUNTIME_FORCE_PTX": "maybe"})
    assert out.returncode != 0 and "GG_RUNTIME_FORCE_PTX='maybe'" in out.stderr


def test_sm_limit_setting():
    """The limit holds inside the context, nests, is this thread's alone, and
    refuses what is not a count."""
    assert _C.sm_limit() == 0
    with gg_runtime.sm_limit(16):
        assert _C.sm_limit() == 16
        with gg_runtime.sm_limit(4):
            assert _C.sm_limit() == 4
        assert _C.sm_limit() == 16
        seen = []
        worker = threading.Thread(target=lambda: seen.append(_C.sm_limit()))
        worker.start()
        worker.join()
        assert seen == [0]
    assert _C.sm_limit() == 0
    for wrong, error in ((1.5, TypeError), (True, TypeError), ("8", TypeError), (-1, ValueError)):
        with pytest.raises(error, match="sm_limit: sms must be"), gg_runtime.sm_limit(wrong):
            pass
    assert _C.sm_limit() == 0


def cli(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "gg_runtime", *args], capture_output=True,
                          text=True, **kwargs)


def test_cli_info_table_and_json():
    report = json.loads(cli("info", "--json", check=True).stdout)
    assert report["build"]["triton_version"] == _C.triton_version()
    table = cli(check=True).stdout  # no command: info, as a table
    assert table.startswith("build:\n") and f"triton_version  {_C.triton_version()}" in table
    assert "device:" in table


def test_cli_help_and_unknown_flags():
    assert "info" in cli("--help", check=True).stdout
    for args in (["--bogus"], ["info", "--bogus"], ["nosuchcommand"]):
        out = cli(*args)
        assert out.returncode == 2 and "Error" in out.stderr, args


def test_cli_exits_quietly_when_its_pipe_closes():
    proc = subprocess.Popen([sys.executable, "-m", "gg_runtime", "info", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the command writes (as `| head -0`)
    stderr = proc.stderr.read().decode()
    assert proc.wait() == 1 and "Traceback" not in stderr, stderr


def test_call_on_cpu_tensors_is_a_clear_error():
    a = torch.randn(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"As\[0\] must be on a CUDA device"):
        gg_runtime.grouped_gemm([a], [a.t().contiguous()])


def test_families_match_the_shipped_manifest():
    """The extension's parameter lists (names, roles, in ABI order) are those the
    build recorded for every variant of the family."""
    manifest = json.loads(MANIFEST.read_text())
    families = _C.families()
    for record in manifest["variants"]:
        params = families[record["family"]]["params"]
        assert [(name, role) for name, _, role, *_ in params] == \
            [(name, role) for name, _, role in record["params"]], record["key"]


def test_oldest_torch_is_required_and_checked_at_import():
    """The wheel's metadata and the import-time check name the same oldest torch
    (the stable ABI the operators target); an older one is a clear ImportError."""
    from importlib.metadata import requires

    from gg_runtime._native import OLDEST_TORCH
    oldest = ".".join(map(str, OLDEST_TORCH))
    assert f"torch>={oldest}" in requires("gg_runtime")
    code = "import torch; torch.__version__ = '2.9.1+cu128'; import gg_runtime"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0
    assert f"ImportError: gg_runtime needs torch >= {oldest}, found 2.9.1+cu128" in out.stderr
