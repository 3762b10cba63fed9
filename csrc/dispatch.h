// Choosing a variant: device arch -> family -> dtype -> axes -> flavour -> rows bucket.
#pragma once

#include <cstddef>
#include <string>

#include "registry.h"

namespace gg {

struct DeviceProps {
  int major = 0, minor = 0;
  int cubin_arch = 0;  // the newest table arch whose cubins run here, 0 if none
  int ptx_arch = 0;    // the newest table arch whose PTX the driver can compile for it, 0 if none
  int sm_count = 0;
  int shared_optin = 0;
  std::string name;
};

// Cached per device.
const DeviceProps& device_props(int device);

// How a device runs this wheel's kernels: the variants of one table arch,
// loaded from cubins or compiled by the driver from PTX.  arch 0: it cannot.
struct KernelPath {
  int arch = 0;
  bool ptx = false;
};

// Cubins where they run, else PTX where the driver can compile it; with
// force_ptx set, PTX wherever there is some (that is how an H100 runs the sm80 kernels).
KernelPath kernel_path(const DeviceProps& props);

// Process-wide; starts as the environment variable GG_RUNTIME_FORCE_PTX ("1": on).
void set_force_ptx(bool on);
bool force_ptx();

// Why the device cannot run this wheel ("" when it can): names the device and
// the compute capabilities the wheel has kernels for.
std::string unsupported_reason(int device, const DeviceProps& props);

struct Request {
  int arch;  // kernel_path(device).arch
  int family;
  int dtype;
  int out_dtype;
  int axes;              // the family's axis values as one code (KernelInfo::axes)
  unsigned flavours_ok;  // bit f: the input meets flavours()[f]'s rule
  long rows;             // typical rows per group, picks the config bucket
  unsigned conditions;   // bit i: the call meets its family's condition i
};

// Index into kernel_table() of the variant to run; throws if none fits.  A
// test override (below) forces a variant or the `basic` flavour.
size_t pick_variant(const Request& request, const DeviceProps& device);

// Test-only: launches of variant `key`'s family run exactly that variant
// (throws std::invalid_argument when it cannot run the problem; here, when
// no variant has that key), the other families' as usual; or, with
// basic_only, every launch runs the last (rule-free) flavour.  Process-wide;
// the defaults ("", false) restore normal dispatch.
void set_override(const std::string& key, bool basic_only);
// Whether the test override forces a variant of family `family` (an operator
// with two paths takes the one that launches it).
bool forces_family(int family);

}  // namespace gg
