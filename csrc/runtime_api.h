// What gg_runtime._C lends to gg_runtime._ops (csrc/ops/, the torch operators):
// the process's one runtime (its tables, the loaded kernels, the per-stream
// scratch, the settings), reached through a capsule so that both modules share
// it.  Failures come back as a status and a message, not as C++ exceptions,
// so nothing is thrown across the two libraries.  One `make build` builds both;
// kRuntimeApiVersion catches a stale pairing.
#pragma once

#include <span>
#include <string>

#include "registry.h"
#include "run.h"

namespace gg {

inline constexpr int kRuntimeApiVersion = 5;
// PyCapsule_Import's dotted path: the capsule is _C's attribute `runtime_api`.
inline constexpr char kRuntimeApiCapsule[] = "gg_runtime._C.runtime_api";

enum class RunStatus : int {
  kOk,
  kInvalidArgument,    // a value the kernel cannot take (std::invalid_argument)
  kUnsupportedDevice,  // no kernel for this GPU (UnsupportedDevice)
  kCudaError,          // a driver or launch failure (CudaError)
  kOther,
};

struct RuntimeApi {
  int version;  // kRuntimeApiVersion
  // run(); on failure the message goes to *error.
  RunStatus (*run)(const Call& call, std::string* error);
  std::span<const FamilyInfo> (*families)();
  std::span<const DTypeInfo> (*dtypes)();
  // Whether calls on this device run the table's `tma` variants (sm90
  // cubins, not the sm80 path that forcing PTX takes).
  bool (*runs_tma)(int device);
  // Whether the test override forces a variant of this family (dispatch.h).
  bool (*forces_family)(int family);
  // The calling thread's launches recorded and submitted together
  // (launch_group.h): start_recording, submit_recorded, stop_recording.
  void (*start_recording)();
  RunStatus (*submit_recorded)(std::string* error);
  void (*stop_recording)();
};

}  // namespace gg
