"""Builds the wheel: the pybind11 extension from csrc/ plus the kernel table
and cubins that `python -m aot build` wrote (GG_AOT_DIR, default build/aot/kernels),
and, where torch is installed, the torch bridge from csrc/torch/ (built
against that torch; the package loads it only under the same version).
Needs no GPU and no Triton; `make build` runs both steps."""
import json
import os
import shutil
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
# The torch release and C++ ABI the bridge was built against, shipped beside it
# (gg_runtime/_native.py reads it).
TORCH_BUILT_FILE = "_torch_C.json"
AOT_DIR = Path(os.environ.get("GG_AOT_DIR", ROOT / "build" / "aot" / "kernels")).resolve()


def require_aot_outputs() -> None:
    if not (AOT_DIR / "kernel_table.inc").exists():
        raise SystemExit(f"{AOT_DIR}/kernel_table.inc is missing: run `python -m aot build` "
                         "first (or `make build`, which does both)")


class BuildPyWithKernels(build_py):
    """Ships the manifest and the binaries it names (each variant's cubin, and
    PTX where the manifest records one) as package data under gg_runtime/_kernels."""

    def run(self):
        require_aot_outputs()
        super().run()
        target = Path(self.build_lib) / "gg_runtime" / "_kernels"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        manifest = json.loads((AOT_DIR / "manifest.json").read_text())
        names = {"manifest.json"}
        for record in manifest["variants"]:
            names.update(name for name in (record["cubin"], record["ptx"]) if name)
        for name in sorted(names):
            shutil.copy2(AOT_DIR / name, target / name)
        if TORCH is not None:
            built = {"torch": TORCH.__version__.split("+")[0],
                     "cxx11_abi": TORCH.compiled_with_cxx11_abi()}
            (target.parent / TORCH_BUILT_FILE).write_text(json.dumps(built))


def torch_or_none():
    try:
        import torch
    except ImportError:
        print("setup.py: torch is not installed: building without gg_runtime._torch_C "
              "(grouped_gemm and grouped_mm then read tensors in Python)")
        return None
    return torch


def torch_bridge(torch) -> Extension:
    """gg_runtime._torch_C: links libtorch; needs no rpath, as torch is imported
    (and its libraries loaded) before it."""
    from torch.utils import cpp_extension
    abi = int(torch.compiled_with_cxx11_abi())
    return Extension(
        "gg_runtime._torch_C",
        sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "torch").glob("*.cc")),
        include_dirs=cpp_extension.include_paths(),
        library_dirs=cpp_extension.library_paths(),
        libraries=["c10", "torch", "torch_cpu", "torch_python"],
        depends=sorted(str(p) for p in (ROOT / "csrc").glob("**/*.h")),
        define_macros=[("_GLIBCXX_USE_CXX11_ABI", str(abi))],
        extra_compile_args=["-std=c++20", "-O2", "-Wall", "-fvisibility=hidden"],
        extra_link_args=["-s"],  # no debug info in the wheel (Python's flags add -g)
        language="c++",
    )


require_aot_outputs()
TORCH = torch_or_none()
extension = Pybind11Extension(
    "gg_runtime._C",
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cc")),
    include_dirs=[str(AOT_DIR)],
    # The generated table is #included: a new one must rebuild the extension.
    depends=[str(AOT_DIR / "kernel_table.inc")]
    + sorted(str(p) for p in (ROOT / "csrc").glob("*.h")),
    cxx_std=20,
    extra_compile_args=["-O2", "-Wall"],
    extra_link_args=["-s"],
    libraries=["dl"],
)

setup(
    name="gg_runtime",
    version="0.1.0",
    description="Grouped GEMM for NVIDIA GPUs from ahead-of-time compiled Triton kernels",
    long_description=(ROOT / "README.md").read_text(),
    long_description_content_type="text/markdown",
    keywords=["grouped gemm", "mixture of experts", "moe", "cuda", "triton", "torch"],
    classifiers=["Programming Language :: Python :: 3", "Programming Language :: C++",
                 "Operating System :: POSIX :: Linux", "Environment :: GPU :: NVIDIA CUDA",
                 "Topic :: Scientific/Engineering :: Artificial Intelligence"],
    packages=["gg_runtime"],
    ext_modules=[extension] + ([torch_bridge(TORCH)] if TORCH is not None else []),
    cmdclass={"build_py": BuildPyWithKernels},
    install_requires=["torch>=2.5", "click"],
    entry_points={"console_scripts": ["gg-runtime = gg_runtime.cli:run"]},
    python_requires=">=3.9",
    zip_safe=False,
)
