"""Builds the wheel: the pybind11 extension from csrc/ plus the kernel table
and cubins that `python -m aot build` wrote (GG_AOT_DIR, default build/aot/kernels).
Needs no GPU and no Triton; `make build` runs both steps."""
import json
import os
import shutil
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
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


require_aot_outputs()
extension = Pybind11Extension(
    "gg_runtime._C",
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "csrc").glob("*.cc")),
    include_dirs=[str(AOT_DIR)],
    # The generated table is #included: a new one must rebuild the extension.
    depends=[str(AOT_DIR / "kernel_table.inc")] + sorted(str(p) for p in (ROOT / "csrc").glob("*.h")),
    cxx_std=20,
    extra_compile_args=["-O2", "-Wall"],
    libraries=["dl"],
)

setup(
    name="gg_runtime",
    version="0.1.0",
    description="Grouped GEMM for NVIDIA GPUs from ahead-of-time compiled Triton kernels",
    packages=["gg_runtime"],
    ext_modules=[extension],
    cmdclass={"build_py": BuildPyWithKernels},
    install_requires=["torch>=2.4"],
    python_requires=">=3.9",
    zip_safe=False,
)
