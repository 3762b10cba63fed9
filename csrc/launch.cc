#include "launch.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "driver.h"
#include "launch_group.h"

namespace gg {

void check_int32(std::span<const ParamInfo> params, const int64_t* values, long group) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == 'i' && (values[i] < std::numeric_limits<int32_t>::min() ||
                                  values[i] > std::numeric_limits<int32_t>::max())) {
      const std::string where = group < 0 ? "" : "group " + std::to_string(group) + ": ";
      throw std::invalid_argument(where + params[i].name + " = " + std::to_string(values[i]) +
                                  " does not fit in int32");
    }
  }
}

std::vector<uint64_t> pack_args(std::span<const ParamInfo> params,
                                const std::vector<int64_t>& values) {
  check_int32(params, values.data());
  std::vector<uint64_t> slots;
  slots.reserve(params.size() + 2);  // + the two scratch pointers launch() appends
  for (size_t i = 0; i < params.size(); ++i) {
    const auto bits = static_cast<uint64_t>(values[i]);
    slots.push_back(params[i].kind == 'i' ? static_cast<uint32_t>(bits) : bits);
  }
  return slots;
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
  const cu::Result result =
      stream_is_capturing(stream)
          ? api.cuMemAllocAsync(&ptr_, bytes, stream)  // becomes graph memory
          : api.cuMemAllocFromPoolAsync(&ptr_, bytes, workspace_pool(device), stream);
  if (result != cu::kSuccess) {
    fail(result, "allocating " + std::to_string(bytes) + " bytes of kernel workspace");
  }
}

StreamBuffer::~StreamBuffer() {
  // A destructor cannot throw; a failed free leaks the buffer and the next
  // driver call on the stream reports the sticky error, if there is one.
  if (ptr_ != 0) cuda().cuMemFreeAsync(ptr_, stream_);
}

cu::DevicePtr launch_scratch(int device, cu::Stream stream, size_t bytes,
                             std::optional<StreamBuffer>& graph_memory) {
  if (bytes == 0) return 0;
  if (stream_is_capturing(stream)) return graph_memory.emplace(device, stream, bytes).ptr();
  struct Block {
    cu::DevicePtr ptr = 0;
    size_t bytes = 0;
  };
  // By the stream's unique id (a destroyed stream's handle may be reused by a
  // new one with work in flight beside the old one's).  A stream's block lives
  // as long as the process: a few KiB per stream that ever launched here.
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, Block> blocks;
  const cu::Api& api = cuda();
  unsigned long long id = 0;
  check(api.cuStreamGetId(stream, &id), "cuStreamGetId");
  std::lock_guard<std::mutex> lock(mutex);
  Block& block = blocks[{device, id}];
  if (block.bytes < bytes) {
    // Freed after the work queued on the stream that may still use it,
    // recorded launches included.
    if (block.ptr != 0) {
      submit_recorded();
      check(api.cuMemFreeAsync(block.ptr, stream), "freeing kernel scratch");
    }
    block = Block{};
    const cu::Result result =
        api.cuMemAllocFromPoolAsync(&block.ptr, bytes, workspace_pool(device), stream);
    if (result != cu::kSuccess) {
      fail(result, "allocating " + std::to_string(bytes) + " bytes of kernel scratch");
    }
    // Zeroed once, so that compute-sanitizer's initcheck (make memcheck) reads the
    // TMA descriptors kernels build here as written: their bytes are copied in by
    // tensormap.cp_fenceproxy, which the tool does not count as a write.
    check(api.cuMemsetD8Async(block.ptr, 0, bytes, stream), "zeroing kernel scratch");
    block.bytes = bytes;
  }
  return block.ptr;
}

namespace {

// Pinned staging slots of one context, used round-robin.  A slot is reused once
// the copy that last read it has finished; when the host is kSlots calls ahead
// of the GPU it waits for that copy, which bounds the pinned memory (and the
// work per call) however far ahead the caller runs.
struct StagingRing {
  static constexpr size_t kSlots = 64;
  static constexpr size_t kMinBytes = 64 * 1024;
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cu::Event copied = nullptr;  // recorded after the copy that last read `host`
  };
  cu::Context context;
  std::vector<Slot> slots = std::vector<Slot>(kSlots);
  size_t next = 0;

  Slot& take(size_t bytes) {
    const cu::Api& api = cuda();
    Slot& slot = slots[next];
    next = (next + 1) % kSlots;
    if (slot.copied == nullptr) {
      check(api.cuEventCreate(&slot.copied, cu::kEventDisableTiming), "cuEventCreate");
    } else {
      check(api.cuEventSynchronize(slot.copied), "waiting for a metadata copy");
    }
    if (slot.capacity < bytes) {
      if (slot.host != nullptr) check(api.cuMemFreeHost(slot.host), "freeing pinned memory");
      slot.host = nullptr;  // left empty, not dangling, if the allocation below throws
      slot.capacity = 0;
      const size_t capacity = std::max(bytes, kMinBytes);
      check(api.cuMemHostAlloc(&slot.host, capacity, cu::kHostAllocPortable),
            "allocating pinned memory for metadata");
      slot.capacity = capacity;
    }
    return slot;
  }
};

}  // namespace

void upload_async(cu::Stream stream, cu::DevicePtr dst, const void* src, size_t bytes) {
  static std::mutex mutex;
  static std::vector<StagingRing> rings;  // one per context, kept for the life of the process
  const cu::Api& api = cuda();
  cu::Context context = nullptr;
  check(api.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
  std::lock_guard<std::mutex> lock(mutex);
  auto ring = std::find_if(rings.begin(), rings.end(),
                           [&](const StagingRing& r) { return r.context == context; });
  if (ring == rings.end()) ring = rings.insert(rings.end(), StagingRing{context});
  StagingRing::Slot& slot = ring->take(bytes);
  std::memcpy(slot.host, src, bytes);
  check(api.cuMemcpyHtoDAsync(dst, slot.host, bytes, stream), "copying metadata to the device");
  check(api.cuEventRecord(slot.copied, stream), "recording a metadata copy");
}

size_t scratch_bytes(const KernelInfo& info, unsigned programs) {
  if (info.scratch_size == 0) return 0;
  const size_t align = info.scratch_align > 0 ? info.scratch_align : 1;
  const size_t per_cta = (info.scratch_size + align - 1) / align * align;
  return per_cta * info.num_ctas * programs;
}

void launch(const KernelInfo& info, cu::Function function, unsigned programs, cu::Stream stream,
            int device, std::vector<uint64_t> slots, cu::DevicePtr scratch) {
  if (programs == 0) return;
  // Triton appends global_scratch and profile_scratch to every kernel.
  slots.push_back(scratch);
  slots.push_back(0);
  if (info.num_ctas == 1) {
    launch_or_record({&info, function, programs, stream, device, std::move(slots)});
    return;
  }
  submit_recorded();  // cluster launches are not recorded: what was, runs first
  std::vector<void*> params = slot_pointers(slots);
  const ClusterLaunch clusters(info.num_ctas, info.num_warps, info.shared, programs, stream);
  const cu::Result result =
      cuda().cuLaunchKernelEx(&clusters.config, function, params.data(), nullptr);
  if (result != cu::kSuccess) fail(result, std::string("launching ") + info.key);
}

}  // namespace gg
