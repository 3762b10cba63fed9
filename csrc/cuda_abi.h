// The slice of the CUDA driver API that gg_runtime uses, declared here so the
// extension builds without CUDA headers and never links libcuda.  Values and
// signatures are the driver's documented ABI for CUDA >= 12.0.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gg::cu {

using Result = int;
using Device = int;
using DevicePtr = unsigned long long;
using Context = struct CtxOpaque*;
using Stream = struct StreamOpaque*;
using Library = struct LibraryOpaque*;
using Kernel = struct KernelOpaque*;
using Function = struct FunctionOpaque*;
using Event = struct EventOpaque*;
using MemPool = struct MemPoolOpaque*;
using Graph = struct GraphOpaque*;
using GraphNode = struct GraphNodeOpaque*;
using GraphExec = struct GraphExecOpaque*;

constexpr Result kSuccess = 0;
constexpr int kMinDriverVersion = 12000;  // cuLibrary* and cuKernel* appear in 12.0

// CUdevice_attribute
constexpr int kAttrMultiprocessorCount = 16;
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedPerBlockOptin = 97;
// CUfunction_attribute
constexpr int kFuncAttrMaxDynamicSharedBytes = 8;
// CUstreamCaptureStatus
constexpr int kStreamCaptureNone = 0;
// CUmemPoolProps (88 bytes in CUDA 12 and 13) and CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
struct MemPoolProps {
  int alloc_type;     // CU_MEM_ALLOCATION_TYPE_PINNED = 1
  int handle_types;   // CU_MEM_HANDLE_TYPE_NONE = 0
  int location_type;  // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int location_id;    // device ordinal
  void* win32_security_attributes;
  size_t max_size;
  unsigned short usage;
  unsigned char reserved[54];
};
static_assert(sizeof(MemPoolProps) == 88, "CUmemPoolProps layout");
constexpr int kPoolAttrReleaseThreshold = 4;
// CUlaunchAttribute (an id, padding, a 64-byte value) and CUlaunchConfig, for
// cuLaunchKernelEx: a cluster's shape and how the scheduler places clusters.
constexpr int kLaunchAttrClusterDimension = 4;
constexpr int kLaunchAttrClusterSchedulingPolicy = 5;
constexpr int kClusterSchedulingSpread = 1;
struct LaunchAttribute {
  int id;
  char pad[4];
  union {
    unsigned int cluster_dim[3];
    int scheduling_policy;
    char bytes[64];
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72, "CUlaunchAttribute layout");
struct LaunchConfig {
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  Stream stream;
  LaunchAttribute* attrs;
  unsigned int attr_count;
};
static_assert(sizeof(LaunchConfig) == 56, "CUlaunchConfig layout");
// CUDA_KERNEL_NODE_PARAMS (its _v2, what cuGetProcAddress gives for CUDA
// >= 12.0): one kernel of a graph; kern and context unused (null) when
// function is set.
struct KernelNodeParams {
  Function function;
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  void** params;
  void** extra;
  Kernel kern;
  Context context;
};
static_assert(sizeof(KernelNodeParams) == 72, "CUDA_KERNEL_NODE_PARAMS_v2 layout");
// cuMemHostAlloc and cuEventCreate flags
constexpr unsigned kHostAllocPortable = 1;
constexpr unsigned kEventDisableTiming = 2;

struct Api {
  Result (*cuInit)(unsigned int flags);
  Result (*cuGetErrorName)(Result error, const char** name);
  Result (*cuGetErrorString)(Result error, const char** text);
  Result (*cuDeviceGet)(Device* device, int ordinal);
  Result (*cuDeviceGetName)(char* name, int length, Device device);
  Result (*cuDeviceGetAttribute)(int* value, int attribute, Device device);
  Result (*cuDevicePrimaryCtxRetain)(Context* context, Device device);
  Result (*cuCtxGetCurrent)(Context* context);
  Result (*cuCtxSetCurrent)(Context context);
  Result (*cuLibraryLoadData)(Library* library, const void* image, void* jit_options,
                              void** jit_values, unsigned int jit_count, void* library_options,
                              void** library_values, unsigned int library_count);
  Result (*cuLibraryGetKernel)(Kernel* kernel, Library library, const char* name);
  Result (*cuKernelSetAttribute)(int attribute, int value, Kernel kernel, Device device);
  Result (*cuKernelGetFunction)(Function* function, Kernel kernel);
  Result (*cuOccupancyMaxActiveBlocksPerMultiprocessor)(int* blocks, Function function,
                                                        int block_size, size_t dynamic_shared);
  Result (*cuOccupancyMaxActiveClusters)(int* clusters, Function function,
                                         const LaunchConfig* config);
  Result (*cuLaunchKernelEx)(const LaunchConfig* config, Function function, void** params,
                             void** extra);
  Result (*cuLaunchKernel)(Function function, unsigned int grid_x, unsigned int grid_y,
                           unsigned int grid_z, unsigned int block_x, unsigned int block_y,
                           unsigned int block_z, unsigned int shared_bytes, Stream stream,
                           void** params, void** extra);
  Result (*cuMemAllocAsync)(DevicePtr* ptr, size_t bytes, Stream stream);
  Result (*cuMemPoolCreate)(MemPool* pool, const MemPoolProps* props);
  Result (*cuMemPoolSetAttribute)(MemPool pool, int attribute, void* value);
  Result (*cuMemAllocFromPoolAsync)(DevicePtr* ptr, size_t bytes, MemPool pool, Stream stream);
  Result (*cuMemFreeAsync)(DevicePtr ptr, Stream stream);
  Result (*cuMemcpyHtoDAsync)(DevicePtr dst, const void* src, size_t bytes, Stream stream);
  Result (*cuMemsetD8Async)(DevicePtr dst, unsigned char value, size_t count, Stream stream);
  Result (*cuStreamIsCapturing)(Stream stream, int* status);
  Result (*cuStreamGetId)(Stream stream, unsigned long long* id);
  Result (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned int flags);
  Result (*cuMemFreeHost)(void* ptr);
  Result (*cuEventCreate)(Event* event, unsigned int flags);
  Result (*cuEventRecord)(Event event, Stream stream);
  Result (*cuEventSynchronize)(Event event);
  Result (*cuGraphCreate)(Graph* graph, unsigned int flags);
  Result (*cuGraphAddKernelNode)(GraphNode* node, Graph graph, const GraphNode* dependencies,
                                 size_t dependency_count, const KernelNodeParams* params);
  Result (*cuGraphInstantiateWithFlags)(GraphExec* exec, Graph graph, unsigned long long flags);
  Result (*cuGraphExecKernelNodeSetParams)(GraphExec exec, GraphNode node,
                                           const KernelNodeParams* params);
  Result (*cuGraphLaunch)(GraphExec exec, Stream stream);
  Result (*cuGraphExecDestroy)(GraphExec exec);
  Result (*cuGraphDestroy)(Graph graph);
};

}  // namespace gg::cu
