"""The manylinux platform tag a built wheel can carry, read from its extensions;
`python -m aot.manylinux WHEEL` retags the wheel with it (make build; needs the
`wheel` package, no Triton).

gg_runtime._C links no CUDA and no torch library (it opens libcuda with dlopen);
gg_runtime._ops links the two torch libraries that export torch's stable ABI,
which the torch dependency provides (torch is imported before it).
So what ties the wheel to a Linux is glibc: the newest GLIBC_2.N symbol version
they need makes it manylinux_2_N.  Any other shared library is refused.
`auditwheel show` confirms the result where auditwheel is installed (tests/aot),
told that torch's libraries come with torch.
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


# Libraries of the torch dependency that gg_runtime._ops (only) may need.
TORCH_LIBRARIES = {"libtorch_cpu.so"}
ALLOWED = {"gg_runtime/_C": SYSTEM_LIBRARIES,
           "gg_runtime/_ops": SYSTEM_LIBRARIES | TORCH_LIBRARIES}


def extension_facts(wheel: Path) -> dict:
    """{module path: (needed libraries, glibc minor versions required)} of the
    wheel's extension modules, from `objdump -p` (binutils: present wherever
    they were linked)."""
    facts = {}
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        for name in (n for n in archive.namelist() if n.endswith(".so")):
            dump = subprocess.run(["objdump", "-p", archive.extract(name, tmp)],
                                  capture_output=True, text=True, check=True).stdout
            needed = set(re.findall(r"^\s*NEEDED\s+(\S+)$", dump, re.M))
            glibc = [int(v) for v in re.findall(r"\bGLIBC_2\.(\d+)\b", dump)]
            facts[name.split(".")[0]] = needed, glibc
    return facts


def platform_tag(wheel: Path, machine: str = "x86_64") -> str:
    facts = extension_facts(wheel)
    if set(facts) != set(ALLOWED):
        raise ValueError(f"{wheel}: unexpected extension modules {sorted(facts)}")
    for module, (needed, glibc) in facts.items():
        unknown = needed - ALLOWED[module]
        if unknown:
            raise ValueError(f"{module} needs libraries no manylinux policy allows: {unknown}")
        if not glibc:
            raise ValueError(f"{module} names no GLIBC symbol version")
    return f"manylinux_2_{max(max(glibc) for _, glibc in facts.values())}_{machine}"


def retag(wheel: Path) -> Path:
    """Replace the wheel by one tagged manylinux_2_N; returns its path."""
    tag = platform_tag(wheel)
    out = subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove",
                          f"--platform-tag={tag}", str(wheel)],
                         capture_output=True, text=True, check=True)
    return wheel.parent / out.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    print(retag(Path(sys.argv[1])))
