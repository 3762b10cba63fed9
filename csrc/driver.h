// libcuda, opened at run time: importing gg_runtime never needs a GPU or a driver.
#pragma once

#include <stdexcept>
#include <string>

#include "cuda_abi.h"

namespace gg {

// Any failure of the driver or of a launch; the message names what was being
// done and the driver's error name and text.
class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The device cannot run any kernel of this wheel.
class UnsupportedDevice : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The driver's entry points; the first call loads libcuda and runs cuInit.
// Throws CudaError when there is no usable driver.
const cu::Api& cuda();

// Throws CudaError("<what>: CUDA_ERROR_X (text)") unless result is success.
void check(cu::Result result, const std::string& what);

// Makes the device's primary context current for the scope, restoring the
// caller's context afterwards (torch's current device must not change).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  cu::Context previous_ = nullptr;
  bool switched_ = false;
};

}  // namespace gg
