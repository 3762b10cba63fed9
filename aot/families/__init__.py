"""Every kernel family the wheel contains, by name: one description per module."""
from . import list_gemm, ragged_k, ragged_m

FAMILIES = {f.name: f for f in (list_gemm.FAMILY, ragged_m.FAMILY, ragged_k.FAMILY)}
