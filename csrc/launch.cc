#include "launch.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>

#include "driver.h"

namespace gg {

ArgPack& ArgPack::i32(int64_t value) {
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("argument " + std::to_string(kinds_.size()) + " = " +
                                std::to_string(value) + " does not fit in int32");
  }
  return push('i', static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(value))));
}

namespace {

cu::MemPool workspace_pool(int device) {
  static PerDevice<cu::MemPool> pools;
  return pools.get(device, [](int ordinal) {
    const cu::Api& api = cuda();
    cu::MemPoolProps props{};
    props.alloc_type = 1;     // pinned device memory
    props.location_type = 1;  // on a device
    props.location_id = ordinal;
    cu::MemPool pool = nullptr;
    check(api.cuMemPoolCreate(&pool, &props), "creating the workspace memory pool");
    uint64_t keep_all = std::numeric_limits<uint64_t>::max();
    check(api.cuMemPoolSetAttribute(pool, cu::kPoolAttrReleaseThreshold, &keep_all),
          "setting the workspace pool's release threshold");
    return pool;
  });
}

}  // namespace

bool stream_is_capturing(cu::Stream stream) {
  int status = cu::kStreamCaptureNone;
  check(cuda().cuStreamIsCapturing(stream, &status), "cuStreamIsCapturing");
  return status != cu::kStreamCaptureNone;
}

StreamBuffer::StreamBuffer(int device, cu::Stream stream, size_t bytes) : stream_(stream) {
  if (bytes == 0) return;
  const cu::Api& api = cuda();
  const std::string what = "allocating " + std::to_string(bytes) + " bytes of kernel workspace";
  if (stream_is_capturing(stream)) {
    check(api.cuMemAllocAsync(&ptr_, bytes, stream), what);  // becomes graph memory
  } else {
    check(api.cuMemAllocFromPoolAsync(&ptr_, bytes, workspace_pool(device), stream), what);
  }
}

StreamBuffer::~StreamBuffer() {
  // A destructor cannot throw; a failed free leaks the buffer and the next
  // driver call on the stream reports the sticky error, if there is one.
  if (ptr_ != 0) cuda().cuMemFreeAsync(ptr_, stream_);
}

namespace {

struct PinnedBlock {
  cu::Context context;  // events belong to one context
  void* host;
  size_t capacity;
  cu::Event copied;  // recorded after the copy that last read `host`
};

constexpr size_t kMinPinnedBlock = 64 * 1024;

// A block of this context, big enough, whose last copy has finished; or a new one.
PinnedBlock& free_block(std::vector<PinnedBlock>& blocks, cu::Context context, size_t bytes) {
  const cu::Api& api = cuda();
  for (PinnedBlock& block : blocks) {
    if (block.context != context || block.capacity < bytes) continue;
    const cu::Result state = api.cuEventQuery(block.copied);
    if (state == cu::kSuccess) return block;
    if (state != cu::kNotReady) check(state, "querying a metadata copy");
  }
  PinnedBlock block{context, nullptr, std::max(bytes, kMinPinnedBlock), nullptr};
  check(api.cuMemHostAlloc(&block.host, block.capacity, cu::kHostAllocPortable),
        "allocating pinned memory for metadata");
  check(api.cuEventCreate(&block.copied, cu::kEventDisableTiming), "cuEventCreate");
  blocks.push_back(block);
  return blocks.back();
}

}  // namespace

void upload_async(cu::Stream stream, cu::DevicePtr dst, const void* src, size_t bytes) {
  static std::mutex mutex;
  static std::vector<PinnedBlock> blocks;  // kept for the life of the process
  const cu::Api& api = cuda();
  cu::Context context = nullptr;
  check(api.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  std::lock_guard<std::mutex> lock(mutex);
  PinnedBlock& block = free_block(blocks, context, bytes);
  std::memcpy(block.host, src, bytes);
  check(api.cuMemcpyHtoDAsync(dst, block.host, bytes, stream), "copying metadata to the device");
  check(api.cuEventRecord(block.copied, stream), "recording a metadata copy");
}

size_t scratch_bytes(const KernelInfo& info, unsigned programs) {
  if (info.scratch_size == 0) return 0;
  const size_t align = info.scratch_align > 0 ? info.scratch_align : 1;
  const size_t per_program = (info.scratch_size + align - 1) / align * align;
  return per_program * programs;
}

void launch(const KernelInfo& info, cu::Function function, unsigned programs, cu::Stream stream,
            ArgPack& args, cu::DevicePtr scratch) {
  if (programs == 0) return;
  if (args.kinds() != info.params) {
    throw CudaError(std::string("internal ABI mismatch for ") + info.key + ": packed '" +
                    args.kinds() + "', kernel takes '" + info.params + "'");
  }
  // Triton appends global_scratch and profile_scratch to every kernel.
  args.ptr(scratch).ptr(0);
  std::vector<void*> params;
  params.reserve(args.slots().size());
  for (uint64_t& slot : args.slots()) params.push_back(&slot);
  check(cuda().cuLaunchKernel(function, programs, 1, 1, 32 * info.num_warps, 1, 1, info.shared,
                              stream, params.data(), nullptr),
        std::string("launching ") + info.key);
}

}  // namespace gg
