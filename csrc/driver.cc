#include "driver.h"

#include <dlfcn.h>

#include <mutex>

namespace gg {
namespace {

using GetProcAddress = cu::Result (*)(const char* symbol, void** fn, int version,
                                      unsigned long long flags, int* status);

template <typename Fn>
void resolve(GetProcAddress get, const char* name, Fn*& slot) {
  void* fn = nullptr;
  int status = 0;
  if (get(name, &fn, cu::kMinDriverVersion, 0, &status) != cu::kSuccess || fn == nullptr) {
    throw CudaError(std::string("the CUDA driver has no ") + name +
                    " (gg_runtime needs a driver for CUDA >= 12.0)");
  }
  slot = reinterpret_cast<Fn*>(fn);
}

cu::Api load_api() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    throw CudaError(std::string("cannot load the CUDA driver (libcuda.so.1): ") + dlerror());
  }
  auto get = reinterpret_cast<GetProcAddress>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) {
    throw CudaError("the CUDA driver is older than CUDA 12.0 (no cuGetProcAddress_v2)");
  }
  cu::Api api{};
  resolve(get, "cuInit", api.cuInit);
  resolve(get, "cuGetErrorName", api.cuGetErrorName);
  resolve(get, "cuGetErrorString", api.cuGetErrorString);
  resolve(get, "cuDeviceGet", api.cuDeviceGet);
  resolve(get, "cuDeviceGetName", api.cuDeviceGetName);
  resolve(get, "cuDeviceGetAttribute", api.cuDeviceGetAttribute);
  resolve(get, "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain);
  resolve(get, "cuCtxGetCurrent", api.cuCtxGetCurrent);
  resolve(get, "cuCtxSetCurrent", api.cuCtxSetCurrent);
  resolve(get, "cuLibraryLoadData", api.cuLibraryLoadData);
  resolve(get, "cuLibraryGetKernel", api.cuLibraryGetKernel);
  resolve(get, "cuKernelSetAttribute", api.cuKernelSetAttribute);
  resolve(get, "cuKernelGetFunction", api.cuKernelGetFunction);
  resolve(get, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
          api.cuOccupancyMaxActiveBlocksPerMultiprocessor);
  resolve(get, "cuOccupancyMaxActiveClusters", api.cuOccupancyMaxActiveClusters);
  resolve(get, "cuLaunchKernelEx", api.cuLaunchKernelEx);
  resolve(get, "cuLaunchKernel", api.cuLaunchKernel);
  resolve(get, "cuMemAllocAsync", api.cuMemAllocAsync);
  resolve(get, "cuMemFreeAsync", api.cuMemFreeAsync);
  resolve(get, "cuMemPoolCreate", api.cuMemPoolCreate);
  resolve(get, "cuMemPoolSetAttribute", api.cuMemPoolSetAttribute);
  resolve(get, "cuMemAllocFromPoolAsync", api.cuMemAllocFromPoolAsync);
  resolve(get, "cuMemcpyHtoDAsync", api.cuMemcpyHtoDAsync);
  resolve(get, "cuMemsetD8Async", api.cuMemsetD8Async);
  resolve(get, "cuStreamIsCapturing", api.cuStreamIsCapturing);
  resolve(get, "cuStreamGetId", api.cuStreamGetId);
  resolve(get, "cuMemHostAlloc", api.cuMemHostAlloc);
  resolve(get, "cuMemFreeHost", api.cuMemFreeHost);
  resolve(get, "cuEventCreate", api.cuEventCreate);
  resolve(get, "cuEventRecord", api.cuEventRecord);
  resolve(get, "cuEventSynchronize", api.cuEventSynchronize);
  resolve(get, "cuGraphCreate", api.cuGraphCreate);
  resolve(get, "cuGraphAddKernelNode", api.cuGraphAddKernelNode);
  resolve(get, "cuGraphInstantiateWithFlags", api.cuGraphInstantiateWithFlags);
  resolve(get, "cuGraphExecKernelNodeSetParams", api.cuGraphExecKernelNodeSetParams);
  resolve(get, "cuGraphLaunch", api.cuGraphLaunch);
  resolve(get, "cuGraphExecDestroy", api.cuGraphExecDestroy);
  resolve(get, "cuGraphDestroy", api.cuGraphDestroy);
  check(api.cuInit(0), "cuInit");
  return api;
}

std::string error_text(const cu::Api& api, cu::Result result) {
  const char* name = nullptr;
  const char* text = nullptr;
  api.cuGetErrorName(result, &name);
  api.cuGetErrorString(result, &text);
  return std::string(name ? name : "CUDA_ERROR_UNKNOWN") + " (" + (text ? text : "no description") +
         ", code " + std::to_string(result) + ")";
}

const cu::Api* g_api = nullptr;

}  // namespace

const cu::Api& cuda() {
  // Loading is retried after a failure (call_once re-runs when the callable throws).
  static std::once_flag once;
  static cu::Api api;
  std::call_once(once, [] {
    api = load_api();
    g_api = &api;
  });
  return api;
}

void fail(cu::Result result, const std::string& what) {
  if (g_api == nullptr) throw CudaError(what + ": CUDA error code " + std::to_string(result));
  throw CudaError(what + ": " + error_text(*g_api, result));
}

namespace {

cu::Context primary_context(int device) {
  static PerDevice<cu::Context> contexts;
  return contexts.get(device, [](int ordinal) {
    const cu::Api& api = cuda();
    cu::Device handle = 0;
    check(api.cuDeviceGet(&handle, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
    cu::Context context = nullptr;
    // Retained for the life of the process, as the CUDA runtime (and torch) do.
    check(api.cuDevicePrimaryCtxRetain(&context, handle), "cuDevicePrimaryCtxRetain");
    return context;
  });
}

}  // namespace

DeviceScope::DeviceScope(int device) {
  const cu::Api& api = cuda();
  cu::Context wanted = primary_context(device);
  check(api.cuCtxGetCurrent(&previous_), "cuCtxGetCurrent");
  if (previous_ != wanted) {
    check(api.cuCtxSetCurrent(wanted), "cuCtxSetCurrent");
    switched_ = true;
  }
}

DeviceScope::~DeviceScope() {
  if (switched_) cuda().cuCtxSetCurrent(previous_);
}

ClusterLaunch::ClusterLaunch(int ctas, int warps, int shared, unsigned programs,
                             cu::Stream stream) {
  // Grid x counts CTAs, a multiple of the cluster size the cubin requires;
  // clusters spread over the GPCs, as Triton's own launcher asks.
  attrs[0].id = cu::kLaunchAttrClusterDimension;
  attrs[0].value.cluster_dim[0] = static_cast<unsigned>(ctas);
  attrs[0].value.cluster_dim[1] = attrs[0].value.cluster_dim[2] = 1;
  attrs[1].id = cu::kLaunchAttrClusterSchedulingPolicy;
  attrs[1].value.scheduling_policy = cu::kClusterSchedulingSpread;
  config.grid_x = programs * static_cast<unsigned>(ctas);
  config.grid_y = config.grid_z = 1;
  config.block_x = 32 * static_cast<unsigned>(warps);
  config.block_y = config.block_z = 1;
  config.shared_bytes = static_cast<unsigned>(shared);
  config.stream = stream;
  config.attrs = attrs;
  config.attr_count = 2;
}

}  // namespace gg
