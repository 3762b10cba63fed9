"""gg_runtime.moe.expert_parallel over 2, 4 and 8 GPUs (as many as are
visible): each case of
expert_parallel_worker.py run by W processes (torch.distributed.run), every
rank's outputs and gradients against moe_experts on one GPU with all the
experts.  One run a world size, its cases reported line by line; and
examples/expert_parallel.py on two."""
import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gg_runtime.testing import ranks_command, ranks_env

WORKER = Path(__file__).with_name("expert_parallel_worker.py")
CASES = ("uniform", "skewed", "a_rank_with_no_tokens", "dropped_ids", "gpt_oss_with_biases",
         "one_expert_a_rank_k8", "placed_experts", "chunks_on_two_streams", "fp8_weights",
         "fp8_weights_over_nccl", "fp8_training_recipe", "w4_weights",
         "graph_replay_with_new_routing", "no_host_sync", "nccl_transport",
         "ranks_that_disagree_are_refused_on_every_rank", "more_tokens_than_max_tokens_is_refused",
         "torchtitan_moe", "transformers_qwen3_moe")


@functools.cache
def run(world: int, *cases: str) -> tuple[dict, str]:
    """{(rank, case): result} of one run of `cases` (every one of CASES if none)
    on `world` GPUs, and its log."""
    try:
        out = subprocess.run(ranks_command(world, str(WORKER), *cases), capture_output=True,
                             text=True, timeout=600, env=ranks_env())
        stdout, stderr = out.stdout, out.stderr
    except subprocess.TimeoutExpired as timeout:  # the cases reported before it still count
        stdout, stderr = (timeout.stdout or b"").decode(), "timed out after 600 s"
    results = {}
    for line in stdout.splitlines():
        if line.startswith("rank ") and " case " in line:
            head, result = line.split(": ", 1)
            rank, case = head[len("rank "):].split(" case ")
            results[int(rank), case] = result
    return results, stdout[-4000:] + stderr[-4000:]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("world", [2, 4, 8])
def test_expert_parallel_matches_one_gpu(world, case):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    results, log = run(world)
    got = [results.get((rank, case), "no result") for rank in range(world)]
    if all(r.startswith("skip") for r in got):
        pytest.skip(got[0])
    assert all(r == "ok" for r in got), f"{got}\n{log}"


def test_a_rank_failing_alone_ends_the_others_wait_naming_it():
    """No hang: the ranks still waiting at the barrier fail once its timeout
    passes, and the log names the rank that did not arrive."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    case = "a_rank_that_fails_alone_ends_the_others_wait"
    results, log = run(2, case)
    assert [results.get((rank, case), "no result") for rank in range(2)] == ["ok", "ok"], log
    assert "failed to receive signal from rank 1" in log, log


def test_a_rank_that_exits_leaves_its_outputs_to_be_summed():
    """The return's sums read the peers' buffers after the call's last
    barrier: a peer that has exited by then leaves its rows readable."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    case = "a_rank_that_exits_leaves_its_outputs_to_be_summed"
    results, log = run(2, case)
    assert [results.get((rank, case), "no result") for rank in range(2)] == ["ok", "ok"], log


def test_every_case_of_the_worker_is_listed():
    sys.path.insert(0, str(WORKER.parent))
    import expert_parallel_worker
    assert tuple(expert_parallel_worker.CASES) == tuple(sorted(CASES))
    assert tuple(expert_parallel_worker.ALONE) == (
        "a_rank_that_exits_leaves_its_outputs_to_be_summed",
        "a_rank_that_fails_alone_ends_the_others_wait")


def test_the_example_checks_itself_on_two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    example = WORKER.parents[2] / "examples" / "expert_parallel.py"
    out = subprocess.run(ranks_command(2, str(example)), capture_output=True, text=True,
                         timeout=300, env=ranks_env())
    lines = [line for line in out.stdout.splitlines() if line.startswith("rank ")]
    assert out.returncode == 0 and len(lines) == 2, out.stdout + out.stderr
    assert all(": ok " in line for line in lines), lines


def test_ranks_start_with_multicast_off(monkeypatch):
    """Every process the tests and the bench start a GPU each has NVLink
    multicast off, whatever this process's environment says."""
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    env = ranks_env()
    assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
            env["NVSHMEM_DISABLE_NVLS"]) == ("0", "1", "1")
    assert ranks_command(4, "worker.py", "a")[1:] == ["-m", "torch.distributed.run",
                                                      "--nproc-per-node", "4", "worker.py", "a"]
