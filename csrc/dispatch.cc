#include "dispatch.h"

#include <climits>
#include <stdexcept>

#include "driver.h"

namespace gg {
namespace {

int table_arch_for(int major, int minor) {
  if (major == 9 && minor == 0) return 90;  // sm_90a cubins run on 9.0 only
  if (major == 8) return 80;
  return 0;
}

DeviceProps query(int device) {
  const cu::Api& api = cuda();
  cu::Device handle = 0;
  check(api.cuDeviceGet(&handle, device), "cuDeviceGet(" + std::to_string(device) + ")");
  DeviceProps p;
  auto attr = [&](int attribute, const char* what) {
    int value = 0;
    check(api.cuDeviceGetAttribute(&value, attribute, handle), what);
    return value;
  };
  p.major = attr(cu::kAttrComputeCapabilityMajor, "compute capability");
  p.minor = attr(cu::kAttrComputeCapabilityMinor, "compute capability");
  p.sm_count = attr(cu::kAttrMultiprocessorCount, "multiprocessor count");
  p.shared_optin = attr(cu::kAttrMaxSharedPerBlockOptin, "shared memory per block");
  p.arch = table_arch_for(p.major, p.minor);
  char name[256] = {0};
  check(api.cuDeviceGetName(name, sizeof(name) - 1, handle), "cuDeviceGetName");
  p.name = name;
  return p;
}

const char* family_name(Family f) {
  switch (f) {
    case Family::kList: return "list";
    case Family::kRaggedM: return "ragged_m";
    case Family::kRaggedK: return "ragged_k";
  }
  return "?";
}

bool matches(const KernelInfo& k, const Request& r, const DeviceProps& d, bool tma) {
  return k.family == r.family && k.arch == d.arch && k.dtype == r.dtype && k.a_t == r.a_t &&
         k.b_t == r.b_t && k.tma == tma && k.shared <= d.shared_optin;
}

long rows_bound(const KernelInfo& k) { return k.max_rows == 0 ? LONG_MAX : k.max_rows; }

// Is config `a` a better choice than `b` for groups of `rows` rows?  A config
// whose bound admits `rows` beats one whose does not; among those that admit
// it the tighter bound wins, among those that do not the looser one.
bool preferred(const KernelInfo& a, const KernelInfo& b, long rows) {
  const bool a_fits = rows_bound(a) >= rows;
  const bool b_fits = rows_bound(b) >= rows;
  if (a_fits != b_fits) return a_fits;
  return a_fits ? rows_bound(a) < rows_bound(b) : rows_bound(a) > rows_bound(b);
}

}  // namespace

const DeviceProps& device_props(int device) {
  static PerDevice<DeviceProps> props;
  return props.get(device, query);
}

void require_supported(int device, const DeviceProps& props) {
  if (props.arch != 0) return;
  throw UnsupportedDevice("device " + std::to_string(device) + " (" + props.name +
                          ") has compute capability " + std::to_string(props.major) + "." +
                          std::to_string(props.minor) +
                          "; this gg_runtime wheel has kernels for 8.x (sm80) and 9.0 (sm90a)");
}

size_t pick_variant(const Request& r, const DeviceProps& d) {
  const KernelInfo* table = kernel_table();
  for (bool tma : {true, false}) {
    if (tma && !r.tma_ok) continue;
    const KernelInfo* best = nullptr;
    size_t best_index = 0;
    for (size_t i = 0; i < kernel_count(); ++i) {
      if (!matches(table[i], r, d, tma)) continue;
      if (best == nullptr || preferred(table[i], *best, r.rows)) {
        best = &table[i];
        best_index = i;
      }
    }
    if (best != nullptr) return best_index;
  }
  throw UnsupportedDevice(std::string("no ") + family_name(r.family) + " kernel for sm" +
                          std::to_string(d.arch) + " with this dtype and layout fits " + d.name);
}

size_t find_variant(const std::string& key, const Request& r, const DeviceProps& d) {
  for (size_t i = 0; i < kernel_count(); ++i) {
    const KernelInfo& k = kernel_table()[i];
    if (key != k.key) continue;
    if (!matches(k, r, d, k.tma) || (k.tma && !r.tma_ok)) {
      throw std::invalid_argument("variant " + key + " cannot run this problem on " + d.name);
    }
    return i;
  }
  throw std::invalid_argument("no variant " + key + " in this build");
}

}  // namespace gg
