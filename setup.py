"""Builds the wheel: the torch-free pybind11 core from csrc/ with the kernel table
and cubins that `python -m aot build` wrote (GG_AOT_DIR, default build/aot/kernels),
and the torch operators from csrc/ops/ on torch's stable ABI (one binary for
every torch release from OLDEST_TORCH on).  Needs torch's headers, no GPU and
no Triton; `make build` runs both steps."""
import json
import os
import shutil
from pathlib import Path

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).parent.resolve()
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


# The oldest torch whose stable ABI has what csrc/ops uses: the operators are
# compiled against it (TORCH_TARGET_VERSION), so the one binary loads under it
# and every later release; the wheel's metadata requires it.
OLDEST_TORCH = (2, 10)


def torch_operators() -> Extension:
    """gg_runtime._ops: the torch operators (csrc/ops/) on torch's stable ABI,
    built against the installed torch's headers for OLDEST_TORCH.  Needs no
    rpath: torch is imported (its libraries loaded) before it."""
    try:
        from torch.utils import cpp_extension
    except ImportError:
        raise SystemExit("setup.py: building gg_runtime needs torch >= "
                         f"{'.'.join(map(str, OLDEST_TORCH))} (its headers and libraries)"
                         ) from None
    major, minor = OLDEST_TORCH
    return Extension(
        "gg_runtime._ops",
        sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "ops").glob("*.cc")),
        include_dirs=[str(AOT_DIR), *cpp_extension.include_paths()],
        library_dirs=cpp_extension.library_paths(),
        libraries=["torch_cpu"],  # exports the stable ABI's C functions
        depends=[str(AOT_DIR / "family_args.h")]
        + sorted(str(p) for p in (ROOT / "csrc").glob("**/*.h")),
        define_macros=[("TORCH_TARGET_VERSION", f"0x{major:02x}{minor:02x}000000000000")],
        extra_compile_args=["-std=c++20", "-O2", "-Wall", "-Werror=missing-field-initializers",
                            "-Werror=switch",
                            "-fvisibility=hidden"],
        # No debug info in the wheel (Python's flags add -g).  Where a toolchain links
        # its C++ library statically, keep that copy's symbols out of the process's
        # namespace (two copies in one process crash).
        extra_link_args=["-s", "-Wl,--exclude-libs,ALL"],
        language="c++",
    )


require_aot_outputs()
# The C++ files compile in parallel, one a core (GG_BUILD_JOBS overrides it).
ParallelCompile("GG_BUILD_JOBS").install()
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
    packages=["gg_runtime", "gg_runtime.moe", "gg_runtime.testing"],
    ext_modules=[extension, torch_operators()],
    cmdclass={"build_py": BuildPyWithKernels},
    install_requires=[f"torch>={'.'.join(map(str, OLDEST_TORCH))}", "click"],
    entry_points={"console_scripts": ["gg-runtime = gg_runtime.cli:run"]},
    python_requires=">=3.10",
    zip_safe=False,
)
