"""How the tests and the bench start one process a GPU of this host:
torch.distributed.run, with NVLink multicast off in every process (the
project's multi-GPU rule: NCCL, torch's SymmetricMemory and NVSHMEM each
read their own switch when they start)."""
from __future__ import annotations

import os
import sys

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                "NVSHMEM_DISABLE_NVLS": "1"}


def ranks_command(world: int, *program: str) -> list:
    """The command that runs `program` (a script and its arguments, or `-m`
    and a module's) in `world` processes, one a GPU."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
            *program]


def ranks_env() -> dict:
    """This process's environment with multicast off, for ranks_command."""
    return {**os.environ, **NO_MULTICAST}
