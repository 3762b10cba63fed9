"""Rules of the operators' C++ that no compiler checks.  Torch work an operator
enqueues on the GPU goes through csrc/ops/op_support's helpers, which first
submit the kernels a LaunchGroup recorded: enqueued directly, it would run
before them and break stream order (a copy reading a recorded kernel's output
before the kernel ran)."""
import re
from pathlib import Path

OPS = Path(__file__).resolve().parents[2] / "csrc" / "ops"
# torch::stable calls that enqueue work (views and metadata do not), and the
# dispatcher, which aten calls go through.
ENQUEUING = re.compile(r"torch::stable::(contiguous|fill_|zero_|full|to|clone|copy_|empty_like|"
                       r"new_zeros|new_empty|pad|amax|matmul|subtract)\(|torch_call_dispatcher")


def test_torch_work_goes_through_op_support():
    offenders = [f"{path.name}:{number}: {line.strip()}"
                 for path in sorted(OPS.glob("*.[ch]*")) if path.stem != "op_support"
                 for number, line in enumerate(path.read_text().splitlines(), 1)
                 if ENQUEUING.search(line)]
    assert offenders == [], offenders


def test_the_rule_sees_a_direct_call():
    assert ENQUEUING.search("  torch::stable::zero_(out);")
    assert ENQUEUING.search("TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, s));")
    assert not ENQUEUING.search("torch::stable::transpose(x, 0, 1)")


def test_gpt_oss_constants_are_the_kernels():
    """moe/choices.py states the activation's constants the kernels are built
    with (aot/kernels/swiglu.py): the reference and transformers' check read them."""
    from gg_runtime.moe.choices import GPT_OSS_ALPHA, GPT_OSS_LIMIT
    kernel = (OPS.parents[1] / "aot" / "kernels" / "swiglu.py").read_text()
    stated = dict(re.findall(r"^(GPT_OSS_\w+) = tl\.constexpr\(([\d.]+)\)", kernel, re.M))
    assert stated == {"GPT_OSS_ALPHA": str(GPT_OSS_ALPHA), "GPT_OSS_LIMIT": str(GPT_OSS_LIMIT)}
