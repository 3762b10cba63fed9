"""Expert parallelism's transport within a host: one symmetric buffer a
process group (torch's SymmetricMemory allocates it on every rank and gives
each rank every peer's address), regions of it for rows, their metadata and
the counts, and the send_rows operator that stores rows straight into the
peers' regions.  A send is bracketed by two device-side barriers: the first
waits until every rank has finished reading what the region held, the
second until every rank's rows have landed.  Nothing waits for the host."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._native import OPS, call

# Regions start on this many bytes, so that send_rows' aligned stores hold.
ALIGN = 256
WORD = torch.bfloat16  # what send_rows copies: 2-byte words


def words(t: torch.Tensor) -> torch.Tensor:
    """A 2-D tensor of 2-, 4- or 8-byte elements as rows of 2-byte words: what
    send_rows copies, bit for bit."""
    return t.contiguous().view(WORD)


class Region:
    """`rows` rows of `width` 2-byte words, at `offset` bytes into every rank's
    buffer: this rank's as a tensor, and every rank's address (send_rows'
    peers table)."""

    def __init__(self, buffer: SymmetricBuffer, offset: int, rows: int, width: int):
        self.local = buffer.tensor[offset:offset + rows * width * 2].view(WORD).view(rows, width)
        self.peers = buffer.addresses + offset

    def send(self, rows: torch.Tensor, ranks: torch.Tensor, dest: torch.Tensor):
        """Row r of `rows` (2-D, `width` words each) to row dest[r, c] of rank
        ranks[r, c]'s region, for each c with dest[r, c] >= 0."""
        call(OPS.send_rows.default, rows, self.peers, ranks, dest)


class SymmetricBuffer:
    """`nbytes` bytes on every rank of `group`, each rank's addressable by all."""

    def __init__(self, group: dist.ProcessGroup, nbytes: int, device: torch.device):
        from torch.distributed import _symmetric_memory as symmetric_memory

        self.nbytes = nbytes
        self.tensor = symmetric_memory.empty(nbytes, dtype=torch.uint8, device=device)
        self.handle = symmetric_memory.rendezvous(self.tensor, group.group_name)
        self.addresses = torch.tensor(self.handle.buffer_ptrs, dtype=torch.int64, device=device)

    def regions(self, *shapes: tuple[int, int]) -> list[Region]:
        """Consecutive regions of (rows, width) words, each ALIGN-aligned."""
        found, offset = [], 0
        for rows, width in shapes:
            found.append(Region(self, offset, rows, width))
            offset += aligned_bytes(rows, width)
        assert offset <= self.nbytes, "the buffer was sized for fewer bytes"
        return found

    def barrier(self):
        """Every rank's stream reaches this point before any goes past it."""
        self.handle.barrier(channel=0)


def aligned_bytes(rows: int, width: int) -> int:
    """The bytes a region of rows x width words takes, rounded up to ALIGN."""
    return -(-rows * width * 2 // ALIGN) * ALIGN
