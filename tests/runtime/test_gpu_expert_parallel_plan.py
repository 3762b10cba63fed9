"""Expert parallelism's plan kernels on one GPU (no process group: the ranks
are arguments): torch.ops.gg_runtime.dispatch_plan and received_slots against
their contracts (moe_reference.py), bit for bit, with dropped ids (negative,
past the experts, past int32), one token and many, k past one load of 16
slots, more ranks than a kernel step takes, rows no rank sent; and each of
their variants forced (test_gpu_variants.py leaves them to this file)."""
import pytest
import torch

from gg_runtime import _C
from gg_runtime._native import OPS, call
from gg_runtime.testing import forced, last_variant
from moe_reference import dispatch_plan_ref, received_slots_ref
from conftest import device_arch, gpu

pytestmark = [gpu, pytest.mark.usefixtures("poison")]
# (tokens, k, world, rank, experts per rank, capacity)
LAYOUTS = [(1, 1, 1, 0, 1, 1), (37, 8, 4, 2, 64, 50), (0, 4, 2, 1, 8, 16),
           (1000, 8, 8, 7, 32, 1000), (100, 20, 9, 8, 3, 128), (5, 64, 3, 0, 40, 5)]


def routing(tokens, k, world, experts_per_rank):
    experts = world * experts_per_rank
    ids = torch.randint(-2, experts + 3, (tokens, k), device="cuda")
    ids[::7, 0] = 2 ** 33 + 1  # 1 if it were cast to int32
    return ids, torch.rand(tokens, k, device="cuda")


@pytest.mark.parametrize("tokens, k, world, rank, experts_per_rank, capacity", LAYOUTS)
def test_dispatch_plan_matches_its_contract(tokens, k, world, rank, experts_per_rank, capacity):
    ids, weights = routing(tokens, k, world, experts_per_rank)
    layout = (world, rank, experts_per_rank, capacity)
    got = OPS.dispatch_plan.default(ids, weights, *layout)
    for name, g, want in zip(("dest", "index", "meta"), got, dispatch_plan_ref(ids, weights,
                                                                               *layout)):
        assert g.dtype == want.dtype and torch.equal(g, want), name


@pytest.mark.parametrize("tokens, k, world, rank, experts_per_rank, capacity", LAYOUTS)
def test_received_slots_match_their_contract(tokens, k, world, rank, experts_per_rank,
                                             capacity):
    rows = world * capacity
    ids, weights = routing(rows, k, world, experts_per_rank)
    _, _, meta = dispatch_plan_ref(ids, weights, world, rank, experts_per_rank, capacity)
    meta[torch.rand(rows, device="cuda") < 0.3] = -1  # rows no rank sent
    layout = (world, rank, experts_per_rank, capacity)
    want = received_slots_ref(meta.clone(), *layout)
    got = OPS.received_slots.default(meta, *layout)
    for name, g, w in zip(("ids", "weights"), got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), name
    assert torch.equal(meta, torch.full_like(meta, -1))  # left blank for the next dispatch


def plan_variants():
    return [v["key"] for v in _C.variants() if v["arch"] == device_arch()
            and v["family"] in ("dispatch_plan", "received_slots")]


@pytest.mark.parametrize("key", plan_variants())
def test_each_plan_variant_matches_its_contract(key):
    """k = 8 (within every variant's condition) on a layout of 3 ranks."""
    layout = (3, 1, 8, 40)
    ids, weights = routing(37, 8, 3, 8)
    if key.startswith("dispatch_plan."):
        with forced(key):
            got = OPS.dispatch_plan.default(ids, weights, *layout)
            assert last_variant() == key
        want = dispatch_plan_ref(ids, weights, *layout)
    else:
        rows_ids, rows_weights = routing(3 * 40, 8, 3, 8)
        _, _, meta = dispatch_plan_ref(rows_ids, rows_weights, *layout)
        want = received_slots_ref(meta.clone(), *layout)
        with forced(key):
            got = OPS.received_slots.default(meta, *layout)
            assert last_variant() == key
        assert torch.equal(meta, torch.full_like(meta, -1)), key
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), key


@pytest.mark.parametrize("change, match", [
    (lambda a: {**a, "topk_ids": a["topk_ids"].int()}, "topk_ids"),
    (lambda a: {**a, "topk_ids": a["topk_ids"].new_zeros(4, 65)}, "topk_ids"),
    (lambda a: {**a, "topk_weights": a["topk_weights"][:, :1]}, "topk_weights"),
    (lambda a: {**a, "rank": 2}, "rank"),
    (lambda a: {**a, "capacity": 3}, "capacity"),
])
def test_dispatch_plan_refuses_what_it_cannot_take(change, match):
    ids, weights = routing(4, 2, 2, 4)
    args = change({"topk_ids": ids, "topk_weights": weights, "world": 2, "rank": 1,
                   "experts_per_rank": 4, "capacity": 8})
    with pytest.raises((TypeError, ValueError), match=match):
        call(OPS.dispatch_plan.default, *args.values())
