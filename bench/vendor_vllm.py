"""vLLM's Triton fused-MoE kernels for the vllm_fp8 bench section, kept out of
the repository: copies the @triton.jit functions of vLLM's fused_moe_kernel and
its per-token-group fp8 quantisation (with the functions they call and vLLM's
license header) into standalone modules that import with triton alone, vLLM's
tuned configs for fp8 128 x 128 blocks on H100 and H200, vLLM's LICENSE, and
the OpenAI triton_kernels package vLLM ships in vllm/third_party (its wheels
have it; a checkout fetches it at build), into an ignored folder (.device/vllm
by default); and loads them from there.

    python3 -m bench.vendor_vllm SOURCE [--out .device/vllm]

SOURCE: a vLLM checkout (a folder holding vllm/), a git directory of one (bare,
as the search tool's fetch brings; its HEAD is read) or a vLLM wheel (.whl).
The copy is made with the standard library only; nothing of vLLM is committed.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / ".device" / "vllm"
# Vendored module -> (its vLLM source file, the @triton.jit functions wanted from it).
KERNELS = {
    "fused_moe_kernel": ("vllm/model_executor/layers/fused_moe/fused_moe.py",
                         ("fused_moe_kernel",)),
    "fp8_quant_kernel": ("vllm/model_executor/layers/quantization/utils/fp8_utils.py",
                         ("_per_token_group_quant_fp8",)),
}
CONFIGS = "vllm/model_executor/layers/fused_moe/configs"
# OpenAI's triton_kernels (matmul_ogs, routing, the MXFP4 layouts) as vLLM
# ships and runs it (gpt-oss's MXFP4 experts on Hopper); copied whole, verbatim.
TRITON_KERNELS = "vllm/third_party/triton_kernels"
# vLLM's tuned fused-MoE configs for fp8 weights in 128 x 128 blocks on the GPUs
# the bench runs on: E=..,N=..,device_name=NVIDIA_H100..,dtype=fp8_w8a8,block_shape=[128,128].json
CONFIG_NAME = re.compile(
    r"E=\d+,N=\d+,device_name=NVIDIA_H[12]00[^,]*,dtype=fp8_w8a8,block_shape=\[128,128\]\.json")
# Module-level names the kernels may use: the vendored modules import them.
TRITON_NAMES = ("tl", "triton")
PROVENANCE = "vendored.json"
VERSION = re.compile(r"__version__ = version = '([^']+)'")
COMMIT = re.compile(r"__commit_id__ = commit_id = '([^']+)'")


class FolderSource:
    """A vLLM checkout or unpacked wheel: a folder holding vllm/."""

    def __init__(self, root: Path):
        self.root = root

    def read(self, path: str) -> str:
        return (self.root / path).read_text()

    def names(self, folder: str) -> list:
        where = self.root / folder
        return sorted(p.name for p in where.iterdir()) if where.is_dir() else []

    def files(self, folder: str) -> list:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / folder).rglob("*")
                      if p.is_file())

    def describe(self) -> dict:
        return {"kind": "folder", "path": str(self.root)}


class GitSource:
    """A git directory (bare or a checkout's .git) of vLLM: its HEAD."""

    def __init__(self, git_dir: Path):
        self.git_dir = git_dir

    def git(self, *args) -> str:
        out = subprocess.run(["git", f"--git-dir={self.git_dir}", *args], capture_output=True,
                             text=True)
        if out.returncode:
            raise FileNotFoundError(f"git {' '.join(args)} in {self.git_dir}: {out.stderr}")
        return out.stdout

    def read(self, path: str) -> str:
        return self.git("show", f"HEAD:{path}")

    def names(self, folder: str) -> list:
        prefix = [f"{folder}/"] if folder else []
        listed = self.git("ls-tree", "--name-only", "HEAD", *prefix).splitlines()
        return sorted(name[len(folder) + 1 if folder else 0:] for name in listed)

    def files(self, folder: str) -> list:
        return sorted(self.git("ls-tree", "-r", "--name-only", "HEAD", f"{folder}/").splitlines())

    def describe(self) -> dict:
        return {"kind": "git", "path": str(self.git_dir), "commit": self.git("rev-parse",
                                                                             "HEAD").strip()}


class WheelSource:
    """A vLLM wheel (a zip whose top level holds vllm/ and its .dist-info)."""

    def __init__(self, wheel: Path):
        self.wheel = wheel
        self.zip = zipfile.ZipFile(wheel)

    def read(self, path: str) -> str:
        try:
            return self.zip.read(path).decode()
        except KeyError:
            raise FileNotFoundError(f"{path} is not in {self.wheel}") from None

    def names(self, folder: str) -> list:
        prefix = f"{folder}/" if folder else ""
        return sorted({name[len(prefix):].split("/")[0] for name in self.zip.namelist()
                       if name.startswith(prefix) and len(name) > len(prefix)})

    def files(self, folder: str) -> list:
        return sorted(name for name in self.zip.namelist()
                      if name.startswith(f"{folder}/") and not name.endswith("/"))

    def describe(self) -> dict:
        return {"kind": "wheel", "path": str(self.wheel)}


def open_source(path: Path):
    """The reader of `path`: a wheel, a git directory or a folder holding vllm/."""
    if path.is_file() and path.suffix == ".whl":
        return WheelSource(path)
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return GitSource(path)
    if (path / "vllm").is_dir():
        return FolderSource(path)
    raise ValueError(f"source: {path} is neither a vLLM wheel, a git directory nor a folder "
                     "holding vllm/")


def license_header(text: str) -> list:
    """The comment lines that open a source file (vLLM's SPDX license lines and
    any attribution), up to its first line of code."""
    lines = []
    for line in text.splitlines():
        if line.startswith("#"):
            lines.append(line)
        elif line.strip():
            break
    return lines


def module_names(tree: ast.Module) -> set:
    """The names a module binds at its top level."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def global_names(function: ast.FunctionDef) -> set:
    """The names a function reads that it neither takes nor assigns."""
    args = function.args
    local = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    local.update(n.id for n in ast.walk(function)
                 if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load))
    return {n.id for n in ast.walk(function)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)} - local


def is_jit(function: ast.FunctionDef) -> bool:
    """Whether the function is decorated @triton.jit (or @triton.jit(...))."""
    for decorator in function.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target) in ("triton.jit", "jit"):
            return True
    return False


def jit_closure(text: str, wanted: tuple, path: str) -> list:
    """The top-level @triton.jit functions of `text` named in `wanted` and
    those they call, in source order.  A ValueError where one is missing or
    not @triton.jit, or reads a module-level name other than tl and triton."""
    tree = ast.parse(text)
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    others = module_names(tree) - set(functions) - set(TRITON_NAMES)
    chosen, todo = {}, list(wanted)
    while todo:
        name = todo.pop()
        if name in chosen:
            continue
        if name not in functions or not is_jit(functions[name]):
            raise ValueError(f"{path}: no top-level @triton.jit function {name}")
        chosen[name] = functions[name]
        used = global_names(functions[name])
        if used & others:
            raise ValueError(f"{path}: {name} reads {sorted(used & others)}, module-level names "
                             "this script does not vendor")
        todo.extend(sorted(used & set(functions)))
    return sorted(chosen.values(), key=lambda node: node.lineno)


def function_source(lines: list, function: ast.FunctionDef) -> str:
    """The function's source text, its decorators included."""
    first = min([d.lineno for d in function.decorator_list] + [function.lineno])
    return "\n".join(lines[first - 1:function.end_lineno])


def standalone_module(text: str, wanted: tuple, path: str, origin: str) -> str:
    """A module of the @triton.jit functions `wanted` of vLLM's `path` (and
    those they call), verbatim, under vLLM's license header."""
    lines = text.splitlines()
    functions = jit_closure(text, wanted, path)
    names = ", ".join(f.name for f in functions)
    return "\n".join([
        *license_header(text),
        "#",
        "# Copied verbatim by gg_runtime's bench/vendor_vllm.py, for its benchmark only (not",
        f"# part of gg_runtime), from {origin}, {path}:",
        f"# {names}.",
        "import triton",
        "import triton.language as tl",
        *("\n\n" + function_source(lines, f) for f in functions),
        "",
    ])


def version_of(source) -> dict:
    """vLLM's version and commit as its generated vllm/_version.py states them
    (wheels and built checkouts have one); {} where there is none."""
    try:
        text = source.read("vllm/_version.py")
    except (FileNotFoundError, OSError):
        return {}
    found = {key: pattern.search(text) for key, pattern in (("version", VERSION),
                                                             ("commit_id", COMMIT))}
    return {key: match.group(1) for key, match in found.items() if match}


def license_text(source) -> str:
    """vLLM's LICENSE: at a checkout's root, or in a wheel's .dist-info."""
    def candidates():
        yield "LICENSE"
        for name in source.names(""):
            if name.endswith(".dist-info"):
                yield from (f"{name}/licenses/LICENSE", f"{name}/LICENSE")

    for path in candidates():
        try:
            return source.read(path)
        except (FileNotFoundError, OSError):
            continue
    raise ValueError("source: no LICENSE found (vLLM's Apache-2.0 license must go with its code)")


def vendor(source_path: Path, out: Path) -> dict:
    """Writes the kernels' modules, the matching configs, LICENSE,
    triton_kernels (where the source has it) and vendored.json (where they
    came from) into `out`, replacing what the folder held; returns the
    provenance."""
    source = open_source(source_path)
    provenance = {**source.describe(), **version_of(source)}
    origin = f"vLLM {provenance.get('version', 'of unknown version')}, {provenance['kind']}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "configs").mkdir(exist_ok=True)
    for stale in [*out.glob("*.py"), *(out / "configs").glob("*.json")]:
        stale.unlink()
    for module, (path, wanted) in KERNELS.items():
        text = standalone_module(source.read(path), wanted, path, origin)
        (out / f"{module}.py").write_text(text)
    configs = [name for name in source.names(CONFIGS) if CONFIG_NAME.fullmatch(name)]
    for name in configs:
        (out / "configs" / name).write_text(source.read(f"{CONFIGS}/{name}"))
    (out / "LICENSE").write_text(license_text(source))
    provenance["configs"] = configs
    provenance["triton_kernels"] = copy_triton_kernels(source, out / "triton_kernels")
    (out / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")
    return provenance


def copy_triton_kernels(source, out: Path) -> int:
    """Copies the Python files of vLLM's triton_kernels into `out` (replacing
    it), verbatim; the number copied (0: the source has none)."""
    shutil.rmtree(out, ignore_errors=True)
    copied = [path for path in source.files(TRITON_KERNELS) if path.endswith(".py")]
    for path in copied:
        target = out / Path(path).relative_to(TRITON_KERNELS)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read(path))
    return len(copied)


def missing(folder: Path) -> list:
    """What `folder` lacks of what vendor() writes."""
    wanted = [f"{module}.py" for module in KERNELS] + [PROVENANCE, "configs"]
    return [name for name in wanted if not (folder / name).exists()]


def load(folder: Path) -> SimpleNamespace:
    """The vendored kernels of `folder`, imported with this process's Triton:
    fused_moe_kernel, its parameters' names (fused_moe_params: vLLM's releases
    differ, SWAP_AB and USE_TD in 0.33 and not on its main branch of
    2026-11), per_token_group_quant (vLLM's _per_token_group_quant_fp8),
    bfloat16 (Triton's, the kernels' compute_type), configs (the folder of
    tuned configs), provenance (vendored.json) and triton_version."""
    import triton
    import triton.language as tl

    modules = {}
    for module in KERNELS:
        spec = importlib.util.spec_from_file_location(f"gg_bench_vllm_{module}",
                                                      folder / f"{module}.py")
        modules[module] = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = modules[module]
        spec.loader.exec_module(modules[module])
    return SimpleNamespace(
        fused_moe_kernel=modules["fused_moe_kernel"].fused_moe_kernel,
        fused_moe_params=frozenset(modules["fused_moe_kernel"].fused_moe_kernel.arg_names),
        per_token_group_quant=modules["fp8_quant_kernel"]._per_token_group_quant_fp8,
        bfloat16=tl.bfloat16, configs=folder / "configs",
        provenance=load_provenance(folder),
        triton_version=triton.__version__)


def load_provenance(folder: Path) -> dict:
    """What vendor() wrote of where `folder`'s copies came from."""
    return json.loads((folder / PROVENANCE).read_text())


def load_triton_kernels(folder: Path):
    """The triton_kernels package vendored into `folder`, imported with this
    process's Triton (`folder` goes first on sys.path); None where `folder`
    has none."""
    if not (folder / "triton_kernels" / "matmul_ogs.py").is_file():
        return None
    sys.path.insert(0, str(folder))
    return importlib.import_module("triton_kernels")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.vendor_vllm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path,
                        help="a vLLM checkout, a git directory of one, or a vLLM wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"the ignored folder to write (default: {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    try:
        provenance = vendor(args.source, args.out)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    print(f"wrote {args.out}: {', '.join(KERNELS)} ({provenance['kind']}, "
          f"vLLM {provenance.get('version', 'version unknown')}), "
          f"{len(provenance['configs'])} configs, {provenance['triton_kernels']} files of "
          "triton_kernels")


if __name__ == "__main__":
    main()
