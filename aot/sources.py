"""The digest of what the kernels are compiled from: every file of this
package (kernels, families, variant rules, tuning tables).  Recorded in the
manifest by `python -m aot build`, so that kernels compiled on one machine can
be recognised as current on another (aot/prebuilt.py).  Needs no Triton."""
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def sources_digest(root: Path = PACKAGE) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()
