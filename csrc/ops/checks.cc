// What the operators' checks share: dtypes, shapes, strides and devices as
// messages name them, and the checks of a tensor's rank, dtype, device and
// likeness to another (op_support.h declares them).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "op_support.h"

namespace gg::ops {
namespace {

// torch's name of a dtype without "torch.", or nullptr for the few with none
// (the quantized and bit types).  Every dtype a user can make is named, so
// that an error about a wrong one says which it was.
const char* short_dtype_name(ScalarType type) {
  switch (type) {
    case ScalarType::Half:
      return "float16";
    case ScalarType::BFloat16:
      return "bfloat16";
    case ScalarType::Float:
      return "float32";
    case ScalarType::Double:
      return "float64";
    case ScalarType::Float8_e4m3fn:
      return "float8_e4m3fn";
    case ScalarType::Float8_e5m2:
      return "float8_e5m2";
    case ScalarType::Float8_e4m3fnuz:
      return "float8_e4m3fnuz";
    case ScalarType::Float8_e5m2fnuz:
      return "float8_e5m2fnuz";
    case ScalarType::Float8_e8m0fnu:
      return "float8_e8m0fnu";
    case ScalarType::Float4_e2m1fn_x2:
      return "float4_e2m1fn_x2";
    case ScalarType::ComplexHalf:
      return "complex32";
    case ScalarType::ComplexFloat:
      return "complex64";
    case ScalarType::ComplexDouble:
      return "complex128";
    case ScalarType::Bool:
      return "bool";
    case ScalarType::Byte:
      return "uint8";
    case ScalarType::Char:
      return "int8";
    case ScalarType::Short:
      return "int16";
    case ScalarType::Int:
      return "int32";
    case ScalarType::Long:
      return "int64";
    case ScalarType::UInt16:
      return "uint16";
    case ScalarType::UInt32:
      return "uint32";
    case ScalarType::UInt64:
      return "uint64";
    default:
      return nullptr;
  }
}

}  // namespace

std::string tuple_text(const Shape& values) {
  std::string out = "(";
  for (size_t i = 0; i < values.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(values[i]);
  }
  return out + (values.size() == 1 ? ",)" : ")");
}

Shape sizes_of(const Tensor& t) {
  const auto sizes = t.sizes();
  return Shape(sizes.begin(), sizes.end());
}

std::string shape_of(const Tensor& t) { return tuple_text(sizes_of(t)); }

std::string strides_of(const Tensor& t) {
  const auto strides = t.strides();
  return tuple_text(Shape(strides.begin(), strides.end()));
}

std::string dtype_name(ScalarType type) {
  const char* name = short_dtype_name(type);
  return name != nullptr ? std::string("torch.") + name
                         : "torch.dtype(" + std::to_string(static_cast<int>(type)) + ")";
}

std::string device_of(const Tensor& t) {
  if (t.is_cuda()) return "cuda:" + std::to_string(t.get_device_index());
  return is_meta(t) ? "meta" : t.is_cpu() ? "cpu" : "a device that is not CUDA";
}

ScalarType storage_of(family::DType dtype) {
  switch (dtype) {  // -Werror=switch: a dtype added to aot/variants.py needs its case
    case family::DType::kFloat16:
      return ScalarType::Half;
    case family::DType::kBfloat16:
      return ScalarType::BFloat16;
    case family::DType::kFloat32:
    case family::DType::kTf32:
      return ScalarType::Float;
    case family::DType::kFloat8E4m3fn:
      return ScalarType::Float8_e4m3fn;
  }
  throw std::logic_error("gg_runtime: a dtype without a storage type");
}

family::DType runtime_dtype(ScalarType type, bool tf32) {
  switch (type) {
    case ScalarType::Half:
      return family::DType::kFloat16;
    case ScalarType::BFloat16:
      return family::DType::kBfloat16;
    case ScalarType::Float:
      return tf32 ? family::DType::kTf32 : family::DType::kFloat32;
    case ScalarType::Float8_e4m3fn:
      return family::DType::kFloat8E4m3fn;
    default:
      type_error("gg_runtime has no kernels for ", dtype_name(type));
  }
}

bool stores(DTypes dtypes, ScalarType type) {
  for (family::DType dtype : dtypes) {
    if (storage_of(dtype) == type) return true;
  }
  return false;
}

std::string dtype_list(DTypes dtypes, const char* prefix) {
  std::vector<ScalarType> listed;
  std::string out;
  for (family::DType dtype : dtypes) {
    const ScalarType type = storage_of(dtype);
    if (std::find(listed.begin(), listed.end(), type) != listed.end()) continue;
    listed.push_back(type);
    out += (out.empty() ? "" : " or ") + std::string(prefix) + short_dtype_name(type);
  }
  return out;
}

void check_dtype(const Tensor& t, const char* name, DTypes dtypes) {
  if (!stores(dtypes, t.scalar_type())) {
    type_error(name, " must be ", dtype_list(dtypes), ", got ", dtype_name(t.scalar_type()));
  }
}

namespace {

void check_dims(const Tensor& t, const char* name, int64_t dims) {
  if (t.dim() != dims) value_error(name, " must be ", dims, "-D, got shape ", shape_of(t));
}

void check_device(const Tensor& t, const char* name) {
  if (!t.is_cuda() && !is_meta(t)) {
    value_error(name, " must be on a CUDA device, got ", device_of(t),
                " (gg_runtime has no CPU kernels)");
  }
}

}  // namespace

void check_tensor(const Tensor& t, const char* name, int64_t dims, DTypes dtypes) {
  check_dims(t, name, dims);
  check_dtype(t, name, dtypes);
  check_device(t, name);
}

void check_tensor(const Tensor& t, const char* name, int64_t dims, ScalarType dtype) {
  check_dims(t, name, dims);
  if (t.scalar_type() != dtype) {
    type_error(name, " must be ", short_dtype_name(dtype), ", got ", dtype_name(t.scalar_type()));
  }
  check_device(t, name);
}

void check_same(const Tensor& x, const char* name, const Tensor& ref, const char* ref_name) {
  if (x.scalar_type() != ref.scalar_type()) {
    type_error(name, " has dtype ", dtype_name(x.scalar_type()), " but ", ref_name, " has ",
               dtype_name(ref.scalar_type()));
  }
  if (x.device() != ref.device()) {
    value_error(name, " is on ", device_of(x), " but ", ref_name, " is on ", device_of(ref));
  }
}

void check_companion(const Tensor& x, const char* name, const Shape& shape, ScalarType dtype,
                     const Tensor& like, const std::string& dtype_text,
                     const std::string& shape_text) {
  if (x.scalar_type() != dtype) {
    type_error(name, " must be ", dtype_text, ", got ", dtype_name(x.scalar_type()));
  }
  if (x.device() != like.device()) {
    value_error(name, " is on ", device_of(x), " but the inputs are on ", device_of(like));
  }
  if (sizes_of(x) != shape) {
    value_error(name, " must have shape ", tuple_text(shape), " ", shape_text, ", got ",
                shape_of(x));
  }
}

void check_bias(const Tensor& bias, int64_t groups, int64_t n, ScalarType out_dtype,
                const Tensor& like) {
  check_companion(bias, "bias", {groups, n}, out_dtype, like,
                  text("of the output's dtype (", dtype_name(out_dtype), ")"),
                  "(one row of N values per group)");
}

void check_offsets(const Tensor& offs, const char* groups_name, int64_t groups,
                   const Tensor& like) {
  if (offs.scalar_type() != ScalarType::Int) {
    type_error("offs must be int32, got ", dtype_name(offs.scalar_type()));
  }
  if (offs.dim() != 1) value_error("offs must be 1-D, got shape ", shape_of(offs));
  if (offs.device() != like.device()) {
    value_error("offs is on ", device_of(offs), " but the inputs are on ", device_of(like));
  }
  if (offs.size(0) != groups) {
    value_error("offs has ", offs.size(0), " entries but ", groups_name, " has ", groups,
                " groups");
  }
  if (offs.size(0) > 1 && offs.stride(0) != 1) value_error("offs must be contiguous");
}

void check_rows(const Tensor& rows, const Tensor& like, const char* like_name) {
  check_tensor(rows, "rows", 1, ScalarType::Long);
  if (rows.device() != like.device()) {
    value_error("rows is on ", device_of(rows), " but ", like_name, " is on ", device_of(like));
  }
}

void check_k(int64_t k) {
  if (k < 1 || k > std::numeric_limits<int32_t>::max()) {
    value_error("k must be in [1, 2**31), got ", k);
  }
}

}  // namespace gg::ops
