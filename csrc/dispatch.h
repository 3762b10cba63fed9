// Choosing a variant: device arch -> family -> dtype -> layout -> flavour -> rows bucket.
#pragma once

#include <cstddef>
#include <string>

#include "registry.h"

namespace gg {

struct DeviceProps {
  int major = 0, minor = 0;
  int arch = 0;  // the table arch whose cubins run here, 0 if none
  int sm_count = 0;
  int shared_optin = 0;
  std::string name;
};

// Cached per device; arch is 0 on a device this wheel cannot run on.
const DeviceProps& device_props(int device);

// Why the device cannot run this wheel ("" when it can): names the device and
// the compute capabilities the wheel has kernels for.
std::string unsupported_reason(int device, const DeviceProps& props);

struct Request {
  int family;
  int dtype;
  int out_dtype;
  const char* layout;
  bool tma_ok;  // pointers and strides meet TMA's rules
  long rows;    // typical rows per group, picks the config bucket
};

// Index into kernel_table() of the variant to run; throws if none fits.  A
// test override (below) forces a variant or the `basic` flavour.
size_t pick_variant(const Request& request, const DeviceProps& device);

// Test-only: run exactly the variant `key` (throws std::invalid_argument when
// it cannot run the problem) or, with allow_tma false, only `basic` variants.
// Process-wide; the defaults ("", true) restore normal dispatch.
void set_override(const std::string& key, bool allow_tma);

}  // namespace gg
