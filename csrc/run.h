// The one generic entry: a call of any kernel family, its arguments by the
// names the family description gives them, launched on the caller's stream.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_abi.h"
#include "registry.h"

namespace gg {

struct Call {
  int family;     // index into families()
  int dtype;      // index into dtypes(): the inputs'
  int out_dtype;  // index into dtypes(): the output's
  int axes;       // the family's axis values as one code (KernelInfo::axes)
  int device;
  cu::Stream stream;
  // One value per parameter, in the family's ABI order; pointers as their
  // address.  Parameters the runtime fills (group table families) are 0 here.
  std::vector<int64_t> args;
  // Group table families: group_field_count words per group, in field order.
  std::vector<int64_t> groups;
};

// Checks the values against their types, picks the variant (the first flavour
// whose rule every value meets: tma, aligned, basic), loads it, sizes the persistent grid from the
// family's tile count and launches.  A call without output tiles launches
// nothing.  Throws std::invalid_argument for values the kernel cannot take,
// UnsupportedDevice and CudaError otherwise.
void run(const Call& call);

// The most SMs the calling thread's launches may fill (0: every SM): each
// run() sizes its persistent grid to that share of the device's resident
// programs, at least one, so that kernels on another stream (expert
// parallelism's transfers) find SMs free while these run.
void set_sm_limit(int sms);
int sm_limit();

// The variant the calling thread's last run() launched; nullptr when that
// call launched nothing.  For tests and benchmarks.
const KernelInfo* last_variant();
// The programs (grid size) of that launch; 0 when it launched nothing.
unsigned last_programs();

}  // namespace gg
