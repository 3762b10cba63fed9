"""The digest of what the kernels and the generated tables are made from:
every file of this package (kernels, families, variant rules, tuning tables,
code generation) but the modules that run beside the build.  Recorded in the
manifest by `python -m aot build`, so that kernels compiled on one machine can
be recognised as current on another (aot/prebuilt.py).  Needs no Triton."""
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
# Tuning (which writes tuning tables, themselves digested), the wheel's repair,
# this check's reader and the entry point: a change to them compiles nothing.
BESIDE_THE_BUILD = {"tune.py", "manylinux.py", "prebuilt.py", "__main__.py"}


def sources_digest(root: Path = PACKAGE) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                       and p.relative_to(root).as_posix() not in BESIDE_THE_BUILD):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()
