"""Compile variants with triton.compile for an explicit target (no GPU needed)."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler import ASTSource
from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction

from .families import FAMILIES
from .kernels.ws import max_registers
from .variants import Arch, Variant


class CompileError(RuntimeError):
    """A variant failed to compile; the message names the variant key."""


@dataclass
class Compiled:
    record: dict  # manifest entry (see codegen.py)
    cubin: bytes
    ptx: str
    kernel: object = None  # triton's CompiledKernel (launchable where a GPU is; used by tune)


def backend_options(variant: Variant):
    """Triton's CUDA backend for the variant's arch, and its compile options."""
    backend = CUDABackend(GPUTarget("cuda", variant.arch, 32))
    config = variant.config
    # FP fusion (FMA contraction) stated, not left to the release's default (3.10
    # turns it off).
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages,
               "num_ctas": config.ctas, "enable_fp_fusion": True}
    family = FAMILIES[variant.family]
    if config.ws:  # the MMA warps get what the loader's warpgroup gives back
        options["maxnreg"] = max_registers(config)
    elif config.max_registers or family.max_registers:
        options["maxnreg"] = config.max_registers or family.max_registers
    return backend, backend.parse_options(options)


def compile_variant(variant: Variant) -> Compiled:
    backend, options = backend_options(variant)
    config = variant.config
    family = FAMILIES[variant.family]
    kernel = family.ws_kernel if config.ws else family.kernel
    # A constexpr the kernel defaults (one only some variants set) takes its
    # default elsewhere: Triton compiles no parameter left out.
    constexprs = {**{p.name: p.default.value for p in kernel.params
                     if p.is_constexpr and p.has_default},
                  **variant.constexprs()}
    signature = dict(variant.signature())
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(i,): [["tt.divisibility", d]] for i, d in variant.divisible_params().items()}
    source_type = GluonASTSource if isinstance(kernel, GluonJITFunction) else ASTSource
    source = source_type(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        kernel = triton.compile(source, target=backend.target, options=options.__dict__)
    except Exception as exc:  # Triton raises many types; the key is what the user needs
        raise CompileError(f"compiling {variant.key} failed:\n{exc}") from exc
    meta = kernel.metadata
    if meta.num_ctas != config.ctas:  # the runtime launches clusters of the config's size
        raise CompileError(f"{variant.key}: num_ctas={meta.num_ctas}, the config's {config.ctas}")
    limit = Arch.of(variant.arch).shared_ceiling
    if meta.shared > limit:  # it could never load: fix the config (aot/variants.py _fitted)
        raise CompileError(f"{variant.key}: {meta.shared} bytes of shared memory, sm{variant.arch} "
                           f"variants may use {limit}")
    cubin = kernel.asm["cubin"]
    record = variant.describe()
    record.update(
        ptx=f"{variant.key}.ptx" if Arch.of(variant.arch).ptx else "",
        kernel_name=meta.name,
        num_warps=meta.num_warps,
        num_ctas=meta.num_ctas,
        shared=meta.shared,
        scratch_size=meta.global_scratch_size,
        scratch_align=meta.global_scratch_align,
        params=[[p.name, variant.signature()[p.name], p.role]
                for p in FAMILIES[variant.family].params],
        cubin=f"{variant.key}.cubin",
        cubin_sha256=hashlib.sha256(cubin).hexdigest(),
        cubin_size=len(cubin),
        triton_version=triton.__version__,
        **resource_usage(cubin),
    )
    return Compiled(record, cubin, kernel.asm["ptx"], kernel)


def sm80_twin(variant: Variant) -> Variant | None:
    """The sm80 variant whose PTX a later arch's variant of an sm80_ptx family
    is assembled from; None for the others."""
    if variant.arch == 80 or not FAMILIES[variant.family].sm80_ptx:
        return None
    return replace(variant, arch=80)


# What an assembled variant's record takes from its twin's: the kernel's own.
TWIN_FIELDS = ("kernel_name", "num_warps", "num_ctas", "shared", "scratch_size", "scratch_align",
               "params", "triton_version")


def assemble_variant(variant: Variant, twin_record: dict, twin_ptx: str) -> Compiled:
    """variant's cubin assembled by ptxas for its arch from its sm80 twin's PTX
    (PTX runs on every later arch); the rest of its record is the twin's, the
    kernel being the same."""
    backend, options = backend_options(variant)
    cubin = backend.make_cubin(twin_ptx, {}, options, variant.arch)
    record = variant.describe()
    record.update({name: twin_record[name] for name in TWIN_FIELDS})
    record.update(ptx=f"{variant.key}.ptx" if Arch.of(variant.arch).ptx else "",
                  cubin=f"{variant.key}.cubin",
                  cubin_sha256=hashlib.sha256(cubin).hexdigest(), cubin_size=len(cubin),
                  **resource_usage(cubin))
    return Compiled(record, cubin, twin_ptx)


def resource_usage(cubin: bytes) -> dict:
    """{"registers": per thread at launch, "stack": bytes of each thread's stack
    frame (where ptxas puts its spills)} of the cubin's kernel, as Triton's
    cuobjdump reads them: a spill shows here, on the machine that compiles,
    without a GPU."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage",
                                f.name], check=True, capture_output=True, text=True).stdout
    match = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if not match:
        raise CompileError(f"no resource usage in cuobjdump's output:\n{usage}")
    return {"registers": int(match.group(1)), "stack": int(match.group(2))}


def _compile_to(args) -> dict:
    variant, out_dir, keep_ptx, twin_record = args
    if twin_record:
        compiled = assemble_variant(variant, twin_record,
                                    (out_dir / twin_record["ptx"]).read_text())
    else:
        compiled = compile_variant(variant)
    compiled.kernel = None  # results cross a process boundary: keep them picklable
    (out_dir / compiled.record["cubin"]).write_bytes(compiled.cubin)
    if keep_ptx or compiled.record["ptx"]:
        (out_dir / f"{variant.key}.ptx").write_text(compiled.ptx)
    return compiled.record


def compile_all(variants: list, out_dir: Path, jobs: int, keep_ptx: bool = False,
                progress=None) -> list:
    """Compile every variant into out_dir; records come back in variant order.
    PTX is written for the archs that ship it (record["ptx"]), and for all with
    keep_ptx.  A variant whose sm80 twin is among them (sm80_twin) is assembled
    from the twin's PTX once the others are compiled.  progress(done) is called
    after each variant."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.pop("TRITON_OVERRIDE_ARCH", None)  # it would silently retarget every compile
    keys = {v.key for v in variants}
    assembled = [v for v in variants if (twin := sm80_twin(v)) and twin.key in keys]
    later = {v.key for v in assembled}
    compiled = [v for v in variants if v.key not in later]
    records = {}
    with ProcessPoolExecutor(max_workers=max(jobs, 1)) as pool:
        for stage in (compiled, assembled):
            work = [(v, out_dir, keep_ptx, records[sm80_twin(v).key] if v.key in later else None)
                    for v in stage]
            for variant, record in zip(stage, pool.map(_compile_to, work)):
                records[variant.key] = record
                if progress:
                    progress(len(records))
    return [records[v.key] for v in variants]


def ptx_entry_params(ptx: str) -> list:
    """PTX types of the .entry parameters, e.g. ['.u64', '.u32', ...]."""
    match = re.search(r"\.entry\s+\w+\s*\(([^)]*)\)", ptx, re.S)
    if not match:
        raise ValueError("no .entry in PTX")
    return [p.split()[1] for p in match.group(1).split(",") if p.strip()]
