// Packing kernel arguments in their ABI order, stream-ordered device buffers,
// and the launch itself.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda_abi.h"
#include "registry.h"

namespace gg {

// Throws std::invalid_argument naming the first int32 value of `params` that
// does not fit (and the group, for group >= 0).
void check_int32(std::span<const ParamInfo> params, const int64_t* values, long group = -1);

// Kernel arguments in ABI order, one 64-bit slot each holding the parameter at
// its exact size from the slot's first byte (the driver copies
// sizeof(parameter) bytes from each slot).  Throws as check_int32 does.
std::vector<uint64_t> pack_args(std::span<const ParamInfo> params,
                                const std::vector<int64_t>& values);

// Whether `stream` is being captured into a CUDA graph.
bool stream_is_capturing(cu::Stream stream);

// Device memory that lives until the work already queued on `stream` is done:
// allocated and freed stream-ordered, so concurrent streams never share it and
// CUDA-graph capture records it as graph memory.  Outside capture it comes from
// a pool of gg_runtime's own that keeps freed memory: the driver's default pool
// returns it to the OS at every synchronisation, and the next allocation then
// costs tens of microseconds before the launch.
class StreamBuffer {
 public:
  StreamBuffer(int device, cu::Stream stream, size_t bytes);
  ~StreamBuffer();
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  cu::DevicePtr ptr() const { return ptr_; }

 private:
  cu::Stream stream_;
  cu::DevicePtr ptr_ = 0;
};

// Device memory for one launch's scratch on `stream`.  Kernels on one stream
// run in order, so launches on a stream share one buffer (kept per stream, grown
// when too small): no allocation per launch.  While the stream is captured into
// a CUDA graph, which may be replayed on any stream, the memory is a StreamBuffer
// of graph memory held in `graph_memory` instead.
cu::DevicePtr launch_scratch(int device, cu::Stream stream, size_t bytes,
                             std::optional<StreamBuffer>& graph_memory);

// Copies `bytes` from host memory to `dst`, ordered on `stream`, without the
// stream synchronisation a copy from pageable memory implies: the bytes go
// through a pinned block that is reused only once the copy reading it is done.
void upload_async(cu::Stream stream, cu::DevicePtr dst, const void* src, size_t bytes);

// Bytes of global scratch the variant needs for `programs` programs.
size_t scratch_bytes(const KernelInfo& info, unsigned programs);

// Launch `programs` programs of the variant (clusters of info.num_ctas CTAs
// where that is > 1) on `stream` of `device`, appending the global and
// profile scratch pointers Triton adds to every kernel; a launch of one-CTA
// clusters is recorded instead while the thread records (launch_group.h).
// Zero programs launch nothing.  Throws CudaError naming the variant on any
// failure.
void launch(const KernelInfo& info, cu::Function function, unsigned programs, cu::Stream stream,
            int device, std::vector<uint64_t> slots, cu::DevicePtr scratch);

}  // namespace gg
