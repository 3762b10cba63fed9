// Packing kernel arguments in their ABI order, stream-ordered device buffers,
// and the launch itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_abi.h"
#include "registry.h"

namespace gg {

// Runtime arguments in declaration order; each slot holds one parameter at
// its exact size (the driver copies sizeof(param) bytes from each pointer).
class ArgPack {
 public:
  ArgPack& ptr(uint64_t value) { return push('p', value); }
  ArgPack& i32(int64_t value);  // throws if value does not fit in 32 bits
  ArgPack& i64(int64_t value) { return push('l', static_cast<uint64_t>(value)); }
  const std::string& kinds() const { return kinds_; }
  std::vector<uint64_t>& slots() { return slots_; }

 private:
  ArgPack& push(char kind, uint64_t bits) {
    kinds_ += kind;
    slots_.push_back(bits);
    return *this;
  }
  std::string kinds_;
  std::vector<uint64_t> slots_;
};

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

// Copies `bytes` from host memory to `dst`, ordered on `stream`, without the
// stream synchronisation a copy from pageable memory implies: the bytes go
// through a pinned block that is reused only once the copy reading it is done.
void upload_async(cu::Stream stream, cu::DevicePtr dst, const void* src, size_t bytes);

// Bytes of global scratch the variant needs for `programs` programs.
size_t scratch_bytes(const KernelInfo& info, unsigned programs);

// Launch `programs` programs of the variant on `stream`, appending the global
// and profile scratch pointers Triton adds to every kernel.  Zero programs
// launch nothing.  Throws CudaError naming the variant on any failure.
void launch(const KernelInfo& info, cu::Function function, unsigned programs, cu::Stream stream,
            ArgPack& args, cu::DevicePtr scratch);

}  // namespace gg
