#include "dispatch.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "driver.h"

namespace gg {
namespace {

bool runs_on(const ArchInfo& a, int major, int minor) {
  if (a.exact) return major * 10 + minor == a.arch;
  return major == a.arch / 10 && minor >= a.arch % 10;
}

// The newest table arch whose cubins run on compute capability major.minor.
int cubin_arch_for(int major, int minor) {
  int best = 0;
  for (const ArchInfo& a : archs()) {
    if (runs_on(a, major, minor) && a.arch > best) best = a.arch;
  }
  return best;
}

// The newest table arch with PTX at or below compute capability major.minor.
int ptx_arch_for(int major, int minor) {
  int best = 0;
  for (const ArchInfo& a : archs()) {
    if (a.ptx && a.arch <= major * 10 + minor && a.arch > best) best = a.arch;
  }
  return best;
}

std::string supported_list() {
  std::string out;
  for (const ArchInfo& a : archs()) {
    if (!out.empty()) out += ", ";
    out += std::to_string(a.arch / 10) + "." + (a.exact ? std::to_string(a.arch % 10) : "x") +
           " (sm" + std::to_string(a.arch) + (a.exact ? "a)" : ")");
    if (a.ptx) out += " and, through the driver's PTX compiler, later GPUs";
  }
  return out;
}

// Set from GG_RUNTIME_FORCE_PTX by gg_runtime/settings.py at import (its one reader).
std::atomic<bool>& force_ptx_setting() {
  static std::atomic<bool> on{false};
  return on;
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
  p.cubin_arch = cubin_arch_for(p.major, p.minor);
  p.ptx_arch = ptx_arch_for(p.major, p.minor);
  char name[256] = {0};
  check(api.cuDeviceGetName(name, sizeof(name) - 1, handle), "cuDeviceGetName");
  p.name = name;
  return p;
}

bool matches(const KernelInfo& k, const Request& r, const DeviceProps& d) {
  return k.family == r.family && k.arch == r.arch && k.dtype == r.dtype &&
         k.out_dtype == r.out_dtype && k.axes == r.axes && k.shared <= d.shared_optin &&
         (k.when < 0 || (r.conditions >> k.when & 1u));
}

long rows_bound(const KernelInfo& k) { return k.max_rows == 0 ? LONG_MAX : k.max_rows; }

// Is config `a` a better choice than `b` for groups of `rows` rows?  A config
// whose bound admits `rows` beats one whose does not; among those that admit
// it the tighter bound wins, among those that do not the looser one.  Equal
// bounds are no preference: the variant listed first (the tuned table's order) stays.
bool preferred(const KernelInfo& a, const KernelInfo& b, long rows) {
  const bool a_fits = rows_bound(a) >= rows;
  const bool b_fits = rows_bound(b) >= rows;
  if (a_fits != b_fits) return a_fits;
  return a_fits ? rows_bound(a) < rows_bound(b) : rows_bound(a) > rows_bound(b);
}

std::string describe(const Request& r, const DeviceProps& d) {
  const FamilyInfo& f = families()[r.family];
  const std::string axes = f.axis_count == 0 ? "" : ", " + describe_axes(f, r.axes);
  return std::string(f.name) + " kernel for sm" + std::to_string(r.arch) + ", " +
         dtypes()[r.dtype].name + " -> " + dtypes()[r.out_dtype].name + axes + " on " + d.name;
}

size_t best_variant(const Request& r, const DeviceProps& d, bool basic_only) {
  const auto table = kernel_table();
  const int count = static_cast<int>(flavours().size());
  for (int flavour = basic_only ? count - 1 : 0; flavour < count; ++flavour) {
    if (!(r.flavours_ok >> flavour & 1u)) continue;
    const KernelInfo* best = nullptr;
    size_t best_index = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].flavour != flavour || !matches(table[i], r, d)) continue;
      if (best == nullptr || preferred(table[i], *best, r.rows)) {
        best = &table[i];
        best_index = i;
      }
    }
    if (best != nullptr) return best_index;
  }
  throw UnsupportedDevice("no " + describe(r, d));
}

// The index of the variant with this key (set_override resolves it once, so
// that forced launches cost the host what dispatched ones do).
size_t index_of_key(const std::string& key) {
  const auto table = kernel_table();
  for (size_t i = 0; i < table.size(); ++i) {
    if (key == table[i].key) return i;
  }
  throw std::invalid_argument("no variant " + key + " in this build");
}

// Variant `index`, forced, if it can run the request.
size_t checked_variant(size_t index, const Request& r, const DeviceProps& d) {
  const KernelInfo& k = kernel_table()[index];
  if (!matches(k, r, d) || !(r.flavours_ok >> k.flavour & 1u)) {
    throw std::invalid_argument(
        std::string("variant ") + k.key + " cannot run this problem (wants a " + describe(r, d) +
        " whose inputs meet the " + flavours()[k.flavour].name + " flavour's rule)");
  }
  return index;
}

struct Override {
  std::mutex mutex;
  std::atomic<bool> active{false};  // read on every call without the lock
  bool forces_variant = false;
  size_t index = 0;  // the forced variant's, where forces_variant
  bool basic_only = false;
};

Override& override_setting() {
  static Override setting;
  return setting;
}

}  // namespace

const DeviceProps& device_props(int device) {
  static PerDevice<DeviceProps> props;
  return props.get(device, query);
}

KernelPath kernel_path(const DeviceProps& props) {
  if (props.ptx_arch != 0 && (force_ptx() || props.cubin_arch == 0)) return {props.ptx_arch, true};
  return {props.cubin_arch, false};
}

void set_force_ptx(bool on) { force_ptx_setting().store(on); }
bool force_ptx() { return force_ptx_setting().load(); }

std::string unsupported_reason(int device, const DeviceProps& props) {
  if (kernel_path(props).arch != 0) return "";
  return "device " + std::to_string(device) + " (" + props.name + ") has compute capability " +
         std::to_string(props.major) + "." + std::to_string(props.minor) +
         "; this gg_runtime wheel has kernels for " + supported_list();
}

namespace {

// The least max_rows bound (LONG_MAX: none) at or above `rows`: best_variant
// compares rows only with bounds, so rows between two bounds pick alike.
long bound_above(long rows) {
  static const std::vector<long> bounds = [] {
    std::vector<long> all{LONG_MAX};
    for (const KernelInfo& k : kernel_table()) all.push_back(rows_bound(k));
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    return all;
  }();
  return *std::lower_bound(bounds.begin(), bounds.end(), rows);
}

// best_variant(r, d, false), remembered per request and device limit (each
// thread its own memo: no lock on the launch path).  A request it cannot
// serve throws every time and is not remembered.
size_t remembered_variant(const Request& r, const DeviceProps& d) {
  using Key = std::tuple<int, int, int, int, int, unsigned, long, unsigned, int>;
  thread_local std::map<Key, size_t> memo;
  const Key key{
      r.arch,       r.family,      r.dtype, r.out_dtype, r.axes, r.flavours_ok, bound_above(r.rows),
      r.conditions, d.shared_optin};
  const auto found = memo.find(key);
  if (found != memo.end()) return found->second;
  const size_t index = best_variant(r, d, false);
  memo.emplace(key, index);
  return index;
}

}  // namespace

size_t pick_variant(const Request& r, const DeviceProps& d) {
  Override& o = override_setting();
  if (!o.active.load(std::memory_order_acquire)) return remembered_variant(r, d);
  std::lock_guard<std::mutex> lock(o.mutex);
  if (!o.forces_variant) return best_variant(r, d, o.basic_only);
  // Another family's launches dispatch as usual (a fused operator's one kernel can be forced).
  if (kernel_table()[o.index].family != r.family) return remembered_variant(r, d);
  return checked_variant(o.index, r, d);
}

bool forces_family(int family) {
  Override& o = override_setting();
  if (!o.active.load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(o.mutex);
  return o.forces_variant && kernel_table()[o.index].family == family;
}

void set_override(const std::string& key, bool basic_only) {
  const size_t index = key.empty() ? 0 : index_of_key(key);
  Override& o = override_setting();
  std::lock_guard<std::mutex> lock(o.mutex);
  o.forces_variant = !key.empty();
  o.index = index;
  o.basic_only = basic_only;
  o.active.store(!key.empty() || basic_only, std::memory_order_release);
}

}  // namespace gg
