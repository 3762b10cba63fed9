"""Whether a kernels folder can stand for compiling the kernels here:

    python -m aot.prebuilt KERNELS_DIR TRITON_VERSION

exits 0 when KERNELS_DIR/manifest.json records a whole build (no --only) by
TRITON_VERSION from these very sources (aot/sources.py), else 1; one line
says which.  Needs no Triton: make build asks it first, so that a machine
without the pinned Triton and without network (the GPU machines) builds the
wheel from kernels compiled elsewhere and copied into build/aot."""
import json
import sys
from pathlib import Path

from .sources import sources_digest


def reason_to_compile(kernels: Path, triton_version: str) -> str:
    """'' when the folder's kernels are current, else why they are not."""
    path = kernels / "manifest.json"
    if not path.exists():
        return f"no {path}"
    manifest = json.loads(path.read_text())
    compiler = manifest.get("triton_version")
    if compiler != triton_version:
        return f"{path} was compiled by Triton {compiler}, not {triton_version}"
    if manifest.get("partial", True):
        return f"{path} is a partial build (--only)"
    if manifest.get("sources_sha256") != sources_digest():
        return f"{path} was compiled from other sources than aot/'s"
    return ""


def main(argv: list) -> int:
    kernels, triton_version = Path(argv[0]), argv[1]
    reason = reason_to_compile(kernels, triton_version)
    if reason:
        print(f"kernels to compile: {reason}")
        return 1
    print(f"kernels: reusing {kernels} (Triton {triton_version}, current sources)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
