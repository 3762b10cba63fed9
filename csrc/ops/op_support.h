// What every torch operator of gg_runtime._ops uses: argument errors that
// name the argument, reading tensors, making outputs, and launching a kernel
// family through _C's runtime.  Only torch's stable ABI (torch/csrc/stable,
// torch/headeronly) is used, so one binary serves every torch release from
// the one it targets (TORCH_TARGET_VERSION, setup.py) onward.
#pragma once

#include <family_args.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../runtime_api.h"

namespace gg::ops {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// Errors reach Python as whatever torch's release makes of a C++ exception
// thrown by a stable-ABI kernel (ValueError for std::invalid_argument up to
// 2.13, RuntimeError for every exception in 2.15), so each message starts with
// a tag naming the Python class, which gg_runtime/_native.py raises.
inline constexpr char kValueErrorTag[] = "[gg_runtime ValueError] ";
inline constexpr char kTypeErrorTag[] = "[gg_runtime TypeError] ";
inline constexpr char kCudaErrorTag[] = "[gg_runtime CudaError] ";
inline constexpr char kUnsupportedDeviceTag[] = "[gg_runtime UnsupportedDeviceError] ";

// Text of any streamable values, concatenated.
template <typename... Parts>
std::string text(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <typename... Parts>
[[noreturn]] void value_error(const Parts&... parts) {
  throw std::invalid_argument(text(kValueErrorTag, parts...));
}

template <typename... Parts>
[[noreturn]] void type_error(const Parts&... parts) {
  throw std::invalid_argument(text(kTypeErrorTag, parts...));
}

using Shape = std::vector<int64_t>;
Shape sizes_of(const Tensor& t);

// Python's spelling, for messages: "(3, 4)", "(3,)", "torch.bfloat16", "cuda:0".
std::string shape_of(const Tensor& t);
std::string tuple_text(const Shape& shape);
std::string strides_of(const Tensor& t);
std::string dtype_name(ScalarType type);
std::string device_of(const Tensor& t);

inline bool is_meta(const Tensor& t) {
  return t.device().type() == torch::headeronly::DeviceType::Meta;
}

// Within a ShapesOnly scope (the operators' Meta kernels, which torch.compile's
// fake tensors reach: they say "cuda" but have no data) an operator makes its
// outputs and launches nothing; data addresses read as 0.
class ShapesOnly {
 public:
  ShapesOnly();
  ~ShapesOnly();
  ShapesOnly(const ShapesOnly&) = delete;
  ShapesOnly& operator=(const ShapesOnly&) = delete;

 private:
  bool outer_;
};
bool in_shapes_only();

// Whether an operator's output t carries shapes only (no launch for it).
inline bool shapes_only(const Tensor& t) { return is_meta(t) || in_shapes_only(); }

// The one mapping between the runtime's dtypes (family::DType, generated from
// aot/variants.py) and torch's: a dtype's storage (tf32's is float32), and
// the runtime's dtype of a torch type (float32 with TF32 products: tf32; a
// TypeError for a type gg_runtime has no kernels for).
ScalarType storage_of(family::DType dtype);
family::DType runtime_dtype(ScalarType type, bool tf32 = false);
using DTypes = std::span<const family::DType>;  // a family's kDTypes, say
bool stores(DTypes dtypes, ScalarType type);    // whether one of dtypes is stored as type
// Their storages' names, each once: "float16 or bfloat16" (prefix: before each name).
std::string dtype_list(DTypes dtypes, const char* prefix = "");

// `name` is stored as one of `dtypes` (their names listed in the message).
void check_dtype(const Tensor& t, const char* name, DTypes dtypes);
// `name` is of one of `dtypes` (a family's, usually), or of `dtype`, `dims`-D,
// on a CUDA device (or meta: shapes only).
void check_tensor(const Tensor& t, const char* name, int64_t dims, DTypes dtypes);
void check_tensor(const Tensor& t, const char* name, int64_t dims, ScalarType dtype);

// A Choice's value (family_args.h) from an operator's str argument `name`,
// or a ValueError listing its values: "gate_up must be 'concatenated' or
// 'interleaved', got 'split'".
template <typename Choice>
Choice parse_choice(const char* name, const std::string& text) {
  if (const std::optional<Choice> value = family::parse<Choice>(text)) return *value;
  const auto& values = family::Names<Choice>::kValues;
  std::string allowed;
  for (size_t i = 0; i < values.size(); ++i) {
    allowed += i == 0 ? "" : i + 1 < values.size() ? ", " : " or ";
    allowed += "'" + std::string(values[i]) + "'";
  }
  value_error(name, " must be ", allowed, ", got '", text, "'");
}

// x has ref's dtype and device.
void check_same(const Tensor& x, const char* name, const Tensor& ref, const char* ref_name);
// A tensor that goes with the operands (a scale, a bias): of `dtype`
// (dtype_text names it), on like's (mat_a's) device, of `shape` (shape_text
// says why).
void check_companion(const Tensor& x, const char* name, const Shape& shape, ScalarType dtype,
                     const Tensor& like, const std::string& dtype_text,
                     const std::string& shape_text);
// A per-group bias [G, N] of the output's dtype.
void check_bias(const Tensor& bias, int64_t groups, int64_t n, ScalarType out_dtype,
                const Tensor& like);
// offs: int32, 1-D, `groups` entries (`groups_name` has them), contiguous, on like's device.
void check_offsets(const Tensor& offs, const char* groups_name, int64_t groups, const Tensor& like);
// rows: int64, 1-D, on like's device; each rows[r] / k a row of the gathered
// operand like_name (not checked: the routing makes them).
void check_rows(const Tensor& rows, const Tensor& like, const char* like_name);
// k, the divisor of a gather's rows: in [1, 2**31).
void check_k(int64_t k);

// Rows and columns of x's last two dimensions as a matrix: row-major (element
// (r, c) at r * ld + c) or column-major (at c * ld + r: stored transposed).
// Copies only when neither dimension is contiguous.  t is the tensor read: x,
// or the copy.
struct Matrix {
  Tensor t;
  family::Major major;
  int64_t ld;
};
Matrix matrix_of(const Tensor& x);
// matrix_of(x.transpose(-2, -1)) without making the view (a dispatcher call):
// t is x itself (its dimensions not swapped), or the copy of the transpose.
Matrix matrix_of_transpose(const Tensor& x);
// x with a unit inner stride (copied where it has none), and its row stride.
Matrix row_major(const Tensor& x);
// A 2-D x contiguous (copied where it is not), as the memory-bound kernels read it.
Tensor dense(const Tensor& x);
// x, or its contiguous copy where it is not contiguous (torch::stable::contiguous
// calls the dispatcher even when there is nothing to copy).
Tensor as_contiguous(const Tensor& x);

// A new output on like's device (NaN-filled under set_poison, for tests).
Tensor new_output(const Tensor& like, const Shape& shape, ScalarType dtype);
void set_poison(bool on);
// Tests: under set_guards, every tensor new_output and Outputs make lies
// between two guard regions filled with a canary byte; guard_report()
// (synchronizing) describes each tensor made since whose guards a kernel
// overwrote, and forgets them all.
void set_guards(bool on);
std::vector<std::string> guard_report();

// Where an operator's helpers make their tensors on like's device: each a new
// allocation (Outputs(like)), or parts of one block of `bytes` allocated up
// front (each allocation through torch costs the host about as much as a
// kernel launch).  Parts share the block's storage and keep all of it alive,
// so only an operator's temporaries are parts, never its results.  A part
// that does not fit, and every tensor of a shapes-only call, is a new
// allocation.
class Outputs {
 public:
  explicit Outputs(const Tensor& like, int64_t bytes = 0);
  Tensor make(const Shape& shape, ScalarType dtype);
  // A part's size in a block: its bytes, rounded up to torch's allocation alignment.
  static int64_t part_bytes(const Shape& shape, ScalarType dtype);

 private:
  Tensor like_;
  std::optional<Tensor> block_;
  int64_t used_ = 0;
};

// Kernel launches recorded and sent to the GPU together (csrc/launch_group.h):
// while a LaunchGroup lives, the thread's launches are recorded, and submit()
// launches them, two or more as one CUDA graph (one driver call for the host
// instead of one per kernel).  Stream order must stay program order, so
// torch work an operator enqueues (copies, fills, aten calls) goes through
// the helpers of this file, each of which first submits what was recorded
// (submit_recorded; tests/runtime/test_sources.py holds the operators to it).
// Destroyed before submit() (an operator that throws), it drops what is still
// recorded.  A recorded launch runs after the operator's temporaries would
// have been freed (an allocation freed before its kernel is enqueued is
// reused, or with exact allocations returned to the driver, under it): every
// tensor whose address() a launch takes is held until the outermost group
// ends, after its submit().
class LaunchGroup {
 public:
  LaunchGroup();
  ~LaunchGroup();
  LaunchGroup(const LaunchGroup&) = delete;
  LaunchGroup& operator=(const LaunchGroup&) = delete;
  void submit();
};
void submit_recorded();

// Torch work, after submit_recorded(): x's contiguous copy (x itself where it
// is contiguous); x's copy in a new allocation; a new tensor of `shape` filled
// with value on like's device; t zeroed or filled with value (in place;
// returns t); t converted to dtype (t itself where it has it); source
// copied into target, converted to its dtype (returns target).
Tensor contiguous_copy(const Tensor& x);
Tensor fresh_copy(const Tensor& x);
Tensor full(const Shape& shape, double value, ScalarType dtype, const Tensor& like);
Tensor zeroed(Tensor t);
Tensor filled(Tensor t, double value);
Tensor converted(const Tensor& t, ScalarType dtype);
Tensor copied_into(Tensor target, const Tensor& source);

// `into` where given and of `dtype`, else a new [tokens, hidden] output like `like`.
Tensor output_into(const Tensor* into, const Tensor& like, int64_t tokens, int64_t hidden,
                   ScalarType dtype);

// The stack after aten::name.overload (an operator the stable ABI wraps no
// function for) is called with args: its results first, each to be taken
// (torch::stable::detail::to) once.
template <typename... Args>
std::array<StableIValue, sizeof...(Args)> call_aten(const char* name, const char* overload,
                                                    const Args&... args) {
  submit_recorded();
  std::array<StableIValue, sizeof...(Args)> stack{torch::stable::detail::from(args)...};
  TORCH_ERROR_CODE_CHECK(torch_call_dispatcher(name, overload, stack.data(), TORCH_ABI_VERSION));
  return stack;
}

// The one result of aten::name.overload called with args.
template <typename... Args>
Tensor aten(const char* name, const char* overload, const Args&... args) {
  return torch::stable::detail::to<Tensor>(call_aten(name, overload, args...)[0]);
}

// A 0-dim int64 tensor of value on like's device (an operand of aten's
// binary operators, whose Scalar overloads the stable ABI cannot call).
Tensor long_scalar(int64_t value, const Tensor& like);

// [size, 2 * size, ...] (int32) on like's device, made there: no host sync.
// The end offsets of `groups` batches of `size` rows, for the ragged kernels.
Tensor batch_offsets(const Tensor& like, int64_t groups, int64_t size);

// t's data address for a kernel's argument (held while a LaunchGroup is open).
int64_t address(const Tensor& t);

// The runtime lent by _C (set once when gg_runtime._ops is imported).
void set_runtime(const RuntimeApi* api);
// Whether sm90's TMA kernels run on this device.
bool runs_tma(const Tensor& t);
// Whether the test override (gg_runtime.testing.forced) forces a variant of
// family `family` (its kIndex): an operator with two paths takes its one.
bool forces_family(int family);

// Where and how a call runs: its device's current stream, the runtime's
// input and output dtypes (float32 inputs take `tf32` where asked).
struct Target {
  int device;
  void* stream;
  family::DType dtype;
  family::DType out_dtype;
};
Target target_of(const Tensor& like, ScalarType out_dtype, bool tf32 = false);
// The same for a family whose variants are compiled per `dtype`, not like's
// (integer work: its pointers' types are fixed).
Target target_of(const Tensor& like, family::DType dtype, family::DType out_dtype);

// Launches one call of family `family` (its index), its variant's axis
// values as their code, on `target`; errors raise as described above.
void run(int family, int axes, std::vector<int64_t> args, std::vector<int64_t> groups,
         const Target& target);

// One call of a family: its arguments (a generated gg::family struct, filled
// by name) and its typed axis values (the struct's Axes), on `target`.
template <typename Family>
void launch(const Family& args, const typename Family::Axes& axes, const Target& target) {
  run(Family::kIndex, Family::code(axes), args.abi(), {}, target);
}

}  // namespace gg::ops
