// Kernel launches that a thread records instead of launching, then submits
// together: two or more as one CUDA graph, its nodes updated to this call's
// kernels and launched (one driver call for the host where each kernel costs
// one, a few microseconds; the GPU runs them back to back).  An operator that
// launches several kernels in a row records them (gg_runtime::moe_experts'
// forward).
//
// Stream order is the recording's order.  Anything else that must be ordered
// with the recorded kernels on their stream (torch work enqueued by the
// operator, a stream-ordered free of memory they use, a kernel that is not
// recorded) submits what was recorded first: submit_recorded().
#pragma once

#include <cstdint>
#include <vector>

#include "cuda_abi.h"
#include "registry.h"

namespace gg {

// One launch of `programs` CTAs of a variant whose clusters are one CTA;
// slots as launch() passes them (Triton's scratch pointers appended).
struct KernelLaunch {
  const KernelInfo* info;
  cu::Function function;
  unsigned programs;
  cu::Stream stream;
  int device;
  std::vector<uint64_t> slots;
};

// What the driver copies a launch's arguments from: a pointer to each slot
// (valid while slots is neither resized nor destroyed).
std::vector<void*> slot_pointers(std::vector<uint64_t>& slots);

// Launches it now, or, while this thread records and its stream is not being
// captured into a CUDA graph, records it.  Throws CudaError naming the variant.
void launch_or_record(KernelLaunch launch);

// Recording scopes nest; the thread records while one is open.
void start_recording();
// Launches what this thread recorded, in order (throws CudaError; nothing
// recorded is left either way).  Recording goes on.
void submit_recorded();
// Closes a scope; the outermost drops whatever is still recorded unlaunched
// (an operator that failed before submitting).
void stop_recording();

// How many groups of kernels this process launched as one CUDA graph (for tests).
long graph_launches();

}  // namespace gg
