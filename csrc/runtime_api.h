// What gg_runtime._C lends to gg_runtime._torch_C (csrc/torch/), the module
// that reads torch tensors in C++: the process's one runtime (its tables, the
// loaded kernels, the per-stream scratch), reached through a capsule so that
// both modules share it.  One `make build` builds both; kRuntimeApiVersion
// catches a stale pairing.
#pragma once

#include <span>

#include "registry.h"
#include "run.h"

namespace gg {

inline constexpr int kRuntimeApiVersion = 1;
// PyCapsule_Import's dotted path: the capsule is _C's attribute `runtime_api`.
inline constexpr char kRuntimeApiCapsule[] = "gg_runtime._C.runtime_api";

struct RuntimeApi {
  int version;  // kRuntimeApiVersion
  // run(), with its C++ exception raised as the Python exception _C.launch
  // would raise (CudaError, UnsupportedDeviceError, ValueError,
  // RuntimeError).  Returns false with that exception set; needs the GIL.
  bool (*run)(const Call& call);
  std::span<const FamilyInfo> (*families)();
};

}  // namespace gg
