"""The `gg-runtime` command (also `python -m gg_runtime`): what this build
contains and which path the current device takes."""
from __future__ import annotations

import json
import os
import sys

import click

from .info import info as gather_info


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def main(ctx):
    """gg_runtime: grouped GEMM from ahead-of-time compiled kernels.  Without a
    command: `info`."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(info)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def info(as_json: bool):
    """The build (Triton version, archs, dtypes, families, variants) and the device."""
    report = gather_info()
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    for section, values in report.items():
        click.echo(f"{section}:")
        width = max(map(len, values), default=0)
        for key, value in values.items():
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            click.echo(f"  {key:{width}}  {shown}")


def run():
    """Entry point: main(), quiet when the reader of a pipe goes away (| head)."""
    try:
        main()
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
