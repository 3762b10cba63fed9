#include "registry.h"

#include <algorithm>
#include <atomic>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "driver.h"

namespace gg {
namespace {

#include "kernel_table.inc"

constexpr size_t kTableSize = std::size(kKernelTable);

std::mutex g_mutex;  // guards everything below
std::string g_kernel_dir;
// Process-wide, context-independent; [0] from cubins, [1] from PTX.
std::vector<cu::Kernel> g_kernels[2] = {std::vector<cu::Kernel>(kTableSize, nullptr),
                                        std::vector<cu::Kernel>(kTableSize, nullptr)};
// (variant, from PTX, device) -> configured
std::map<std::tuple<size_t, bool, int>, ReadyKernel> g_ready;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CudaError("cannot read kernel binary " + path + " (is the wheel complete?)");
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

cu::Kernel load_kernel(const KernelInfo& info, bool from_ptx) {
  if (g_kernel_dir.empty()) throw CudaError("gg_runtime: kernel folder not set");
  if (from_ptx && *info.ptx == '\0') {
    throw UnsupportedDevice(std::string(info.key) + " ships no PTX for the driver to compile");
  }
  // PTX is text; the driver compiles it (and caches the result) for the current device.
  const std::string image = read_file(g_kernel_dir + "/" + (from_ptx ? info.ptx : info.cubin));
  const cu::Api& api = cuda();
  cu::Library library = nullptr;
  check(api.cuLibraryLoadData(&library, image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
        std::string("loading kernel ") + info.key);
  cu::Kernel kernel = nullptr;
  check(api.cuLibraryGetKernel(&kernel, library, info.kernel_name),
        std::string("finding ") + info.kernel_name + " in " + info.key);
  return kernel;  // the library lives as long as the process
}

// Programs of the variant the device runs at once: blocks per SM times SMs,
// or the clusters the driver can place (not every SM pairs into a cluster).
int resident_programs(const KernelInfo& info, cu::Function function, cu::Device device,
                      const std::string& where) {
  const cu::Api& api = cuda();
  if (info.num_ctas > 1) {
    const ClusterLaunch launch(info.num_ctas, info.num_warps, info.shared, 1, nullptr);
    int clusters = 0;
    check(api.cuOccupancyMaxActiveClusters(&clusters, function, &launch.config),
          "cluster occupancy of " + where);
    return clusters;
  }
  int blocks = 0;
  check(api.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, function, 32 * info.num_warps,
                                                        info.shared),
        "occupancy of " + where);
  int sms = 0;
  check(api.cuDeviceGetAttribute(&sms, cu::kAttrMultiprocessorCount, device),
        "multiprocessor count");
  return blocks * sms;
}

ReadyKernel configure(const KernelInfo& info, cu::Kernel kernel, int device,
                      int device_shared_optin) {
  const cu::Api& api = cuda();
  const std::string where = std::string(info.key) + " on device " + std::to_string(device);
  if (info.shared > device_shared_optin) {
    throw UnsupportedDevice(where + ": needs " + std::to_string(info.shared) +
                            " bytes of shared memory, the device allows " +
                            std::to_string(device_shared_optin));
  }
  cu::Device handle = 0;
  check(api.cuDeviceGet(&handle, device), "cuDeviceGet");
  check(api.cuKernelSetAttribute(cu::kFuncAttrMaxDynamicSharedBytes, info.shared, kernel, handle),
        "setting shared memory of " + where);
  cu::Function function = nullptr;  // needs the device's context to be current
  check(api.cuKernelGetFunction(&function, kernel), "cuKernelGetFunction for " + where);
  const int wave = resident_programs(info, function, handle, where);
  if (wave < 1) throw UnsupportedDevice(where + ": the kernel does not fit on the device");
  return ReadyKernel{function, wave};
}

}  // namespace

std::span<const KernelInfo> kernel_table() { return kKernelTable; }
std::span<const FamilyInfo> families() { return kFamilies; }
std::span<const ArchInfo> archs() { return kArchs; }
std::span<const FlavourInfo> flavours() { return kFlavours; }
std::span<const DTypeInfo> dtypes() { return kDTypes; }
std::span<const ChoiceInfo> choices() { return kChoices; }
const char* triton_version() { return GG_TRITON_VERSION; }

int family_index(const std::string& name) {
  for (size_t i = 0; i < std::size(kFamilies); ++i) {
    if (name == kFamilies[i].name) return static_cast<int>(i);
  }
  throw std::invalid_argument("no kernel family '" + name + "' in this build");
}

const char* axis_value(const FamilyInfo& f, int code, size_t axis) {
  // Digits after `axis` are less significant: divide them away.
  for (size_t i = f.axis_count; i-- > axis + 1;) code /= f.axes[i].value_count;
  return f.axes[axis].values[code % f.axes[axis].value_count];
}

std::string describe_axes(const FamilyInfo& f, int code) {
  std::string out;
  for (size_t i = 0; i < f.axis_count; ++i) {
    out += std::string(i ? ", " : "") + f.axes[i].name + "=" + axis_value(f, code, i);
  }
  return out;
}

void set_kernel_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_kernel_dir = dir;
}

ReadyKernel ready_kernel(size_t index, bool from_ptx, int device, int device_shared_optin) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const auto key = std::make_tuple(index, from_ptx, device);
  auto found = g_ready.find(key);
  if (found != g_ready.end()) return found->second;
  const KernelInfo& info = kKernelTable[index];
  cu::Kernel& kernel = g_kernels[from_ptx][index];
  if (kernel == nullptr) kernel = load_kernel(info, from_ptx);
  ReadyKernel ready = configure(info, kernel, device, device_shared_optin);
  g_ready.emplace(key, ready);
  return ready;
}

}  // namespace gg
