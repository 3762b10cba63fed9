"""gg_runtime.moe.expert_parallel on CPU: its checks, and its plan (which
rows go where, their metadata, the return and both gradients) with W ranks
simulated by W threads, the transport by copies between their buffers
(poisoned with NaN: a stale row that is read shows), the barriers by a
threading barrier, and the experts and the combine by references, in
float64.  Against the reference layer with all the experts, outputs and
every gradient.  The GPU runs (test_gpu_expert_parallel.py) check the
kernels and the real transport."""
import threading
import time
from types import SimpleNamespace

import pytest
import torch

import gg_runtime.moe.exchange as exchange
import gg_runtime.moe.torchtitan_glue as torchtitan_glue
import gg_runtime.moe.expert_parallelism as ep
import gg_runtime.moe.transformers_glue as transformers_glue
import gg_runtime.moe.transport as transport
from gg_runtime.moe import ExpertParallelExperts, expert_parallel
from gg_runtime import Quantized
from gg_runtime._native import OPS, call
from gg_runtime.formats import FP8_WEIGHT_SCALINGS
from gg_runtime.testing.fp8 import quantize_ref
from gg_runtime.testing.moe_fp8 import dequantize64, dequantized_experts
from gg_runtime.testing.w4 import dequantize_mxfp4, random_mxfp4
from moe_reference import dispatch_plan_ref, layer_ref, received_slots_ref


class World:
    """W simulated ranks: their buffers, a barrier, an all-gather."""

    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.buffers = [None] * size
        self.gathered = [None] * size
        self.waits = [0] * size  # the transport's barriers each rank met

    def all_to_all_single(self, out, mine, group):
        """Block r of rank s's `mine` to block s of rank r's `out`."""
        self.gathered[group.rank()] = mine.clone()
        self.barrier.wait()
        out.copy_(torch.cat([m.chunk(self.size)[group.rank()] for m in self.gathered]))
        self.barrier.wait()

    def all_gather_into_tensor(self, out, mine, group):
        self.gathered[group.rank()] = mine.clone()
        self.barrier.wait()
        out.copy_(torch.stack(self.gathered))
        self.barrier.wait()

    def send_rows(self, rows, peers, ranks, dest, blocks, *more):
        """The operator's contract: rows, and each further (rows, peers) pair,
        to where dest says."""
        assert blocks >= 1 and rows.shape[0] % blocks == 0  # the operator's check
        assert len(more) % 2 == 0 and len(more) <= 4
        for part, table in ((rows, peers), *zip(more[::2], more[1::2])):
            assert part.shape[0] == rows.shape[0]
            width = part.shape[1] * 2
            for r, c in torch.nonzero(dest >= 0).tolist():
                address = int(table[ranks[r, c]]) + int(dest[r, c]) * width
                buffer = next(b for b in self.buffers
                              if b.data_ptr() <= address < b.data_ptr() + b.numel())
                start = address - buffer.data_ptr()
                buffer[start:start + width] = part[r].view(torch.uint8)

    def send_fp8_rows(self, x, peers, scale_peers, ranks, dest, meta, meta_peers):
        """The operator's contract: x quantized per 128 columns (quantize_fp8's
        1x128), its values, scales and meta to where dest says."""
        q, scale = quantize_ref(x, "1x128")
        self.send_rows(transport.words(q.view(torch.uint8)), peers, ranks, dest, 1,
                       transport.words(scale), scale_peers, meta, meta_peers)

    def sum_peer_rows(self, region, peers, index, first_row):
        """The operator's contract: each token's row first_row + t of the
        regions at peers[r] with index[t, r] >= 0, summed in float32 rank by
        rank."""
        assert region.is_contiguous() and peers.shape == (index.shape[1],)
        assert first_row >= 0 and first_row + index.shape[0] <= region.shape[0]
        width = region.shape[1] * region.element_size()
        out = torch.zeros(index.shape[0], region.shape[1])
        for t, r in torch.nonzero(index >= 0).tolist():
            address = int(peers[r]) + (first_row + t) * width
            buffer = next(b for b in self.buffers
                          if b.data_ptr() <= address < b.data_ptr() + b.numel())
            start = address - buffer.data_ptr()
            out[t] += buffer[start:start + width].view(region.dtype).float()
        return out.to(region.dtype)


class Group:
    def __init__(self, world, rank):
        self.world, self._rank, self.group_name = world, rank, f"simulated-{rank}"

    def size(self):
        return self.world.size

    def rank(self):
        return self._rank


@pytest.fixture
def simulated(monkeypatch):
    """A function that makes a World of W ranks, the module patched to use it."""
    worlds = []

    class Buffer(transport.SymmetricBuffer):
        def __init__(self, group, nbytes, device):
            world = group.world
            transport.Buffer.__init__(self, group, nbytes,
                                      torch.full((nbytes,), 0xFF, dtype=torch.uint8))  # NaNs
            self.world = world
            world.buffers[group.rank()] = self.tensor
            world.barrier.wait()
            self.addresses = torch.tensor([b.data_ptr() for b in world.buffers])
            world.barrier.wait()

        def wait(self):
            self.world.waits[self.group.rank()] += 1
            self.world.barrier.wait()

    def make(size):
        world = World(size)
        worlds.append(world)
        monkeypatch.setattr(exchange, "dist", SimpleNamespace(
            all_gather_into_tensor=world.all_gather_into_tensor))
        monkeypatch.setattr(transport, "OPS", SimpleNamespace(
            send_rows=SimpleNamespace(default=world.send_rows),
            send_fp8_rows=SimpleNamespace(default=world.send_fp8_rows),
            sum_peer_rows=SimpleNamespace(default=world.sum_peer_rows)))
        monkeypatch.setattr(transport, "dist", SimpleNamespace(
            all_to_all_single=world.all_to_all_single))
        monkeypatch.setitem(transport.TRANSPORTS, "symmetric_memory", Buffer)
        return world

    monkeypatch.setattr(ep, "resolved_group", lambda group: group)
    monkeypatch.setattr(ep, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(exchange, "_LAYOUTS", {})
    monkeypatch.setattr(exchange, "_BUFFERS", {})
    monkeypatch.setattr(ep, "moe_experts", reference_experts)
    monkeypatch.setattr(exchange, "OPS", SimpleNamespace(
        dispatch_plan=SimpleNamespace(default=dispatch_plan_ref),
        received_slots=SimpleNamespace(default=received_slots_ref)))
    return make


def reference_experts(x, topk_ids, topk_weights, w13, w2, out=None, **options):
    """moe_experts' contract in float64 (rounded to x's dtype), differentiable."""
    assert not any(v is not None for k, v in options.items() if k not in ("gate_up", "activation"))
    return written(layer_ref(x.double(), topk_ids, topk_weights.double(), w13.double(),
                             w2.double()), out, x.dtype)


def written(got, out, dtype):
    """moe_experts' result: got in dtype, or written into out (inference only)."""
    if out is None:
        return got.to(dtype)
    assert out.dtype == dtype and not (torch.is_grad_enabled() and got.requires_grad)
    return out.copy_(got)


def on_every_rank(world, work):
    """work(rank) on W threads at once; their results, or the first error raised."""
    results, errors = [None] * world.size, []

    def run(rank):
        try:
            results[rank] = work(rank)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)
            world.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def global_case(counts, experts, k, hidden=24, inter=8, skew=False, dropped=False):
    total = sum(counts)
    scores = torch.rand(total, experts)
    if skew:
        scores[:, experts // len(counts):] -= 2
    weights, ids = scores.topk(k, dim=-1)
    if dropped:
        ids[::3, 0] = -1
        ids[1::4, -1] = experts + 2
        ids[2::5, -1] = 2 ** 33 + 1  # 1 if it were cast to int32
    return {"x": torch.randn(total, hidden).bfloat16(), "topk_ids": ids,
            "topk_weights": weights.softmax(-1),
            "w13": (torch.randn(experts, 2 * inter, hidden) * hidden ** -0.5).bfloat16(),
            "w2": (torch.randn(experts, hidden, inter) * inter ** -0.5).bfloat16()}


LEAVES = ("x", "topk_weights", "w13", "w2")


@pytest.mark.parametrize("counts, experts, k, options, max_tokens", [
    ((13, 7), 4, 2, {}, None),
    ((9, 0, 11), 6, 3, {}, 11),
    ((10, 10, 10, 10), 8, 8, {}, None),
    ((12, 5, 8, 3), 8, 3, {"skew": True}, 20),
    ((16, 16), 4, 3, {"dropped": True}, None),
    ((5,), 3, 2, {}, None),
])
@pytest.mark.parametrize("transport", ["symmetric_memory", "nccl"])
@pytest.mark.parametrize("chunks", [1, 3])
def test_outputs_and_gradients_match_all_the_experts_on_one_rank(simulated, counts, experts,
                                                                  k, options, max_tokens,
                                                                  transport, chunks):
    world = simulated(len(counts))
    case = global_case(counts, experts, k, **options)
    leaves = {n: case[n].double().requires_grad_() for n in LEAVES}
    want = layer_ref(**{**case, **leaves})
    grad = torch.randn_like(want).bfloat16()  # as a bfloat16 output's gradient comes
    want.backward(grad.double())
    share = experts // world.size

    def rank_work(rank):
        tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        mine = {"x": case["x"][tokens], "topk_ids": case["topk_ids"][tokens],
                "topk_weights": case["topk_weights"][tokens],
                "w13": case["w13"][rank * share:(rank + 1) * share],
                "w2": case["w2"][rank * share:(rank + 1) * share]}
        ours = {n: mine[n].clone().requires_grad_() for n in LEAVES}
        out = expert_parallel(**{**mine, **ours}, group=Group(world, rank),
                              max_tokens=max_tokens, transport=transport, chunks=chunks)
        out.backward(grad[tokens])
        return tokens, out, {n: ours[n].grad for n in LEAVES}

    for rank, (tokens, out, grads) in enumerate(on_every_rank(world, rank_work)):
        experts_here = slice(rank * share, (rank + 1) * share)
        pairs = [(out, want[tokens]), (grads["x"], leaves["x"].grad[tokens]),
                 (grads["topk_weights"], leaves["topk_weights"].grad[tokens]),
                 (grads["w13"], leaves["w13"].grad[experts_here]),
                 (grads["w2"], leaves["w2"].grad[experts_here])]
        for got, expected in pairs:
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), expected.detach(), rtol=2e-2, atol=2e-2,
                                       msg=lambda m, r=rank: f"rank {r}: {m}")


@pytest.mark.parametrize("differing, expected", [
    (lambda rank: {"share": 2 if rank else 1},
     ("disagree on experts per rank", "rank 0: experts per rank 1")),
    (lambda rank: {"chunks": 1 + rank}, ("disagree on chunks", "rank 1: chunks 2")),
], ids=["experts per rank", "chunks"])
def test_ranks_that_disagree_are_refused_on_every_rank(simulated, differing, expected):
    """Rank 0 holds one expert and rank 1 two, or they pass different chunks."""
    world = simulated(2)
    case = global_case((4, 4), 4, 2)

    def rank_work(rank):
        options = {"share": 2, "chunks": 1, **differing(rank)}
        share = options.pop("share")
        try:
            expert_parallel(case["x"][:4], case["topk_ids"][:4], case["topk_weights"][:4],
                            case["w13"][:share], case["w2"][:share], group=Group(world, rank),
                            **options)
        except ValueError as error:
            return str(error)
        return None

    messages = on_every_rank(world, rank_work)
    assert all(m and all(e in m for e in expected) for m in messages), messages


def test_more_tokens_than_the_first_call_is_refused_without_max_tokens(simulated):
    world = simulated(2)
    case = global_case((6, 6), 4, 2)

    def rank_work(rank):
        args = {n: case[n][:4] for n in ("x", "topk_ids", "topk_weights")}
        expert_parallel(**args, w13=case["w13"][:2], w2=case["w2"][:2], group=Group(world, rank))
        args = {n: case[n][:6] for n in ("x", "topk_ids", "topk_weights")}
        with pytest.raises(ValueError, match="more than the 4 a rank's share"):
            expert_parallel(**args, w13=case["w13"][:2], w2=case["w2"][:2],
                            group=Group(world, rank))

    on_every_rank(world, rank_work)


def test_no_process_group_is_a_value_error():
    x = torch.zeros(2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="process group"):
        expert_parallel(x, torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1),
                        torch.zeros(1, 4, 8), torch.zeros(1, 8, 2))


def test_send_rows_refuses_row_sets_without_their_peers_or_of_other_row_counts():
    """The operator's checks, on meta tensors (they launch nothing), its
    errors as gg_runtime's calls raise them."""
    def meta(*shape, dtype=torch.bfloat16):
        return torch.empty(*shape, dtype=dtype, device="meta")

    rows, peers = meta(5, 16), meta(2, dtype=torch.int64)
    route = (meta(5, 1, dtype=torch.int32), meta(5, 1, dtype=torch.int64), 1)
    call(OPS.send_rows.default, rows, peers, *route, meta(5, 3), peers, meta(5, 2), peers)
    with pytest.raises(ValueError, match="rows2 and peers2 must be given together, got only rows2"):
        call(OPS.send_rows.default, rows, peers, *route, meta(5, 3))
    with pytest.raises(ValueError, match="rows3 must"):
        call(OPS.send_rows.default, rows, peers, *route, meta(5, 3), peers, meta(4, 3), peers)
    with pytest.raises(ValueError, match="peers2 must"):
        call(OPS.send_rows.default, rows, peers, *route, meta(5, 3), meta(3, dtype=torch.int64))


def test_received_slots_refuses_metadata_it_cannot_leave_blank_in_place():
    """received_slots blanks the metadata where it lies: a strided view is
    refused (meta tensors: nothing launches), a contiguous one takes."""
    meta = torch.empty(2 * 3, 2 * 4, dtype=torch.int32, device="meta")
    ids, weights = call(OPS.received_slots.default, meta, 2, 0, 4, 3)
    assert ids.shape == weights.shape == (6, 4)
    wide = torch.empty(6, 16, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="meta must be contiguous"):
        call(OPS.received_slots.default, wide[:, :8], 2, 0, 4, 3)


def fp8_weights(hidden, w13_scales=None):
    """{"w13": ..., "w2": ...}: one expert's fp8 weights (128 x 128 blocks,
    Quantized) for tokens of `hidden` columns, w13's scales given."""
    fp8 = torch.float8_e4m3fn
    return {"w13": Quantized(torch.zeros(1, 4, hidden, dtype=fp8),
                             torch.ones(1, 1, 1) if w13_scales is None else w13_scales, "128x128"),
            "w2": Quantized(torch.zeros(1, hidden, 2, dtype=fp8), torch.ones(1, 1, 1), "128x128")}


@pytest.mark.parametrize("change, error, match", [
    ({"x": torch.zeros(2, 8)}, TypeError, "x must be float16 or bfloat16"),
    ({"x": torch.zeros(2, 2, 8, dtype=torch.bfloat16)}, ValueError, r"x must be \[T, H\]"),
    ({"topk_ids": torch.zeros(3, 1, dtype=torch.long)}, ValueError, "topk_ids must be"),
    ({"topk_ids": torch.zeros(2, 1)}, TypeError, "topk_ids must be int32 or int64"),
    ({"topk_weights": torch.ones(2, 2)}, ValueError, "topk_weights must have"),
    ({"topk_weights": torch.ones(2, 1, dtype=torch.long)}, TypeError, "floating"),
    ({"max_tokens": 1}, ValueError, "more than max_tokens"),
    ({"max_tokens": 0}, ValueError, "max_tokens must be at least 1"),
    ({"max_tokens": 2.0}, TypeError, "max_tokens"),
    ({"w13": torch.zeros(4, 8)}, ValueError, "w13 must be"),
    ({"transport": "mpi"}, ValueError, "transport must be one of"),
    ({"chunks": 0}, ValueError, "chunks must be at least 1"),
    ({"chunks": 2.0}, TypeError, "chunks must be an int"),
    ({"transport_sms": 0}, ValueError, "transport_sms must be at least 1"),
    ({"transport_sms": None}, TypeError, "transport_sms must be an int"),
    ({**fp8_weights(8)}, ValueError, "H to be a multiple of 16, got H=8"),
    ({"x": torch.zeros(2, 16, dtype=torch.bfloat16).requires_grad_(), **fp8_weights(16)},
     ValueError, "fp8 weights is inference-only"),
    ({"x": torch.zeros(2, 16, dtype=torch.bfloat16), **fp8_weights(16, w13_scales=[1.0])},
     TypeError, r"w13\.scales must be a torch\.Tensor"),
])
def test_bad_arguments_are_refused_before_anything_is_sent(simulated, change, error, match):
    world = simulated(1)
    args = {"x": torch.zeros(2, 8, dtype=torch.bfloat16),
            "topk_ids": torch.zeros(2, 1, dtype=torch.long), "topk_weights": torch.ones(2, 1),
            "w13": torch.zeros(1, 4, 8), "w2": torch.zeros(1, 8, 2), **change}
    with pytest.raises(error, match=match):
        expert_parallel(**args, group=Group(world, 0))
    assert world.buffers == [None]


def test_the_module_holds_its_share_of_the_experts(simulated):
    world = simulated(2)
    modules = on_every_rank(world, lambda rank: ExpertParallelExperts(
        8, 16, 4, group=Group(world, rank), dtype=torch.bfloat16))
    assert all(m.gate_up_proj.shape == (4, 8, 16) and m.down_proj.shape == (4, 16, 4)
               for m in modules)
    with pytest.raises(ValueError, match="multiple of the group's size"):
        ExpertParallelExperts(7, 16, 4, group=Group(world, 0))
    placed = ExpertParallelExperts(8, 16, 4, group=Group(world, 0), placement=torch.arange(8))
    assert placed.to(torch.float64).placement.dtype == torch.int64  # a buffer: moves, not cast
    assert "placement" not in placed.state_dict()


@pytest.mark.parametrize("transport", ["symmetric_memory", "nccl"])
def test_without_autograd_the_experts_read_the_received_rows_in_place(simulated, monkeypatch,
                                                                      transport):
    world = simulated(2)
    case = global_case((9, 6), 4, 2)
    want = layer_ref(**case)
    read = []

    def experts_spy(x, *args, **options):
        read.append(x.data_ptr())
        return reference_experts(x, *args, **options)

    monkeypatch.setattr(ep, "moe_experts", experts_spy)

    def rank_work(rank):
        tokens = slice(9 * rank, 9 + 6 * rank)
        mine = {n: case[n][tokens] for n in ("x", "topk_ids", "topk_weights")}
        with torch.no_grad():
            out = expert_parallel(**mine, w13=case["w13"][2 * rank:2 * rank + 2],
                                  w2=case["w2"][2 * rank:2 * rank + 2],
                                  group=Group(world, rank), transport=transport)
        return tokens, out

    for tokens, out in on_every_rank(world, rank_work):
        torch.testing.assert_close(out.double(), want[tokens].double(), rtol=2e-2, atol=2e-2)
    # Each rank's experts read its rows region (the buffer's first), not a copy.
    assert sorted(read) == sorted(buffer.tensor.data_ptr()
                                  for buffer in exchange._BUFFERS.values())


def test_a_buffer_waits_for_the_ranks_only_where_a_region_may_still_be_read():
    """transport.Buffer's record: a send into a region whose rows may still
    be read (landed and not read, or read since the last barrier) waits at a
    barrier first, as does this rank's own store into it (claimed); a
    region read before a barrier, or never written, does not; a cleared
    region is cleared once until a peer or this rank stores into it again."""
    class Counting(transport.Buffer):
        waits, clears = 0, 0

        def wait(self):
            self.waits += 1

        def send(self, sends, ranks, dest, blocks=1):
            pass

        def clear(self, region):
            self.clears += 1

    buffer = Counting(None, 4096, torch.zeros(4096, dtype=torch.uint8))
    a, b = buffer.regions((4, 16, 0), (4, 16, -1))
    rows = torch.zeros(4, 16, dtype=torch.bfloat16)

    def waits_of(step):
        before = buffer.waits
        step()
        return buffer.waits - before

    send = lambda region: buffer.transfer(((region, rows),), None, None)  # noqa: E731
    assert waits_of(lambda: send(a)) == 1  # never written: the landing barrier only
    assert waits_of(lambda: send(a)) == 2  # a's rows not read yet
    buffer.consumed(a)
    assert waits_of(lambda: buffer.claimed(a)) == 1  # read since the last barrier
    assert waits_of(lambda: buffer.claimed(a)) == 0
    assert waits_of(lambda: send(b)) == 1
    buffer.consumed(a)
    assert waits_of(lambda: send(b)) == 2  # b's rows landed, not read
    buffer.consumed(b)
    buffer.cleared(b)
    assert buffer.clears == 1 and waits_of(lambda: send(a)) == 1  # the barrier frees a and b
    buffer.cleared(b)
    assert buffer.clears == 1  # still blank: b was not stored into
    assert waits_of(lambda: send(b)) == 1
    buffer.cleared(b)
    assert buffer.clears == 2 and waits_of(lambda: send(b)) == 2  # the clear before the peers'
    buffer.consumed(b)
    buffer.cleared(b)
    buffer.claimed(b)  # this rank's own store: no longer blank
    buffer.cleared(b)
    assert buffer.clears == 4


def test_a_run_of_calls_meets_once_a_transfer_and_reads_nothing_overwritten(simulated,
                                                                            monkeypatch):
    """Two configurations sharing the buffer's bytes, called in turns, rank 0
    slow to read what came (its experts, and its sums from the peers'
    regions): right outputs, and after each configuration's first call the
    ranks meet only once a transfer (the tokens and the outputs have regions
    of their own)."""
    world = simulated(2)
    cases = [global_case((13, 7), 4, 2, hidden=40), global_case((6, 9), 4, 3)]
    TURNS = (0, 0, 1, 1, 0, 0)  # noqa: N806 - which case each call takes

    def slow_on_rank_0(function):
        def slowed(rows, *args, **options):
            start = world.buffers[0].data_ptr()
            if start <= rows.data_ptr() < start + world.buffers[0].numel():
                time.sleep(0.05)  # rank 0's reads of its buffer come late
            return function(rows, *args, **options)
        return slowed

    monkeypatch.setattr(ep, "moe_experts", slow_on_rank_0(reference_experts))
    monkeypatch.setattr(transport.OPS.sum_peer_rows, "default",
                        slow_on_rank_0(transport.OPS.sum_peer_rows.default))

    def rank_work(rank):
        outs, waits = [], []
        for turn in TURNS:
            case = cases[turn]
            tokens = ((slice(0, 13), slice(13, 20)), (slice(0, 6), slice(6, 15)))[turn][rank]
            mine = {n: case[n][tokens] for n in ("x", "topk_ids", "topk_weights")}
            before = world.waits[rank]
            with torch.no_grad():
                outs.append(expert_parallel(**mine, w13=case["w13"][2 * rank:2 * rank + 2],
                                            w2=case["w2"][2 * rank:2 * rank + 2],
                                            group=Group(world, rank)))
            waits.append(world.waits[rank] - before)
        return outs, waits

    results = on_every_rank(world, rank_work)
    for rank, (outs, waits) in enumerate(results):
        for turn, out in zip(TURNS, outs):
            tokens = ((slice(0, 13), slice(13, 20)), (slice(0, 6), slice(6, 15)))[turn][rank]
            torch.testing.assert_close(out.double(), layer_ref(**cases[turn])[tokens].double(),
                                       rtol=2e-2, atol=2e-2)
        # A call after the other configuration's waits for the ranks before
        # its dispatch (its metadata region cleared again); the next meets
        # once a transfer.
        assert waits == [3, 2, 3, 2, 3, 2], waits
    assert len(exchange._BUFFERS) == world.size  # the configurations share a rank's buffer


@pytest.mark.parametrize("counts, experts, k, options", [
    ((13, 7), 4, 2, {}),
    ((10, 0, 11, 5), 8, 3, {"dropped": True}),
])
def test_placed_experts_match_all_the_experts_on_one_rank(simulated, counts, experts, k,
                                                          options):
    """A placement (a permutation of the experts over the ranks' shares):
    each rank holds the experts it names, in its order; outputs and every
    gradient as with all the experts on one rank."""
    world = simulated(len(counts))
    case = global_case(counts, experts, k, **options)
    placement = torch.randperm(experts)
    held = placement.argsort()  # held[j]: the global expert at place j
    leaves = {n: case[n].double().requires_grad_() for n in LEAVES}
    want = layer_ref(**{**case, **leaves})
    grad = torch.randn_like(want).bfloat16()
    want.backward(grad.double())
    share = experts // world.size

    def rank_work(rank):
        tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        mine = held[rank * share:(rank + 1) * share]
        ours = {"x": case["x"][tokens].clone().requires_grad_(),
                "topk_weights": case["topk_weights"][tokens].clone().requires_grad_(),
                "w13": case["w13"][mine].clone().requires_grad_(),
                "w2": case["w2"][mine].clone().requires_grad_()}
        out = expert_parallel(**ours, topk_ids=case["topk_ids"][tokens],
                              group=Group(world, rank), placement=placement.clone())
        out.backward(grad[tokens])
        return tokens, mine, out, {n: ours[n].grad for n in LEAVES}

    for tokens, mine, out, grads in on_every_rank(world, rank_work):
        pairs = [(out, want[tokens]), (grads["x"], leaves["x"].grad[tokens]),
                 (grads["topk_weights"], leaves["topk_weights"].grad[tokens]),
                 (grads["w13"], leaves["w13"].grad[mine]), (grads["w2"], leaves["w2"].grad[mine])]
        for got, expected in pairs:
            torch.testing.assert_close(got.double(), expected.detach(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("placement, error, match", [
    (torch.tensor([0, 1, 1, 3]), ValueError, "permutation of 0 .. 3"),
    (torch.tensor([0, 1, 2, 4]), ValueError, "permutation of 0 .. 3"),
    (torch.tensor([0, 1, 2]), ValueError, r"placement must be \[E\] = \[4\]"),
    (torch.tensor([0.0, 1, 2, 3]), TypeError, "placement must be int32 or int64"),
    ([0, 1, 2, 3], TypeError, "placement must be a torch.Tensor"),
])
def test_a_bad_placement_is_refused(simulated, placement, error, match):
    world = simulated(2)
    case = global_case((4, 4), 4, 2)

    def rank_work(rank):
        with pytest.raises(error, match=match):
            expert_parallel(case["x"][:4], case["topk_ids"][:4], case["topk_weights"][:4],
                            case["w13"][:2], case["w2"][:2], group=Group(world, rank),
                            placement=placement)

    on_every_rank(world, rank_work)


def test_a_placement_changed_in_place_is_checked_again(simulated):
    world = simulated(1)
    case = global_case((4,), 2, 1)
    placement = torch.tensor([1, 0])
    args = {n: case[n] for n in ("x", "topk_ids", "topk_weights")}
    with torch.no_grad():
        expert_parallel(**args, w13=case["w13"], w2=case["w2"], group=Group(world, 0),
                        placement=placement)
        placement[0] = 0
        with pytest.raises(ValueError, match="permutation"):
            expert_parallel(**args, w13=case["w13"], w2=case["w2"], group=Group(world, 0),
                            placement=placement)


def fp8_reference_experts(x, topk_ids, topk_weights, w13, w2, out=None, **options):
    """moe_experts' contract for fp8 weights (w13 and w2 Quantized in one
    format) and tokens given quantized (x a Quantized in the layout they
    ask), in float64 (rounded to bfloat16)."""
    assert isinstance(x, Quantized) and x.values.dtype == torch.float8_e4m3fn
    assert isinstance(w13, Quantized) and isinstance(w2, Quantized) and w13.format == w2.format
    assert x.format == FP8_WEIGHT_SCALINGS[w13.format].rows and options["fp8"] is None
    return written(layer_ref(dequantize64(*x), topk_ids, topk_weights.double(),
                             *dequantized_experts(w13, w2)), out, torch.bfloat16)


def quantized_ref(x, granularity):
    """quantize_ref's (q, scale) as quantize_fp8 returns them, a Quantized."""
    return Quantized(*quantize_ref(x, granularity), granularity)


@pytest.mark.parametrize("kind", tuple(FP8_WEIGHT_SCALINGS))
@pytest.mark.parametrize("counts", [(13, 7), (9, 0, 11)])
@pytest.mark.parametrize("way", ["symmetric_memory", "nccl"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp8_weights_take_the_tokens_quantized(simulated, monkeypatch, kind, counts, way, dtype):
    """With fp8 weights the tokens travel quantized as the experts would
    quantize them (per 128 columns, with H = 272 a partial block, by the
    send itself over symmetric memory; or per token), their scales beside
    them: the layer of the tokens so quantized."""
    world = simulated(len(counts))
    monkeypatch.setattr(transport, "quantize_fp8", quantized_ref)
    monkeypatch.setattr(ep, "moe_experts", fp8_reference_experts)
    case = global_case(counts, 2 * len(counts), 2, hidden=272, inter=16)
    x = case["x"].to(dtype)
    rows = FP8_WEIGHT_SCALINGS[kind].rows
    w13, w2 = quantized_ref(case["w13"], kind), quantized_ref(case["w2"], kind)
    want = layer_ref(dequantize64(*quantized_ref(x, rows)), case["topk_ids"],
                     case["topk_weights"].double(), *dequantized_experts(w13, w2))

    def share(w, rank):
        """Rank `rank`'s two experts of the Quantized w."""
        return w._replace(values=w.values[2 * rank:2 * rank + 2],
                          scales=w.scales[2 * rank:2 * rank + 2])

    def rank_work(rank):
        tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        with torch.no_grad():
            out = expert_parallel(x[tokens], case["topk_ids"][tokens],
                                  case["topk_weights"][tokens], share(w13, rank),
                                  share(w2, rank), group=Group(world, rank),
                                  transport=way)
        return tokens, out

    for tokens, out in on_every_rank(world, rank_work):
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want[tokens], rtol=2e-2, atol=2e-2)


def mxfp4_reference_experts(x, topk_ids, topk_weights, w13, w2, out=None, **options):
    """moe_experts' contract for MXFP4 weights (w13 and w2 Quantized;
    16-bit tokens), in float64."""
    assert isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and options["fp8"] is None
    assert w13.format == w2.format == "mxfp4"
    return written(layer_ref(x.double(), topk_ids, topk_weights.double(),
                             dequantize_mxfp4(w13.values, w13.scales),
                             dequantize_mxfp4(w2.values, w2.scales)), out, torch.bfloat16)


@pytest.mark.parametrize("transport", ["symmetric_memory", "nccl"])
def test_mxfp4_weights_take_the_tokens_in_16_bits(simulated, monkeypatch, transport):
    """MXFP4 weights (W4A16): the tokens travel as they are, each rank's
    experts get its slice of the 4-bit weights and scales."""
    counts = (13, 7)
    world = simulated(len(counts))
    monkeypatch.setattr(ep, "moe_experts", mxfp4_reference_experts)
    case = global_case(counts, 4, 2, hidden=64, inter=32)
    x = case["x"].bfloat16()
    w13, w2 = random_mxfp4(4, 64, 64, device="cpu"), random_mxfp4(4, 64, 32, device="cpu")
    want = layer_ref(x.double(), case["topk_ids"], case["topk_weights"].double(),
                     dequantize_mxfp4(w13.values, w13.scales),
                     dequantize_mxfp4(w2.values, w2.scales))

    def rank_work(rank):
        tokens = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
        experts = slice(2 * rank, 2 * rank + 2)
        with torch.no_grad():
            out = expert_parallel(x[tokens], case["topk_ids"][tokens],
                                  case["topk_weights"][tokens],
                                  w13._replace(values=w13.values[experts],
                                               scales=w13.scales[experts]),
                                  w2._replace(values=w2.values[experts],
                                              scales=w2.scales[experts]),
                                  group=Group(world, rank), transport=transport)
        return tokens, out

    for tokens, out in on_every_rank(world, rank_work):
        torch.testing.assert_close(out.double(), want[tokens], rtol=2e-2, atol=2e-2)


class TransformersExperts(torch.nn.Module):
    """A transformers experts module's weights, as transformers 5 names and lays them out."""

    def __init__(self, w13, w2):
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(w13.clone())
        self.down_proj = torch.nn.Parameter(w2.clone())


@pytest.fixture
def experts_interface(monkeypatch):
    """transformers.integrations.moe.ExpertsInterface, its registrations a dict."""
    import sys
    from types import ModuleType
    registered = {}
    for name in ("transformers", "transformers.integrations", "transformers.integrations.moe"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    sys.modules["transformers.integrations.moe"].ExpertsInterface = SimpleNamespace(
        register=registered.__setitem__)
    return registered


def test_a_transformers_model_sharded_runs_its_share_of_the_experts(simulated,
                                                                     experts_interface):
    world = simulated(2)
    case = global_case((10, 7), 4, 2)
    want = layer_ref(**case)

    def rank_work(rank):
        model = torch.nn.Module()
        model.experts = TransformersExperts(case["w13"], case["w2"])
        model.config = SimpleNamespace()
        group = Group(world, rank)
        assert transformers_glue.shard_transformers_experts(model, group=group, max_tokens=10) == 1
        assert torch.equal(model.experts.gate_up_proj, case["w13"][2 * rank:2 * rank + 2])
        forward = experts_interface[model.config._experts_implementation]
        tokens = slice(10 * rank, 10 + 7 * rank)
        with torch.no_grad():
            return tokens, forward(model.experts, case["x"][tokens], case["topk_ids"][tokens],
                                   case["topk_weights"][tokens])

    for tokens, out in on_every_rank(world, rank_work):
        torch.testing.assert_close(out.double(), want[tokens].double(), rtol=2e-2, atol=2e-2)


def test_sharding_refuses_experts_that_do_not_divide_before_changing_any(simulated,
                                                                         experts_interface):
    world = simulated(3)
    case = global_case((4, 4, 4), 4, 2)
    model = torch.nn.Module()
    model.experts = TransformersExperts(case["w13"], case["w2"])
    with pytest.raises(ValueError, match="4 experts, not a multiple"):
        transformers_glue.shard_transformers_experts(model, group=Group(world, 0))
    assert model.experts.gate_up_proj.shape[0] == 4
    with pytest.raises(ValueError, match="no transformers experts module"):
        transformers_glue.shard_transformers_experts(torch.nn.Linear(2, 2), group=Group(world, 0))


class TorchtitanRoutedExperts(torch.nn.Module):
    """torchtitan's RoutedExperts as its names lay it out: a token dispatcher
    and GroupedExperts' w1_EFD, w3_EFD [E, F, D] and w2_EDF [E, D, F]."""

    def __init__(self, w13, w2):
        super().__init__()
        inter = w13.shape[1] // 2
        self.inner_experts = torch.nn.Module()
        self.inner_experts.w1_EFD = torch.nn.Parameter(w13[:, :inter].clone())
        self.inner_experts.w3_EFD = torch.nn.Parameter(w13[:, inter:].clone())
        self.inner_experts.w2_EDF = torch.nn.Parameter(w2.clone())
        self.token_dispatcher = SimpleNamespace()


def torchtitan_model(case):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].moe = torch.nn.Module()
    model.layers[0].moe.routed_experts = TorchtitanRoutedExperts(case["w13"], case["w2"])
    return model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32],
                         ids=["bf16", "float32 (run in bf16)"])
def test_a_torchtitan_model_sharded_runs_its_share_of_the_experts(simulated, dtype):
    world = simulated(2)
    case = global_case((10, 7), 4, 2)
    case = {**case, **{n: case[n].to(dtype) for n in ("x", "w13", "w2")}}
    leaves = {n: case[n].double().requires_grad_() for n in LEAVES}
    want = layer_ref(**{**case, **leaves})
    grad = torch.randn_like(want).bfloat16()
    want.backward(grad.double())

    def rank_work(rank):
        model = torchtitan_model(case)
        inner = model.layers[0].moe.routed_experts.inner_experts
        names = {n: p.clone() for n, p in inner.named_parameters()}
        assert torchtitan_glue.shard_torchtitan_experts(model, group=Group(world, rank),
                                                        max_tokens=10) == 1
        routed = model.layers[0].moe.routed_experts
        share = slice(2 * rank, 2 * rank + 2)
        assert torch.equal(routed.w13, case["w13"][share])
        state = model.state_dict()
        for name, weight in names.items():  # torchtitan's keys, this rank's share
            assert torch.equal(state[f"layers.0.moe.routed_experts.inner_experts.{name}"],
                               weight[share])
        tokens = slice(10 * rank, 10 + 7 * rank)
        scores = case["topk_weights"][tokens].clone().requires_grad_()
        out = routed(case["x"][tokens][None], scores[None], case["topk_ids"][tokens][None],
                     torch.zeros(4))
        assert out.shape == (1, tokens.stop - tokens.start, case["x"].shape[1])
        assert out.dtype == routed.w13.dtype == dtype
        out[0].backward(grad[tokens])
        grads = {"topk_weights": scores.grad, "w13": routed.w13.grad, "w2": routed.w2.grad}
        model.load_state_dict({k: torch.zeros_like(v) for k, v in state.items()})
        assert not routed.w13.any() and not routed.w2.any()  # torchtitan's keys load back
        return rank, tokens, out[0], grads

    for rank, tokens, out, grads in on_every_rank(world, rank_work):
        share = slice(2 * rank, 2 * rank + 2)
        pairs = [(out, want[tokens]), (grads["topk_weights"], leaves["topk_weights"].grad[tokens]),
                 (grads["w13"], leaves["w13"].grad[share]), (grads["w2"], leaves["w2"].grad[share])]
        for got, expected in pairs:
            torch.testing.assert_close(got.double(), expected.detach(), rtol=2e-2, atol=2e-2)


def test_torchtitan_sharding_refuses_what_it_does_not_run_before_changing_any(simulated):
    world = simulated(3)
    case = global_case((4, 4, 4), 4, 2)
    model = torchtitan_model(case)
    with pytest.raises(ValueError, match="4 experts, not a multiple"):
        torchtitan_glue.shard_torchtitan_experts(model, group=Group(world, 0))
    assert isinstance(model.layers[0].moe.routed_experts, TorchtitanRoutedExperts)
    with pytest.raises(ValueError, match="no torchtitan routed experts"):
        torchtitan_glue.shard_torchtitan_experts(torch.nn.Linear(2, 2), group=Group(world, 0))
    del model.layers[0].moe.routed_experts.inner_experts.w3_EFD  # gpt-oss's names differ
    with pytest.raises(ValueError, match="SwiGLU GroupedExperts"):
        torchtitan_glue.shard_torchtitan_experts(model, group=Group(world, 0))
    with pytest.raises(TypeError, match="max_tokens"):
        torchtitan_glue.shard_torchtitan_experts(model, group=Group(world, 0), max_tokens=2.0)


def test_torchtitan_weights_already_parallelized_are_refused(simulated):
    """DTensors (torchtitan's parallelize ran first): refused, naming why."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    world = simulated(2)
    case = global_case((4, 4), 4, 2)
    model = torchtitan_model(case)
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        inner = model.layers[0].moe.routed_experts.inner_experts
        inner.w1_EFD = torch.nn.Parameter(distribute_tensor(inner.w1_EFD.data, mesh,
                                                            [Replicate()]))
        with pytest.raises(ValueError, match="already parallelized"):
            torchtitan_glue.shard_torchtitan_experts(model, group=Group(world, 0))
    finally:
        torch.distributed.destroy_process_group()
    assert isinstance(model.layers[0].moe.routed_experts, TorchtitanRoutedExperts)
