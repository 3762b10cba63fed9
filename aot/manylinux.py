"""The manylinux platform tag a built wheel can carry, read from its extension.

The extension links no CUDA and no torch library (it opens libcuda with dlopen
and takes tensors as integers), so what ties it to a Linux is glibc: the
newest GLIBC_2.N symbol version it needs makes it manylinux_2_N.  Any other
shared library it needs beyond those every manylinux system has is refused.
`auditwheel show` confirms the result where auditwheel is installed (tests/aot).
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# Libraries every manylinux policy allows an extension to need (PEP 600).
SYSTEM_LIBRARIES = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                    "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"}


def extension_facts(wheel: Path) -> tuple:
    """(needed libraries, glibc minor versions required) of the wheel's one
    extension module, from `objdump -p` (binutils: present wherever it was linked)."""
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        names = [n for n in archive.namelist() if n.endswith(".so")]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one extension module, found {names}")
        path = archive.extract(names[0], tmp)
        dump = subprocess.run(["objdump", "-p", path], capture_output=True, text=True,
                              check=True).stdout
    needed = set(re.findall(r"^\s*NEEDED\s+(\S+)$", dump, re.M))
    glibc = [int(v) for v in re.findall(r"\bGLIBC_2\.(\d+)\b", dump)]
    return needed, glibc


def platform_tag(wheel: Path, machine: str = "x86_64") -> str:
    needed, glibc = extension_facts(wheel)
    unknown = needed - SYSTEM_LIBRARIES
    if unknown:
        raise ValueError(f"the extension needs libraries no manylinux policy allows: {unknown}")
    if not glibc:
        raise ValueError("the extension names no GLIBC symbol version")
    return f"manylinux_2_{max(glibc)}_{machine}"


def retag(wheel: Path) -> Path:
    """Replace the wheel by one tagged manylinux_2_N; returns its path."""
    tag = platform_tag(wheel)
    out = subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove",
                          f"--platform-tag={tag}", str(wheel)],
                         capture_output=True, text=True, check=True)
    return wheel.parent / out.stdout.strip().splitlines()[-1]
