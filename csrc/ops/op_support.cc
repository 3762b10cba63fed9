// The operators' host support apart from the checks (checks.cc): operand
// layouts, outputs (blocks, poison, guards), targets and launches, and the
// torch work an operator enqueues (op_support.h declares them).
#include "op_support.h"

#include <dlfcn.h>

#include <algorithm>
#include <limits>
#include <vector>

namespace gg::ops {
namespace {

const RuntimeApi* g_runtime = nullptr;
bool g_poison = false;
thread_local bool t_shapes_only = false;
// The open LaunchGroups of this thread, and the tensors their launches use.
thread_local int t_groups = 0;
thread_local std::vector<Tensor> t_held;

// libtorch_cuda's current-stream getter (not in libtorch_cpu, which this
// library links): looked up once in the already loaded library; null where
// torch has no CUDA (then there is no GPU to launch on either).
using StreamGetter = int32_t (*)(int32_t, void**);
StreamGetter stream_getter() {
  static const StreamGetter getter = [] {
    void* cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
    return cuda ? reinterpret_cast<StreamGetter>(dlsym(cuda, "aoti_torch_get_current_cuda_stream"))
                : nullptr;
  }();
  return getter;
}

}  // namespace

Matrix matrix_of(const Tensor& x) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const int64_t row_stride = x.stride(-2), col_stride = x.stride(-1);
  if (cols <= 1 || col_stride == 1) return {x, family::Major::kRow, row_stride};
  if (rows <= 1 || row_stride == 1) return {x, family::Major::kColumn, col_stride};
  Tensor copy = contiguous_copy(x);
  return {copy, family::Major::kRow, copy.stride(-2)};
}

Matrix matrix_of_transpose(const Tensor& x) {
  const int64_t rows = x.size(-1), cols = x.size(-2);
  const int64_t row_stride = x.stride(-1), col_stride = x.stride(-2);
  if (cols <= 1 || col_stride == 1) return {x, family::Major::kRow, row_stride};
  if (rows <= 1 || row_stride == 1) return {x, family::Major::kColumn, col_stride};
  Tensor copy = contiguous_copy(torch::stable::transpose(x, -2, -1));
  return {copy, family::Major::kRow, copy.stride(-2)};
}

Matrix row_major(const Tensor& x) {
  if (x.stride(-1) != 1 && x.size(-1) > 1) {
    Tensor copy = contiguous_copy(x);
    return {copy, family::Major::kRow, copy.stride(-2)};
  }
  return {x, family::Major::kRow, x.stride(-2)};
}

Tensor dense(const Tensor& x) {
  const bool row_major = x.size(-1) <= 1 || x.stride(-1) == 1;
  const bool packed = x.size(0) <= 1 || x.stride(0) == x.size(-1);
  return row_major && packed ? x : contiguous_copy(x);
}

Tensor as_contiguous(const Tensor& x) { return x.is_contiguous() ? x : contiguous_copy(x); }

namespace {

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

// Under set_poison (tests): NaN, or -1 for integers (a value no output index takes).
Tensor poisoned(Tensor out, ScalarType dtype) {
  if (g_poison && !shapes_only(out)) {
    const bool integer = dtype == ScalarType::Int || dtype == ScalarType::Long;
    filled(out, integer ? -1.0 : std::numeric_limits<double>::quiet_NaN());
  }
  return out;
}

int64_t element_bytes(ScalarType dtype) {
  switch (dtype) {
    case ScalarType::Double:
    case ScalarType::Long:
      return 8;
    case ScalarType::Float:
    case ScalarType::Int:
      return 4;
    case ScalarType::Half:
    case ScalarType::BFloat16:
      return 2;
    default:
      return 1;
  }
}

// torch's CUDA caching allocator's alignment: a part starts where a tensor
// of its own would.
constexpr int64_t kPartAlign = 512;

Tensor empty(const Tensor& like, const Shape& shape, ScalarType dtype) {
  const std::vector<int64_t> strides = contiguous_strides(shape);
  const torch::stable::Device device = like.device();
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      static_cast<int64_t>(shape.size()), shape.data(), strides.data(), static_cast<int32_t>(dtype),
      static_cast<int32_t>(device.type()), device.index(), &handle));
  return Tensor(handle);
}

// A contiguous tensor of `shape` over block's storage from byte `offset`
// (inductor's own way to place its buffers in one allocation; no dispatcher call).
Tensor part_of(const Tensor& block, int64_t offset, const Shape& shape, ScalarType dtype) {
  const std::vector<int64_t> strides = contiguous_strides(shape);
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch__alloc_from_pool(
      block.get(), offset, static_cast<int32_t>(dtype), static_cast<int64_t>(shape.size()),
      shape.data(), strides.data(), &handle));
  return Tensor(handle);
}

// Under set_guards (tests): each new tensor lies between two guard regions
// of kGuardBytes filled with kCanary, in one block; the blocks are kept
// until guard_report() reads them.
constexpr int64_t kGuardBytes = 1024;
constexpr uint8_t kCanary = 0xA5;
struct Guarded {
  Tensor block;
  int64_t bytes;  // the tensor's, between the guards
  std::string what;
};
bool g_guards = false;
std::vector<Guarded> g_guarded;

int64_t data_bytes(const Shape& shape, ScalarType dtype) {
  int64_t bytes = element_bytes(dtype);
  for (int64_t size : shape) bytes *= size;
  return bytes;
}

Tensor guarded_empty(const Tensor& like, const Shape& shape, ScalarType dtype) {
  const int64_t bytes = data_bytes(shape, dtype);
  Tensor block = filled(empty(like, {2 * kGuardBytes + bytes}, ScalarType::Byte), kCanary);
  Tensor t = part_of(block, kGuardBytes, shape, dtype);
  g_guarded.push_back({std::move(block), bytes, tuple_text(shape) + " " + dtype_name(dtype)});
  return t;
}

// The guard bytes of g that differ from the canary (copied to the host); 0
// where the storage was released (gg_runtime.moe's backward frees what it
// saved once read: resized to nothing).
int64_t damaged_bytes(const Guarded& g) {
  const int64_t n = 2 * kGuardBytes;
  int64_t storage_bytes = 0;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_storage_size(g.block.get(), &storage_bytes));
  if (storage_bytes < n + g.bytes) return 0;
  const int64_t one = 1;
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(
      1, &n, &one, static_cast<int32_t>(ScalarType::Byte),
      static_cast<int32_t>(torch::headeronly::DeviceType::CPU), 0, &handle));
  Tensor host(handle);
  Tensor block = g.block;
  for (const int64_t side : {0, 1}) {  // before the tensor, after it
    Tensor to = torch::stable::narrow(host, 0, side * kGuardBytes, kGuardBytes);
    torch::stable::copy_(
        to, torch::stable::narrow(block, 0, side * (kGuardBytes + g.bytes), kGuardBytes));
  }
  const auto* data = static_cast<const uint8_t*>(host.data_ptr());
  return std::count_if(data, data + n, [](uint8_t b) { return b != kCanary; });
}

}  // namespace

Tensor new_output(const Tensor& like, const Shape& shape, ScalarType dtype) {
  if (g_guards && !shapes_only(like)) return poisoned(guarded_empty(like, shape, dtype), dtype);
  return poisoned(empty(like, shape, dtype), dtype);
}

// Guarded, there is no block: each part is a tensor of its own, so that a
// write past one shows.
Outputs::Outputs(const Tensor& like, int64_t bytes) : like_(like) {
  if (bytes > 0 && !shapes_only(like) && !g_guards) block_ = empty(like, {bytes}, ScalarType::Byte);
}

int64_t Outputs::part_bytes(const Shape& shape, ScalarType dtype) {
  const int64_t bytes = data_bytes(shape, dtype);
  return (bytes + kPartAlign - 1) / kPartAlign * kPartAlign;
}

Tensor Outputs::make(const Shape& shape, ScalarType dtype) {
  const int64_t bytes = part_bytes(shape, dtype);
  if (!block_ || used_ + bytes > block_->numel()) return new_output(like_, shape, dtype);
  Tensor part = part_of(*block_, used_, shape, dtype);
  used_ += bytes;
  return poisoned(std::move(part), dtype);
}

void set_guards(bool on) { g_guards = on; }

std::vector<std::string> guard_report() {
  submit_recorded();
  std::vector<Guarded> guarded;
  guarded.swap(g_guarded);
  std::vector<std::string> damaged;
  for (size_t i = 0; i < guarded.size(); ++i) {
    const int64_t bytes = damaged_bytes(guarded[i]);
    if (bytes > 0) {
      damaged.push_back("tensor " + std::to_string(i) + " " + guarded[i].what + ": " +
                        std::to_string(bytes) + " guard bytes overwritten");
    }
  }
  return damaged;
}

void set_poison(bool on) { g_poison = on; }

ShapesOnly::ShapesOnly() : outer_(t_shapes_only) { t_shapes_only = true; }
ShapesOnly::~ShapesOnly() { t_shapes_only = outer_; }
bool in_shapes_only() { return t_shapes_only; }

Tensor long_scalar(int64_t value, const Tensor& like) {
  return full({}, static_cast<double>(value), ScalarType::Long, like);
}

Tensor batch_offsets(const Tensor& like, int64_t groups, int64_t size) {
  const Tensor sizes = full({groups}, static_cast<double>(size), ScalarType::Int, like);
  return aten("aten::cumsum", "", sizes, int64_t{0}, std::optional(ScalarType::Int));
}

void set_runtime(const RuntimeApi* api) { g_runtime = api; }

bool runs_tma(const Tensor& t) {
  return t.is_cuda() && !in_shapes_only() && g_runtime->runs_tma(t.get_device_index());
}

bool forces_family(int family) { return g_runtime->forces_family(family); }

namespace {

void* current_stream(int device) {
  void* stream = nullptr;
  const StreamGetter getter = stream_getter();
  if (getter == nullptr || getter(device, &stream) != 0) {
    throw std::runtime_error("gg_runtime: torch's current CUDA stream is not available");
  }
  return stream;
}

}  // namespace

Target target_of(const Tensor& like, ScalarType out_dtype, bool tf32) {
  const int device = like.get_device_index();
  return {device, current_stream(device), runtime_dtype(like.scalar_type(), tf32),
          runtime_dtype(out_dtype)};
}

Target target_of(const Tensor& like, family::DType dtype, family::DType out_dtype) {
  const int device = like.get_device_index();
  return {device, current_stream(device), dtype, out_dtype};
}

namespace {

// The runtime's failure as the exception its status names.
void raise(RunStatus status, const std::string& error) {
  switch (status) {
    case RunStatus::kOk:
      return;
    case RunStatus::kInvalidArgument:
      throw std::invalid_argument(kValueErrorTag + error);
    case RunStatus::kUnsupportedDevice:
      throw std::runtime_error(kUnsupportedDeviceTag + error);
    case RunStatus::kCudaError:
      throw std::runtime_error(kCudaErrorTag + error);
    case RunStatus::kOther:
      throw std::runtime_error(error);
  }
}

}  // namespace

void run(int family, int axes, std::vector<int64_t> args, std::vector<int64_t> groups,
         const Target& target) {
  Call call{};
  call.family = family;
  // family::DType is the runtime's dtype table's order (module.cc checks it at import).
  call.dtype = static_cast<int>(target.dtype);
  call.out_dtype = static_cast<int>(target.out_dtype);
  call.axes = axes;
  call.device = target.device;
  call.stream = static_cast<cu::Stream>(target.stream);
  call.args = std::move(args);
  call.groups = std::move(groups);
  std::string error;
  raise(g_runtime->run(call, &error), error);
}

LaunchGroup::LaunchGroup() {
  g_runtime->start_recording();
  ++t_groups;
}

LaunchGroup::~LaunchGroup() {
  g_runtime->stop_recording();
  // Released after the launches are dropped or enqueued: the caching
  // allocator's frees are stream-ordered from here.
  if (--t_groups == 0) t_held.clear();
}

int64_t address(const Tensor& t) {
  if (shapes_only(t)) return 0;
  if (t_groups > 0) t_held.push_back(t);
  return reinterpret_cast<int64_t>(t.data_ptr());
}

void LaunchGroup::submit() { submit_recorded(); }

void submit_recorded() {
  std::string error;
  raise(g_runtime->submit_recorded(&error), error);
}

Tensor contiguous_copy(const Tensor& x) {
  submit_recorded();
  return torch::stable::contiguous(x);
}

Tensor fresh_copy(const Tensor& x) {
  submit_recorded();
  return torch::stable::clone(x);
}

Tensor full(const Shape& shape, double value, ScalarType dtype, const Tensor& like) {
  submit_recorded();
  return torch::stable::full(shape, value, dtype, std::nullopt, like.device());
}

Tensor zeroed(Tensor t) {
  submit_recorded();
  return torch::stable::zero_(t);
}

Tensor output_into(const Tensor* into, const Tensor& like, int64_t tokens, int64_t hidden,
                   ScalarType dtype) {
  if (into != nullptr && into->scalar_type() == dtype) return *into;
  return new_output(like, {tokens, hidden}, dtype);
}

Tensor filled(Tensor t, double value) {
  submit_recorded();
  return torch::stable::fill_(t, value);
}

Tensor copied_into(Tensor target, const Tensor& source) {
  submit_recorded();
  return torch::stable::copy_(target, source);
}

Tensor converted(const Tensor& t, ScalarType dtype) {
  if (t.scalar_type() == dtype) return t;
  submit_recorded();
  return torch::stable::to(t, dtype);
}

}  // namespace gg::ops
