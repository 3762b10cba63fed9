"""Cold start in a fresh process: import gg_runtime (with Triton made
unimportable) and get a first checked result.  Prints one JSON line; the
host section of bench/run.py runs it.

    python bench/cold_start.py      # where the wheel is installed
"""
import json
import sys
import time

sys.modules["triton"] = None  # any `import triton` from here on fails

import torch  # noqa: E402  (timed apart: torch's own import is not ours)

torch.cuda.init()
torch.zeros(1, device="cuda")  # CUDA context exists before the clock starts

start = time.perf_counter()
import gg_runtime  # noqa: E402

imported = time.perf_counter()
from gg_runtime.testing import moe_inputs, ref_grouped_mm, rel_error  # noqa: E402

a, b, offs = moe_inputs([300, 0, 212, 500], 512, 1024, torch.bfloat16)
made = time.perf_counter()
out = gg_runtime.grouped_mm(a, b, offs)
torch.cuda.synchronize()
first = time.perf_counter()

error = rel_error(out, ref_grouped_mm(a, b, offs))
print(json.dumps({
    "import_ms": round((imported - start) * 1e3, 2),
    "first_call_ms": round((first - made) * 1e3, 2),
    "import_plus_first_call_ms": round((imported - start + first - made) * 1e3, 2),
    "rel_error": error,
    "triton_loaded": any(m == "triton" or m.startswith("triton.")
                         for m, mod in sys.modules.items() if mod is not None),
}))
assert error < 1e-2, error
