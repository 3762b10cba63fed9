// Choosing a variant: device arch -> dtype -> layout -> flavour -> rows bucket.
#pragma once

#include <cstddef>
#include <string>

#include "registry.h"

namespace gg {

struct DeviceProps {
  int major = 0, minor = 0;
  int arch = 0;  // the table arch whose cubins run here (80 or 90), 0 if none
  int sm_count = 0;
  int shared_optin = 0;
  std::string name;
};

// Cached per device; arch is 0 on a device this wheel cannot run on.
const DeviceProps& device_props(int device);

// Throws UnsupportedDevice naming the device and what the wheel supports.
void require_supported(int device, const DeviceProps& props);

struct Request {
  Family family;
  DType dtype;
  bool a_t;
  bool b_t;
  bool tma_ok;   // pointers and strides meet TMA's 16-byte rules
  long rows;     // typical rows per group, picks the config bucket
};

// Index into kernel_table() of the variant to run; throws if none fits.
size_t pick_variant(const Request& request, const DeviceProps& device);

// Index of the variant named `key`; throws std::invalid_argument unless it can
// run `request` on `device` (tests use this to cover every compiled variant).
size_t find_variant(const std::string& key, const Request& request, const DeviceProps& device);

}  // namespace gg
