"""One rank of test_gpu_expert_parallel.py's runs (torch.distributed.run
starts W of them): each case runs gg_runtime.moe.expert_parallel on every
rank over global inputs every rank draws alike (the same seed), compares
this rank's outputs and gradients with moe_experts on one GPU with all the
experts, and prints `case NAME: ok` or `case NAME: FAIL <why>`.  Cases that
need sm90 print `case NAME: skip <why>`.  A case of ALONE runs as the only
case of its run: it leaves CUDA unusable on some ranks, and each rank exits
once it has reported."""
import os
import sys
import time
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist

import gg_runtime
from gg_runtime import Quantized
from gg_runtime.moe import expert_parallel, moe_experts, transport
from gg_runtime.testing import rel_error
from gg_runtime.testing.moe_fp8 import fp8_experts
from gg_runtime.testing.w4 import random_int4, random_mxfp4

TOLERANCE = 1e-2  # each rank's part rounded to bfloat16 before the parts are summed


def world_and_rank():
    return dist.get_world_size(), dist.get_rank()


def global_case(tokens, hidden, inter, experts, k, *, skew=False, dropped=False, bias=False,
                seed=0):
    """Every rank's tokens (a list, rank by rank), ids, weights and all E experts."""
    world, _ = world_and_rank()
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=generator) * scale).bfloat16()

    counts = [tokens(r) for r in range(world)]
    total = sum(counts)
    x = randn(total, hidden)
    scores = torch.rand(total, experts, device="cuda", generator=generator)
    if skew:  # every token to rank 0's experts
        scores[:, experts // world:] -= 2
    weights, ids = scores.topk(k, dim=-1)
    weights = weights.softmax(-1)
    if dropped:
        ids[::3, 0] = -1
        ids[1::5, -1] = experts + 3
    case = {"x": x, "topk_ids": ids, "topk_weights": weights,
            "w13": randn(experts, 2 * inter, hidden, scale=hidden ** -0.5),
            "w2": randn(experts, hidden, inter, scale=inter ** -0.5)}
    if bias:
        case.update(b13=randn(experts, 2 * inter, scale=0.1), b2=randn(experts, hidden, scale=0.1))
    return case, counts


def local(case, counts):
    """This rank's share: its tokens' rows and its experts."""
    world, rank = world_and_rank()
    start, end = sum(counts[:rank]), sum(counts[:rank + 1])
    w13 = case["w13"]
    share = (w13.values if isinstance(w13, Quantized) else w13).shape[0] // world
    mine = {name: case[name][start:end] for name in ("x", "topk_ids", "topk_weights")}
    held = slice(rank * share, (rank + 1) * share)
    for name in ("w13", "w2", "b13", "b2"):
        if name in case:
            w = case[name]  # fp8 weights: a Quantized, its values and scales sliced alike
            mine[name] = (w._replace(values=w.values[held], scales=w.scales[held])
                          if isinstance(w, Quantized) else w[held])
    mine["max_tokens"] = max(counts)  # a layout of its own for each case's sizes
    return mine, slice(start, end), slice(rank * share, (rank + 1) * share)


def check_close(name, got, want, tolerance=TOLERANCE):
    error = rel_error(got, want)
    assert error <= tolerance, f"{name}: relative error {error:.2e}"


def forward_and_backward(options=None, transport="symmetric_memory", weight_tolerance=TOLERANCE,
                         chunks=1, **shape):
    """Outputs and gradients against moe_experts with all the experts;
    options: both take them."""
    options = options or {}
    case, counts = global_case(**shape)
    mine, tokens, experts = local(case, counts)
    leaves = {n: case[n].clone().requires_grad_() for n in ("x", "topk_weights", "w13", "w2")}
    want = moe_experts(**{**case, **leaves}, **options)
    grad = torch.randn_like(want)
    want.backward(grad)
    ours = {n: mine[n].clone().requires_grad_() for n in ("x", "topk_weights", "w13", "w2")}
    got = expert_parallel(**{**mine, **ours}, **options, transport=transport, chunks=chunks)
    got.backward(grad[tokens])
    check_close("out", got, want[tokens])
    check_close("x.grad", ours["x"].grad, leaves["x"].grad[tokens])
    check_close("topk_weights.grad", ours["topk_weights"].grad,
                leaves["topk_weights"].grad[tokens])
    for name in ("w13", "w2"):
        check_close(f"{name}.grad", ours[name].grad, leaves[name].grad[experts],
                    weight_tolerance)


def uneven(base):
    """Each rank's T: base, then an eighth fewer a rank."""
    return lambda rank: base - base // 8 * rank


SHAPE = {"hidden": 256, "inter": 128, "k": 4}


def case_uniform():
    world, _ = world_and_rank()
    forward_and_backward(tokens=uneven(300), experts=8 * world, **SHAPE)


def case_nccl_transport():
    world, _ = world_and_rank()
    forward_and_backward(transport="nccl", tokens=uneven(300), experts=8 * world, **SHAPE)


def case_skewed():
    world, _ = world_and_rank()
    forward_and_backward(tokens=uneven(300), experts=8 * world, skew=True, **SHAPE)


def case_a_rank_with_no_tokens():
    world, _ = world_and_rank()
    forward_and_backward(tokens=lambda r: 0 if r == 1 else 200, experts=4 * world, **SHAPE)


def case_dropped_ids():
    world, _ = world_and_rank()
    forward_and_backward(tokens=uneven(250), experts=4 * world, dropped=True, **SHAPE)


def case_gpt_oss_with_biases():
    world, _ = world_and_rank()
    options = {"gate_up": "interleaved", "activation": "gpt_oss"}
    case, counts = global_case(tokens=uneven(160), experts=4 * world, bias=True, hidden=272,
                               inter=80, k=2)
    mine, tokens, _ = local(case, counts)
    check_close("out", expert_parallel(**mine, **options), moe_experts(**case, **options)[tokens])


def case_placed_experts():
    """A placement that deals the experts out in turns (expert e on rank e %
    W): outputs and gradients as with all of them on one GPU."""
    world, rank = world_and_rank()
    experts = 8 * world
    case, counts = global_case(tokens=uneven(200), experts=experts, dropped=True, **SHAPE)
    mine, tokens, _ = local(case, counts)
    share = experts // world
    placement = torch.tensor([e % world * share + e // world for e in range(experts)],
                             device="cuda")
    held = placement.argsort()[rank * share:(rank + 1) * share]
    leaves = {n: case[n].clone().requires_grad_() for n in ("x", "topk_weights", "w13", "w2")}
    want = moe_experts(**{**case, **leaves})
    grad = torch.randn_like(want)
    want.backward(grad)
    ours = {"x": mine["x"].clone().requires_grad_(),
            "topk_weights": mine["topk_weights"].clone().requires_grad_(),
            "w13": case["w13"][held].clone().requires_grad_(),
            "w2": case["w2"][held].clone().requires_grad_()}
    got = expert_parallel(**ours, topk_ids=mine["topk_ids"], max_tokens=mine["max_tokens"],
                          placement=placement)
    got.backward(grad[tokens])
    check_close("out", got, want[tokens])
    check_close("x.grad", ours["x"].grad, leaves["x"].grad[tokens])
    for name in ("w13", "w2"):
        check_close(f"{name}.grad", ours[name].grad, leaves[name].grad[held])


def case_chunks_on_two_streams():
    """The tokens in chunks, each chunk's transfers beside its neighbours'
    experts: outputs and gradients as in one go; chunks left empty where a
    rank has fewer tokens than the chunks hold."""
    world, _ = world_and_rank()
    forward_and_backward(tokens=uneven(300), experts=8 * world, chunks=3, **SHAPE)
    forward_and_backward(tokens=lambda r: 0 if r == 1 else 50, experts=4 * world, skew=True,
                         chunks=4, **SHAPE)
    forward_and_backward(transport="nccl", tokens=uneven(120), experts=4 * world, dropped=True,
                         chunks=2, **SHAPE)
    if torch.cuda.get_device_capability()[0] == 9:
        fp8_forward("128x128", tokens=uneven(200), experts=8 * world, chunks=2, **SHAPE)


def case_one_expert_a_rank_k8():
    world, _ = world_and_rank()
    forward_and_backward(tokens=uneven(128), experts=world, hidden=128, inter=64,
                         k=min(8, world))


def fp8_forward(kind, transport="symmetric_memory", chunks=1, **shape):
    """expert_parallel with fp8 weights of `kind` (the tokens travel
    quantized) against moe_experts with all of them."""
    case, counts = global_case(**shape)
    case["w13"], case["w2"] = fp8_experts(case["w13"], case["w2"], kind)
    mine, tokens, _ = local(case, counts)
    with torch.no_grad():
        check_close(f"out ({kind})", expert_parallel(**mine, transport=transport, chunks=chunks),
                    moe_experts(**case)[tokens])


def case_fp8_weights():
    if torch.cuda.get_device_capability()[0] != 9:
        return "skip fp8 kernels run on sm90"
    world, _ = world_and_rank()
    for kind in ("128x128", "rowwise"):
        fp8_forward(kind, tokens=uneven(200), experts=8 * world, **SHAPE)
        # A token a rank: few slots, the decode kernel where it takes given tokens.
        fp8_forward(kind, tokens=lambda r: 1, experts=8 * world, **SHAPE)
    fp8_forward("128x128", tokens=lambda r: 0 if r == 1 else 90, experts=4 * world,
                hidden=272, inter=80, k=2, dropped=True)


def case_fp8_weights_over_nccl():
    if torch.cuda.get_device_capability()[0] != 9:
        return "skip fp8 kernels run on sm90"
    world, _ = world_and_rank()
    for kind in ("128x128", "rowwise"):
        fp8_forward(kind, "nccl", tokens=uneven(200), experts=8 * world, **SHAPE)


def case_fp8_training_recipe():
    if torch.cuda.get_device_capability()[0] != 9:
        return "skip fp8 kernels run on sm90"
    world, _ = world_and_rank()
    # The weights' gradients quantize their operands in 128-row blocks along
    # each expert's rows, which the ranks hold in another order than one GPU.
    forward_and_backward({"fp8": "blockwise"}, tokens=uneven(256), experts=4 * world,
                         weight_tolerance=8e-2, **SHAPE)


def w4_forward(weight_format, **shape):
    """expert_parallel with 4-bit weights in `weight_format` (mxfp4, int4_gN;
    inference, the tokens travel in 16 bits), drawn alike on every rank,
    against moe_experts with all of them."""
    case, counts = global_case(**shape)
    experts, hidden, inter = shape["experts"], shape["hidden"], shape["inter"]
    generator = torch.Generator(device="cuda").manual_seed(7)
    for name, n, k in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
        case[name] = (random_mxfp4(experts, n, k, generator=generator)
                      if weight_format == "mxfp4" else
                      random_int4(experts, n, k, group=int(weight_format.split("_g")[1]),
                                  generator=generator))
    mine, tokens, _ = local(case, counts)
    with torch.no_grad():
        check_close(f"out ({weight_format})", expert_parallel(**mine),
                    moe_experts(**case)[tokens])


def case_w4_weights():
    world, _ = world_and_rank()
    for weight_format in ("mxfp4", "int4_g32", "int4_g128"):
        w4_forward(weight_format, tokens=uneven(200), experts=8 * world, **SHAPE)
        # A token a rank: the decode kernels.
        w4_forward(weight_format, tokens=lambda r: 1, experts=8 * world, **SHAPE)
    w4_forward("mxfp4", tokens=lambda r: 0 if r == 1 else 90, experts=4 * world, hidden=288,
               inter=160, k=2, dropped=True)


def case_graph_replay_with_new_routing():
    graph_replay()
    graph_replay(chunks=2)  # two streams in the graph
    if torch.cuda.get_device_capability()[0] == 9:
        graph_replay("128x128")  # the tokens quantized, then sent


def graph_replay(kind=None, chunks=1):
    """A step captured once, replayed with new tokens and routing; with fp8
    weights of `kind` (their format) where given."""
    world, _ = world_and_rank()
    case, counts = global_case(tokens=lambda r: 16, experts=8 * world, **SHAPE)
    if kind is not None:
        case["w13"], case["w2"] = fp8_experts(case["w13"], case["w2"], kind)
    mine, tokens, _ = local(case, counts)
    static = {n: v.clone() if isinstance(v, torch.Tensor) else
              Quantized(v.values.clone(), v.scales.clone(), v.format)
              if isinstance(v, Quantized) else v for n, v in mine.items()}
    static["chunks"] = chunks
    with torch.no_grad():
        expert_parallel(**static)  # sets up the buffer and loads the kernels
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = expert_parallel(**static)
        for seed in (1, 2):
            fresh, _ = global_case(tokens=lambda r: 16, experts=8 * world, seed=seed, **SHAPE)
            fresh.update({n: case[n] for n in ("w13", "w2")})
            for name in ("x", "topk_ids", "topk_weights"):
                static[name].copy_(fresh[name][tokens])
            graph.replay()
            check_close(f"replay {seed}", out, moe_experts(**fresh)[tokens])


def case_no_host_sync():
    world, _ = world_and_rank()
    case, counts = global_case(tokens=uneven(100), experts=4 * world, **SHAPE)
    mine, _, _ = local(case, counts)
    leaves = {n: mine[n].clone().requires_grad_() for n in ("x", "topk_weights", "w13", "w2")}
    for chunks in (1, 2):
        expert_parallel(**{**mine, **leaves}, chunks=chunks).sum().backward()  # setup may sync
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            expert_parallel(**{**mine, **leaves}, chunks=chunks).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode(0)


def case_ranks_that_disagree_are_refused_on_every_rank():
    world, rank = world_and_rank()
    case, counts = global_case(tokens=uneven(50), experts=4 * world, **SHAPE)
    mine, _, _ = local(case, counts)
    if rank == 0:
        mine["w13"], mine["w2"] = mine["w13"][:2], mine["w2"][:2]
    try:
        expert_parallel(**{**mine, "max_tokens": 64})
    except ValueError as error:
        assert "experts per rank" in str(error), error
    else:
        raise AssertionError("no ValueError")


def case_more_tokens_than_max_tokens_is_refused():
    world, _ = world_and_rank()
    case, counts = global_case(tokens=lambda r: 20, experts=4 * world, **SHAPE)
    mine, _, _ = local(case, counts)
    try:  # every rank's T above it: every rank raises before anything is sent
        expert_parallel(**{**mine, "max_tokens": 8})
    except ValueError as error:
        assert "max_tokens" in str(error), error
    else:
        raise AssertionError("no ValueError")


def case_transformers_qwen3_moe():
    """A small Qwen3-MoE model sharded (shard_transformers_experts), each rank
    its own batch, against the whole model on one GPU: the logits, and the
    experts' weight gradients of every rank's batch (one loss a batch)."""
    try:
        import transformers
    except ImportError:
        return "skip transformers is not installed"
    from gg_runtime.moe import shard_transformers_experts, transformers_experts_forward
    from transformers.integrations.moe import ExpertsInterface

    world, rank = world_and_rank()
    config = transformers.Qwen3MoeConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_experts_per_tok=2, intermediate_size=128,
        moe_intermediate_size=48, num_experts=4 * world, decoder_sparse_step=1,
        mlp_only_layers=[])
    torch.manual_seed(0)  # the same model on every rank
    model = transformers.Qwen3MoeForCausalLM(config).to("cuda", torch.bfloat16)
    whole = transformers.Qwen3MoeForCausalLM(config).to("cuda", torch.bfloat16)
    whole.load_state_dict(model.state_dict())
    ExpertsInterface.register("gg_runtime", transformers_experts_forward)
    whole.config._experts_implementation = "gg_runtime"
    generator = torch.Generator(device="cuda").manual_seed(7)
    batches = [torch.randint(0, 128, (2, 24), device="cuda", generator=generator)
               for _ in range(world)]
    want = [whole(batch).logits for batch in batches]
    sum(logits.float().square().mean() for logits in want).backward()
    assert shard_transformers_experts(model, max_tokens=48) == 1
    got = model(batches[rank]).logits
    got.float().square().mean().backward()
    check_close("logits", got, want[rank])
    share = slice(rank * 4, (rank + 1) * 4)
    ours, theirs = (next(m for m in run.modules() if hasattr(m, "gate_up_proj"))
                    for run in (model, whole))
    for name in ("gate_up_proj", "down_proj"):
        check_close(f"{name}.grad", getattr(ours, name).grad, getattr(theirs, name).grad[share])


def case_torchtitan_moe():
    """A torchtitan MoE layer (float32 parameters, softmax router) sharded
    (shard_torchtitan_experts), each rank its own batch, against the whole
    layer run by torchtitan on one GPU: the outputs, the experts' weight
    gradients of every rank's batch, and the router's (summed over ranks)."""
    try:
        from torchtitan.models.common import moe as titan
        from torchtitan.models.common.linear import Linear
        from torchtitan.models.common.token_dispatcher import LocalTokenDispatcher
    except ImportError as error:
        return f"skip torchtitan is not installed ({error})"
    from gg_runtime.moe import shard_torchtitan_experts

    world, rank = world_and_rank()
    experts, dim, inter, k = 4 * world, 64, 48, 2
    config = titan.MoE.Config(
        num_experts=experts, load_balance_coeff=None,
        routed_experts=titan.RoutedExperts.Config(
            inner_experts=titan.GroupedExperts.Config(dim=dim, hidden_dim=inter,
                                                      num_experts=experts),
            token_dispatcher=LocalTokenDispatcher.Config(num_experts=experts, top_k=k)),
        router=titan.TokenChoiceTopKRouter.Config(
            num_experts=experts, gate=Linear.Config(in_features=dim, out_features=experts),
            top_k=k, score_func="softmax", route_norm=True))
    torch.manual_seed(0)  # the same layer on every rank
    layer, whole = config.build().cuda(), config.build().cuda()
    with torch.no_grad():
        for weight in layer.parameters():
            weight.copy_(torch.randn_like(weight) * weight.shape[-1] ** -0.5)
    whole.load_state_dict(layer.state_dict())
    generator = torch.Generator(device="cuda").manual_seed(7)
    batches = [torch.randn(2, 24, dim, device="cuda", generator=generator) for _ in range(world)]
    want = [whole(batch) for batch in batches]
    sum(out.square().mean() for out in want).backward()
    assert shard_torchtitan_experts(layer, max_tokens=48) == 1
    got = layer(batches[rank])
    got.square().mean().backward()
    check_close("output", got, want[rank])
    share = slice(rank * 4, (rank + 1) * 4)
    inner = whole.routed_experts.inner_experts
    check_close("w13.grad", layer.routed_experts.w13.grad,
                torch.cat([inner.w1_EFD.grad, inner.w3_EFD.grad], dim=1)[share])
    check_close("w2.grad", layer.routed_experts.w2.grad, inner.w2_EDF.grad[share])
    gate = layer.router.gate.weight.grad
    dist.all_reduce(gate)
    check_close("router gate.grad", gate, whole.router.gate.weight.grad)
    state = layer.state_dict()
    check_close("state dict w3", state["routed_experts.inner_experts.w3_EFD"],
                inner.w3_EFD[share], tolerance=0)


def alone_a_rank_that_fails_alone_ends_the_others_wait():
    """After the first call, the last rank's T above max_tokens: it raises
    ValueError before it sends anything, and the others, at the transfer's
    barrier, get a CUDA error once the timeout passes (torch names the rank)."""
    world, rank = world_and_rank()
    transport.BARRIER_TIMEOUT_MS = 3000
    case, counts = global_case(tokens=lambda r: 20, experts=4 * world, **SHAPE)
    mine, _, _ = local(case, counts)
    expert_parallel(**{**mine, "max_tokens": 20})  # the layout, agreed by every rank
    torch.cuda.synchronize()
    if rank == world - 1:
        mine = {**mine, **{name: torch.cat([mine[name], mine[name]])
                           for name in ("x", "topk_ids", "topk_weights")}}
    try:
        expert_parallel(**{**mine, "max_tokens": 20})
        torch.cuda.synchronize()
    except ValueError as error:
        assert rank == world - 1 and "max_tokens" in str(error), error
        # Alive until the others' wait has ended: their barrier reads this
        # rank's signal pad, which goes with its process.
        time.sleep(transport.BARRIER_TIMEOUT_MS / 1000 + 5)
    except RuntimeError as error:  # torch's AcceleratorError is one
        assert rank < world - 1 and "launch failure" in str(error), error
    else:
        raise AssertionError("no error")


def alone_a_rank_that_exits_leaves_its_outputs_to_be_summed():
    """Rank 0 exits right after a call, while rank 1 sums its tokens' rows
    late (a GPU sleep before its sums): the rows rank 0 wrote are still read
    right from its buffer, which rank 1 holds mapped."""
    world, rank = world_and_rank()
    case, counts = global_case(tokens=lambda r: 64, experts=4 * world, **SHAPE)
    mine, tokens, _ = local(case, counts)
    with torch.no_grad():
        expert_parallel(**mine)  # the layout, agreed by every rank
        torch.cuda.synchronize()
        dist.barrier()
        if rank == 1:
            ops = transport.OPS

            def late(*args):
                torch.cuda._sleep(4_000_000_000)  # about 2 s: rank 0 has exited by then
                return ops.sum_peer_rows.default(*args)

            transport.OPS = SimpleNamespace(send_rows=ops.send_rows,
                                            sum_peer_rows=SimpleNamespace(default=late))
        out = expert_parallel(**mine)
        torch.cuda.synchronize()  # rank 0 then exits (main's os._exit)
    if rank == 1:
        check_close("out", out, moe_experts(**case)[tokens])


def named(prefix):
    return {name[len(prefix):]: f for name, f in sorted(globals().items())
            if name.startswith(prefix)}


CASES, ALONE = named("case_"), named("alone_")


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    _, rank = world_and_rank()
    names = sys.argv[1:] or list(CASES)
    for name in names:
        try:
            torch.manual_seed(0)
            result = {**CASES, **ALONE}[name]() or "ok"
        except Exception as error:  # noqa: BLE001 - reported, the run goes on
            traceback.print_exc()
            result = f"FAIL {type(error).__name__}: {error}".replace("\n", " ")
        # One write, newline included: the ranks share the pipe, and a write
        # this short is not interleaved with another process's.
        sys.stdout.write(f"rank {rank} case {name}: {result}\n")
        sys.stdout.flush()
        if name in ALONE:
            os._exit(0)  # no collective can run after it
        dist.barrier()
    dist.destroy_process_group()
    assert gg_runtime  # imported for its operators


if __name__ == "__main__":
    main()
