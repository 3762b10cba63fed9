"""Expert parallelism's transport: one buffer a process group on every rank,
carved into regions (rows and their metadata), each region W
blocks, block s the rows rank s sent.  A send puts rows into blocks of the
peers' regions; two ways, one interface:

- `SymmetricBuffer` (one host): torch's SymmetricMemory allocates the
  buffer on every rank and gives each rank every peer's address; the
  send_rows operator stores rows straight into the peers' regions
  (send_fp8_rows quantizing 16-bit tokens per 128 columns on the way).  A send
  ends in a device-side barrier (every rank's rows have landed).  A peer
  may store into a region only once every rank has finished reading what
  it held (and has cleared it, where the rows not sent must read blank):
  the buffer keeps, on the host, the bytes that may still be read (or were
  cleared) since the last barrier, and a send into any of them waits at a
  barrier first.  Rows made for other ranks are not sent back: each rank
  writes them into its own region and, after a barrier, each rank reads its
  tokens' rows from the peers' regions and sums them (`summed`).  A call's
  tokens and outputs have regions of their own, and each call reads what
  came before the next transfer, so in a run of calls no send waits first.
- `NcclBuffer` (any ranks, across hosts too): the rows are placed in a
  staging copy of the region's blocks on the sender and moved by NCCL's
  all_to_all_single, every block whole (equal splits: no counts from the
  host); NCCL orders the ranks, the barriers are no-ops.

Nothing waits for the host."""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._native import OPS, call
from ..api import quantize_fp8
from ..formats import ROW_BLOCKS

# Regions start on this many bytes, so that send_rows' aligned stores hold.
ALIGN = 256
# How long a rank's stream waits at a barrier for the others: torch.distributed's
# default collective timeout.  A rank that never arrives (an error raised on that
# rank alone, a rank that stopped) then ends the wait: torch prints which rank
# was not heard from and the kernel traps (a CUDA error on the waiting ranks).
BARRIER_TIMEOUT_MS = 10 * 60 * 1000
WORD = torch.bfloat16  # what send_rows copies: 2-byte words
SEND_PARTS = 3  # the row sets a send_rows launch takes (a token, its scales, its metadata)


def words(t: torch.Tensor) -> torch.Tensor:
    """A 2-D tensor of 2-, 4- or 8-byte elements as rows of 2-byte words: what
    a send copies, bit for bit."""
    return t.contiguous().view(WORD)


class Region:
    """`rows` rows of `width` 2-byte words, at `offset` bytes into every rank's
    buffer, in W blocks of rows / W: this rank's as a tensor (`local`).
    `blank`, a 16-bit word: what the rows no rank sends hold after a
    transfer into the region once `Buffer.cleared`."""

    def __init__(self, buffer: Buffer, offset: int, rows: int, width: int, blank: int):
        self.buffer, self.offset, self.blank = buffer, offset, blank
        self.span = (offset, offset + rows * width * 2)
        self.local = buffer.tensor[offset:offset + rows * width * 2].view(WORD).view(rows, width)
        self.peers = buffer.peers(offset)


class Buffer:
    """What the transports share: the group, the bytes, the regions, and
    which of them a peer may store into now (`transfer`).  A transport gives
    `clear(region)` (its rows blank), `wait()` (every rank's stream meets),
    `summed(parts, index, first_row)` (each token's rows, made by the ranks
    into their own regions, summed at its rank) and
    `send(sends, ranks, dest, blocks)`: for each (region, rows)
    of `sends` (at most SEND_PARTS, rows 2-D, the region's width in words
    each, a row for each of the first's), row r of rows to row dest[r, c] of
    rank ranks[r, c]'s region, for each c with dest[r, c] >= 0: a row of
    this rank's block there (dest // (rows / W) is this rank).  Rows in
    `blocks` equal blocks, each going to another rank, are stored into all
    of them at once.  It may also give its own `send_quantized` (16-bit
    tokens quantized on the way; here, quantize_fp8 and then `send`)."""

    def __init__(self, group: dist.ProcessGroup, nbytes: int, tensor: torch.Tensor):
        self.group, self.nbytes, self.tensor = group, nbytes, tensor
        # Byte spans a peer must not store into before the next barrier: True
        # while rows that landed there are still to be read, False once their
        # reads (or a clear) are issued, before that barrier in stream order.
        self.unfenced: dict[tuple[int, int], bool] = {}
        self.blank: set[tuple[int, int]] = set()  # spans cleared, not stored into since

    def transfer(self, sends, ranks, dest, blocks=1):
        """`send`, then a barrier (every rank's rows landed); a barrier first
        where a region of `sends` may still be read on some rank."""
        self._fenced([region for region, _ in sends],
                     lambda: self.send(sends, ranks, dest, blocks))

    def transfer_quantized(self, x, granularity, values, scales, sends, ranks, dest):
        """transfer's, for 16-bit tokens x [R, H] travelling in fp8: their
        values quantized as quantize_fp8 quantizes them at `granularity` into
        the region `values` (rows of H bytes), their scales into `scales`
        (rows of the scales a token), with `sends` (one row set)."""
        self._fenced([values, scales, *(region for region, _ in sends)],
                     lambda: self.send_quantized(x, granularity, values, scales, sends, ranks,
                                                 dest))

    def send_quantized(self, x, granularity, values, scales, sends, ranks, dest):
        """The tokens quantized (a launch of its own), then sent as rows."""
        q, scale, _ = quantize_fp8(x, granularity)
        per_token = scale.view(x.shape[0], scales.local.shape[1] // 2)  # float32s: 2 words
        self.send(((values, words(q)), (scales, words(per_token)), *sends), ranks, dest)

    def _fenced(self, regions, send):
        """send() into `regions`, between the barriers transfer describes."""
        spans = [region.span for region in regions]
        if any(_overlap(span, held) for span in spans for held in self.unfenced):
            self.barrier()
        send()
        self.barrier()
        self._stored(*spans)
        self.unfenced.update(dict.fromkeys(spans, True))

    def _stored(self, *spans):
        self.blank = {held for held in self.blank if not any(_overlap(held, s) for s in spans)}

    def consumed(self, *regions: Region):
        """The reads of these regions' rows are issued: the next barrier
        (later in stream order) frees them for the peers' stores."""
        for region in regions:
            self.unfenced[region.span] = False

    def claimed(self, region: Region):
        """Before this rank stores into `region` itself: a barrier first where
        a rank may still read what it holds (the peers, summing it); what
        was blank there no longer is."""
        if any(_overlap(region.span, held) for held in self.unfenced):
            self.barrier()
        self._stored(region.span)

    def cleared(self, region: Region):
        """`region`'s rows read `blank` until a peer stores into them: cleared
        here unless still blank (before the barrier a send into it waits at)."""
        if region.span not in self.blank:
            self.clear(region)
            self.blanked(region)

    def blanked(self, region: Region):
        """`region` was made blank on this rank's stream (by `clear`, or by a
        kernel that read it): a peer's send into it waits for the next barrier."""
        self.blank.add(region.span)
        self.consumed(region)

    def barrier(self):
        """Every rank's stream reaches this point before any goes past it (the
        transport's `wait`); what was read by then is free."""
        self.wait()
        self.unfenced = {span: live for span, live in self.unfenced.items() if live}

    def peers(self, offset: int) -> torch.Tensor | None:
        """Where byte `offset` of every rank's buffer is, for the sends, or
        None where the transport does not address peers."""
        return None

    def regions(self, *shapes: tuple[int, int, int], start: int = 0) -> list[Region]:
        """Consecutive regions of (rows, width, blank) words from byte `start`
        (a multiple of ALIGN), each ALIGN-aligned."""
        found, offset = [], start
        for rows, width, blank in shapes:
            found.append(Region(self, offset, rows, width, blank))
            offset += aligned_bytes(rows, width)
        assert offset <= self.nbytes, "the buffer was sized for fewer bytes"
        return found


class SymmetricBuffer(Buffer):
    """`nbytes` bytes on every rank of `group`, each rank's addressable by all
    (the GPUs of one host)."""

    def __init__(self, group: dist.ProcessGroup, nbytes: int, device: torch.device):
        from torch.distributed import _symmetric_memory as symmetric_memory

        # Zeroed: a row no rank sent is read in place, never multiplied, but finite.
        super().__init__(group, nbytes,
                         symmetric_memory.empty(nbytes, dtype=torch.uint8, device=device).zero_())
        self.handle = symmetric_memory.rendezvous(self.tensor, group.group_name)
        self.addresses = torch.tensor(self.handle.buffer_ptrs, dtype=torch.int64, device=device)

    def peers(self, offset: int) -> torch.Tensor:
        """[W] int64, made once a region: a call launches no arithmetic for it."""
        return self.addresses + offset

    def send(self, sends, ranks, dest, blocks=1):
        """One send_rows launch for every row set of `sends`."""
        assert len(sends) <= SEND_PARTS, "send_rows takes at most SEND_PARTS row sets"
        (region, rows), *more = sends
        call(OPS.send_rows.default, rows, region.peers, ranks, dest, blocks,
             *(a for part, part_rows in more for a in (part_rows, part.peers)))

    def send_quantized(self, x, granularity, values, scales, sends, ranks, dest):
        """Per 128 columns: one send_fp8_rows launch, the tokens quantized on
        the way (per token: Buffer's, a launch before the send)."""
        if granularity != ROW_BLOCKS:
            return super().send_quantized(x, granularity, values, scales, sends, ranks, dest)
        (region, rows), = sends
        call(OPS.send_fp8_rows.default, x, values.peers, scales.peers, ranks, dest, rows,
             region.peers)

    def clear(self, region: Region):
        """The peers store only the rows they send: the rest is set here."""
        region.local.view(torch.int16).fill_(region.blank)

    def summed(self, parts, index, first_row):
        """For each (region, dtype) of `parts` (rows a rank made for the ranks'
        tokens, block s rank s's, written by every rank into its own region):
        this rank's tokens' rows, row first_row + t of the regions of the
        ranks r with index[t, r] >= 0, summed in float32 ([T, width] of
        dtype): read from the peers' regions once every rank has written
        its own (a barrier)."""
        self.barrier()
        sums = [call(OPS.sum_peer_rows.default, region.local.view(dtype), region.peers, index,
                     first_row) for region, dtype in parts]
        # The peers read these regions before their next barrier.
        self.consumed(*(region for region, _ in parts))
        return sums

    def wait(self):
        """Every rank's stream reaches this point before any goes past it, or
        BARRIER_TIMEOUT_MS passes (then a CUDA error, the late rank named)."""
        self.handle.barrier(channel=0, timeout_ms=BARRIER_TIMEOUT_MS)


class NcclBuffer(Buffer):
    """`nbytes` bytes on every rank of `group`, filled by NCCL's all-to-all."""

    def __init__(self, group: dist.ProcessGroup, nbytes: int, device: torch.device):
        super().__init__(group, nbytes, torch.zeros(nbytes, dtype=torch.uint8, device=device))

    def send(self, sends, ranks, dest, blocks=1):
        """Each row set's rows into their places in a staging copy of the
        peers' blocks (the others blank; a last row takes the rows not sent),
        then every block to its rank (NCCL orders the transfers: blocks does
        not matter)."""
        world, rank = self.group.size(), self.group.rank()
        for region, rows in sends:
            block = region.local.shape[0] // world
            staging = rows.view(torch.int16).new_full((world * block + 1, rows.shape[1]),
                                                       region.blank).view(rows.dtype)
            place = torch.where(dest >= 0, ranks.long() * block + dest - rank * block,
                                world * block)
            for c in range(dest.shape[1]):
                staging.index_copy_(0, place[:, c], rows)
            dist.all_to_all_single(region.local, staging[:-1], group=self.group)

    def clear(self, region: Region):
        """Every block travels whole, the rows not sent blank (send)."""

    def summed(self, parts, index, first_row):
        """SymmetricBuffer.summed's sums: each region's blocks moved to their
        ranks by NCCL's all-to-all, then each token's planes summed."""
        world = self.group.size()
        sent = (index >= 0).T[:, :, None]  # [W, T, 1]
        sums = []
        for region, dtype in parts:
            planes = torch.empty_like(region.local)
            dist.all_to_all_single(planes, region.local, group=self.group)
            planes = planes.view(dtype)
            planes = planes.view(world, -1, planes.shape[1])
            sums.append(torch.where(sent, planes[:, :index.shape[0]].float(), 0.0).sum(0)
                        .to(dtype))
        return sums

    def wait(self):
        """NCCL orders the ranks' transfers itself."""


TRANSPORTS = {"symmetric_memory": SymmetricBuffer, "nccl": NcclBuffer}


def _overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def aligned_bytes(rows: int, width: int) -> int:
    """The bytes a region of rows x width words takes, rounded up to ALIGN."""
    return -(-rows * width * 2 // ALIGN) * ALIGN
