"""The vllm_fp8 section without a GPU: bench/vendor_vllm.py's copy of a (fake,
made here) vLLM source from a folder, a wheel and a git directory (its
triton_kernels too, the w4_experts section's anchor); the sections' reasons
for not running; bench/vllm_moe.py's alignment of the token slots by expert,
in torch on the CPU."""
import ast
import json
import subprocess
import zipfile
from types import SimpleNamespace

import pytest
import torch

from bench import vendor_vllm, vllm_moe
from bench.sections import vllm_fp8, w4_experts

HEADER = "# SPDX-License-Identifier: Apache-2.0\n# SPDX-FileCopyrightText: vLLM\n"
FUSED_MOE = HEADER + '''"""Fused MoE."""
import torch
from vllm.triton_utils import tl, triton

SOME_CONSTANT = 3


@triton.jit
def write_zeros_to_output(c_ptr, N):
    tl.store(c_ptr, 0)


@triton.jit
def unrelated_kernel(x_ptr):
    tl.store(x_ptr, SOME_CONSTANT)


@triton.jit
def fused_moe_kernel(a_ptr, c_ptr, N: tl.constexpr):
    if N == 0:
        write_zeros_to_output(c_ptr, N)
    tl.store(c_ptr, tl.load(a_ptr))


def fused_experts(x):
    return torch.ops.vllm.fused_experts(x)
'''
FP8_UTILS = HEADER + '''
# Adapted from elsewhere
import triton


@triton.jit
def _per_token_group_quant_fp8(y_ptr, BLOCK: tl.constexpr):
    tl.store(y_ptr, tl.zeros((BLOCK,), tl.float32))
'''
CONFIG_DIR = "vllm/model_executor/layers/fused_moe/configs"
BLOCKS = "dtype=fp8_w8a8,block_shape=[128,128].json"
WANTED_CONFIG = f"E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3,{BLOCKS}"
OTHER_CONFIGS = ("E=8,N=64,device_name=NVIDIA_H100_80GB_HBM3,dtype=fp8_w8a8.json",
                 f"E=8,N=64,device_name=AMD_Instinct_MI300X,{BLOCKS}")
FILES = {
    "vllm/model_executor/layers/fused_moe/fused_moe.py": FUSED_MOE,
    "vllm/model_executor/layers/quantization/utils/fp8_utils.py": FP8_UTILS,
    **{f"{CONFIG_DIR}/{name}": '{"1": {"BLOCK_SIZE_M": 16}}'
       for name in (WANTED_CONFIG, *OTHER_CONFIGS)},
    "vllm/_version.py": "__version__ = version = '9.9.9'\n__commit_id__ = commit_id = 'gabc'\n",
}
TRITON_KERNELS = {"__init__.py": "", "matmul_ogs.py": "FAKE = 'matmul_ogs'\n",
                  "tensor_details/layout.py": "FAKE = 'layout'\n", "README.md": "not code"}
FILES.update({f"{vendor_vllm.TRITON_KERNELS}/{path}": text
              for path, text in TRITON_KERNELS.items()})


def write_tree(root, files):
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


def folder_source(tmp_path):
    write_tree(tmp_path / "src", {**FILES, "LICENSE": "Apache License 2.0"})
    return tmp_path / "src"


def wheel_source(tmp_path):
    wheel = tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in FILES.items():
            zf.writestr(path, text)
        zf.writestr("vllm-9.9.9.dist-info/licenses/LICENSE", "Apache License 2.0")
    return wheel


def git_source(tmp_path):
    checkout = folder_source(tmp_path)
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "vllm"], check=True)
    return checkout / ".git"


@pytest.mark.parametrize("make_source", [folder_source, wheel_source, git_source])
def test_vendor_copies_the_kernels_configs_and_license(tmp_path, make_source):
    out = tmp_path / "out"
    (out / "configs").mkdir(parents=True)
    (out / "configs" / "stale.json").write_text("{}")
    provenance = vendor_vllm.vendor(make_source(tmp_path), out)
    assert provenance["version"] == "9.9.9" or provenance["kind"] == "git"
    assert provenance["configs"] == [WANTED_CONFIG]
    assert sorted(p.name for p in (out / "configs").iterdir()) == [WANTED_CONFIG]
    assert (out / "LICENSE").read_text() == "Apache License 2.0"
    assert json.loads((out / vendor_vllm.PROVENANCE).read_text()) == provenance
    assert vendor_vllm.missing(out) == []
    fused = (out / "fused_moe_kernel.py").read_text()
    assert fused.startswith(HEADER)
    tree = ast.parse(fused)
    assert [n.name for n in tree.body if isinstance(n, ast.FunctionDef)] == [
        "write_zeros_to_output", "fused_moe_kernel"]
    assert [ast.unparse(n) for n in tree.body if isinstance(n, ast.Import)] == [
        "import triton", "import triton.language as tl"]
    quant = (out / "fp8_quant_kernel.py").read_text()
    assert "# Adapted from elsewhere" in quant and "def _per_token_group_quant_fp8(" in quant
    assert provenance["triton_kernels"] == 3
    copied = sorted(str(p.relative_to(out / "triton_kernels"))
                    for p in (out / "triton_kernels").rglob("*") if p.is_file())
    assert copied == ["__init__.py", "matmul_ogs.py", "tensor_details/layout.py"]
    assert (out / "triton_kernels" / "matmul_ogs.py").read_text() == TRITON_KERNELS[
        "matmul_ogs.py"]


def test_triton_kernels_absent_from_a_source_is_said(tmp_path):
    source = folder_source(tmp_path)
    for path in TRITON_KERNELS:
        (source / vendor_vllm.TRITON_KERNELS / path).unlink()
    out = tmp_path / "out"
    (out / "triton_kernels").mkdir(parents=True)
    (out / "triton_kernels" / "stale.py").write_text("")
    assert vendor_vllm.vendor(source, out)["triton_kernels"] == 0
    assert not (out / "triton_kernels").exists()
    assert vendor_vllm.load_triton_kernels(out) is None


def test_vendor_refuses_what_it_cannot_copy(tmp_path):
    with pytest.raises(ValueError, match="neither a vLLM wheel"):
        vendor_vllm.vendor(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="reads \\['SOME_CONSTANT'\\]"):
        vendor_vllm.jit_closure(FUSED_MOE, ("unrelated_kernel",), "fused_moe.py")
    with pytest.raises(ValueError, match="no top-level @triton.jit function fused_experts"):
        vendor_vllm.jit_closure(FUSED_MOE, ("fused_experts",), "fused_moe.py")


def test_the_section_says_why_it_did_not_run(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_fp8.ENV, raising=False)
    assert "GG_VLLM_SRC is not set" in vllm_fp8.run(None)["skipped"]
    monkeypatch.setenv(vllm_fp8.ENV, str(tmp_path))
    assert "lacks fused_moe_kernel.py" in vllm_fp8.run(None)["skipped"]


def test_the_w4_anchor_says_why_it_did_not_run(monkeypatch, tmp_path):
    monkeypatch.delenv(vllm_fp8.ENV, raising=False)
    tk, anchor = w4_experts.triton_kernels_anchor()
    assert tk is None and "GG_VLLM_SRC is not set" in anchor["skipped"]
    assert w4_experts.anchor_line(anchor).startswith(
        "OpenAI's triton_kernels (the anchor) did not run: GG_VLLM_SRC is not set")
    assert "this run predates it" in w4_experts.anchor_line(None)


@pytest.mark.parametrize("tokens, top_k, experts, block_m", [
    (1, 2, 8, 16), (5, 8, 256, 16), (64, 8, 16, 16), (300, 2, 8, 64), (33, 4, 4, 64)])
def test_slots_aligned_by_expert(tokens, top_k, experts, block_m):
    topk_ids = torch.rand(tokens, experts).topk(top_k, dim=-1).indices
    slots = topk_ids.numel()
    blocks = vllm_moe.aligned_by_expert(topk_ids, experts, block_m)
    padded = int(blocks.padded_slots)
    counts = torch.bincount(topk_ids.flatten(), minlength=experts)
    assert padded == int(((counts + block_m - 1) // block_m * block_m).sum())
    assert blocks.sorted_ids.numel() >= padded
    assert (blocks.sorted_ids[padded:] == slots).all()
    placed = blocks.sorted_ids[:padded]
    assert sorted(placed[placed < slots].tolist()) == list(range(slots))
    for block in range(padded // block_m):
        rows = blocks.sorted_ids[block * block_m:(block + 1) * block_m]
        rows = rows[rows < slots].long()
        assert rows.numel() > 0
        assert (topk_ids.flatten()[rows] == blocks.expert_ids[block]).all()


def test_tuned_file_then_the_h200_proxy_then_the_default(tmp_path):
    h100 = "NVIDIA_H100_80GB_HBM3"
    for experts, inter, device in ((256, 128, h100), (256, 128, vllm_moe.PROXY_DEVICE),
                                   (128, 768, vllm_moe.PROXY_DEVICE)):
        (tmp_path / vllm_moe.config_file_name(experts, inter, device)).write_text("{}")
    path, source = vllm_moe.tuned_file(tmp_path, 256, 128, h100)
    assert (path.name, source) == (vllm_moe.config_file_name(256, 128, h100), "tuned")
    path, source = vllm_moe.tuned_file(tmp_path, 128, 768, h100)
    assert (path.name, source) == (vllm_moe.config_file_name(128, 768, vllm_moe.PROXY_DEVICE),
                                   "H200 proxy")
    assert vllm_moe.tuned_file(tmp_path, 8, 14336, h100) == (None, "default")


def test_shapes_vllm_refuses_are_named_not_run():
    """vLLM serves fp8 experts in 128 x 128 blocks only where the intermediate
    size per shard (and the hidden size) is whole blocks: Qwen3-30B-A3B at
    tensor parallelism 4 (I 192) is refused, and so is quantizing such a row."""
    hidden, inter = vllm_fp8.SHAPES["qwen3_30b_a3b_tp4"][:2]
    assert "192" in vllm_moe.refusal(hidden, inter)
    assert vllm_moe.refusal(*vllm_fp8.SHAPES["deepseek_v3_tp16"][:2]) is None
    with pytest.raises(ValueError, match="whole groups"):
        vllm_moe.quantize(None, torch.zeros(2, 192))


@pytest.mark.parametrize("params, passed", [
    ({"a_ptr", "SWAP_AB", "USE_TD"}, {"SWAP_AB": True, "USE_TD": False}),  # vLLM 0.33
    ({"a_ptr"}, {}),  # vLLM's main branch of 2026-11: neither
])
def test_only_the_vendored_kernels_options_are_passed(params, passed):
    """fused_moe_kernel's constexprs differ between vLLM releases: the host
    path passes those the vendored kernel declares, no others."""
    kernels = SimpleNamespace(fused_moe_params=frozenset(params))
    chosen = vllm_moe.Plan({}, None, "default", True, False)
    assert vllm_moe.release_options(kernels, chosen) == passed
