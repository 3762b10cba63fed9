"""`python -m aot build | list | tune`: the build-time command line."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import click

from . import codegen
from .compile import CompileError, compile_all
from .sources import sources_digest
from .variants import all_variants

DEFAULT_OUT = Path("build/aot")


@click.group()
def main():
    """Ahead-of-time compiler for gg_runtime's Triton kernels."""


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="Folder for cubins, manifest.json and kernel_table.inc.")
@click.option("--jobs", type=int, default=os.cpu_count() or 1, show_default=True,
              help="Compiler processes.")
@click.option("--only", default="", help="Compile only variants whose key contains this text.")
@click.option("--keep-ptx", is_flag=True, help="Also write each variant's PTX.")
@click.option("--one-per-path", is_flag=True,
              help="Compile one variant of each code path (Variant.path), not every dtype and "
                   "tile size: how another Triton release is checked (make kernels-check).")
def build(out: Path, jobs: int, only: str, keep_ptx: bool, one_per_path: bool):
    """Compile every variant for sm80 and sm90 and generate the runtime's kernel table."""
    import triton

    # The sources the variants are compiled from, as they are now (not as an
    # edit made during a long build leaves them).
    digest = sources_digest()
    variants = [v for v in all_variants() if only in v.key]
    if one_per_path:
        first = {}
        for variant in variants:
            first.setdefault(variant.path, variant)
        variants = list(first.values())
    if not variants:
        raise click.ClickException(f"no variant key contains {only!r}")
    kernels = out / "kernels"
    shutil.rmtree(kernels, ignore_errors=True)
    # A build-local cache keeps rebuilds fast without touching ~/.triton.
    os.environ.setdefault("TRITON_CACHE_DIR", str((out / "triton-cache").resolve()))
    started = time.time()

    def progress(done: int):
        if done % 25 == 0 or done == len(variants):
            click.echo(f"  {done}/{len(variants)} variants compiled, {time.time() - started:.0f} s")

    click.echo(f"compiling {len(variants)} variants with {jobs} jobs (Triton {triton.__version__})")
    try:
        records = compile_all(variants, kernels, jobs, keep_ptx, progress)
    except CompileError as exc:
        raise click.ClickException(str(exc)) from exc
    codegen.write_outputs(records, kernels, triton.__version__, partial=bool(only) or one_per_path,
                          sources_sha256=digest)
    size = sum(r["cubin_size"] for r in records)
    click.echo(f"compiled {len(records)} variants ({size / 1e6:.1f} MB of cubins) "
               f"in {time.time() - started:.0f} s with {jobs} jobs -> {kernels}")
    spilling = sum(1 for r in records if r["stack"])
    click.echo(f"{spilling} of them spill (`python -m aot resources` lists them)")


@main.command()
@click.option("--out", type=click.Path(path_type=Path), default=DEFAULT_OUT, show_default=True,
              help="The folder `build` wrote.")
@click.option("--only", default="", help="Only variants whose key contains this text.")
def resources(out: Path, only: str):
    """Print each compiled variant's registers per thread and stack frame
    (bytes a thread spills), largest frames first: from the manifest, no GPU."""
    records = json.loads((out / "kernels" / "manifest.json").read_text())["variants"]
    chosen = [r for r in records if only in r["key"]]
    for record in sorted(chosen, key=lambda r: (-r["stack"], r["key"])):
        click.echo(f"{record['stack']:6d} {record['registers']:4d}  {record['key']}")


@main.command(name="list")
def list_variants():
    """Print the key of every variant the build compiles
    (family.smXX.dtypes.axis-values.flavour.config)."""
    for variant in all_variants():
        click.echo(variant.key)


@main.command()
@click.option("--dtype", type=click.Choice(["bfloat16", "float16"]), default="bfloat16",
              show_default=True)
def tune(dtype: str):
    """Measure candidate configs on this sm90 GPU and write aot/tuning/sm90.json."""
    from .tune import tune as run_tuning
    from .tune import write_table

    table = write_table(run_tuning(dtype, echo=click.echo))
    click.echo(f"wrote {table}; run `make build` to compile it")
