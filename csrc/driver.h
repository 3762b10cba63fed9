// libcuda, opened at run time: importing gg_runtime never needs a GPU or a driver.
#pragma once

#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

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

// Throws CudaError("<what>: CUDA_ERROR_X (text)").
[[noreturn]] void fail(cu::Result result, const std::string& what);

// fail() unless result is success.  A literal `what` costs nothing on success;
// hot paths whose message is built at run time call fail() themselves.
inline void check(cu::Result result, const char* what) {
  if (result != cu::kSuccess) fail(result, what);
}
inline void check(cu::Result result, const std::string& what) {
  if (result != cu::kSuccess) fail(result, what);
}

// One value per device, made by `make(device)` on first use under a lock and
// kept for the life of the process.  References stay valid as devices are added.
template <typename T>
class PerDevice {
 public:
  template <typename Make>
  const T& get(int device, Make make) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (device < 0) throw CudaError("invalid device index " + std::to_string(device));
    if (device >= static_cast<int>(values_.size())) values_.resize(device + 1);
    if (!values_[device]) values_[device] = std::make_unique<T>(make(device));
    return *values_[device];
  }

 private:
  std::mutex mutex_;
  std::vector<std::unique_ptr<T>> values_;
};

// cuLaunchKernelEx's description of `programs` clusters of `ctas` CTAs of
// `warps` warps and `shared` bytes of dynamic shared memory each, on `stream`.
struct ClusterLaunch {
  ClusterLaunch(int ctas, int warps, int shared, unsigned programs, cu::Stream stream);
  ClusterLaunch(const ClusterLaunch&) = delete;  // config points into attrs
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
  cu::LaunchAttribute attrs[2] = {};
  cu::LaunchConfig config = {};
};

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
