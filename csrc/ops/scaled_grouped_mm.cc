// gg_runtime::scaled_grouped_mm: fp8 (e4m3) grouped GEMM with float32 scales,
// rowwise, per 128-block, or a's per 128-block with b's per column, on the
// scaled_ragged_m kernel family: ragged M
// (a [T, K], b [G, K, N], offs) and batched (a [G, M, K], b [G, K, N]).  Every
// check of the inputs, then one launch.  Meta tensors run the same code
// without the launch (torch.compile's fake kernel).
#include <family_args.h>

#include <array>
#include <utility>
#include <vector>

#include "fp8.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::ScaledRaggedM;
using Axes = Family::Axes;
using family::Scaling;

void check_scale(const Tensor& scale, const char* name, const Shape& shape, const Tensor& a) {
  check_companion(scale, name, shape, ScalarType::Float, a, "float32", "for these inputs");
}

// rowwise: one scale per row of a; blockwise: one per row and 128-wide K
// block, with b's per 128 x 128 block (3-D) or per column (2-D: blockwise_rowwise).
Scaling scaling_of(const Tensor& a, const Tensor& scale_a, const Tensor& scale_b) {
  if (scale_a.dim() == a.dim() - 1) return Scaling::kRowwise;
  if (scale_a.dim() == a.dim()) {
    return scale_b.dim() == 2 ? Scaling::kBlockwiseRowwise : Scaling::kBlockwise;
  }
  value_error("scale_a must be ", a.dim() - 1, "-D (rowwise) or ", a.dim(),
              "-D (per 1x128 block) for a ", a.dim(), "-D mat_a, got shape ", shape_of(scale_a));
}

// (scale_a's, scale_b's) shape; rows: a's leading dimensions.
std::pair<Shape, Shape> scale_shapes(Scaling scaling, int64_t groups, Shape rows, int64_t n,
                                     int64_t k) {
  if (scaling == Scaling::kRowwise) return {rows, {groups, n}};
  rows.push_back(blocks(k));
  if (scaling == Scaling::kBlockwiseRowwise) return {rows, {groups, n}};
  return {rows, {groups, blocks(n), blocks(k)}};
}

// a row-major, b K-major, every stride 16-byte aligned.
void check_layouts(const Tensor& a, const Tensor& b) {
  const int64_t k = b.size(-2), n = b.size(-1);
  if (a.stride(-1) != 1 && k > 1) {
    value_error("mat_a must be row-major (unit stride in its last dimension), got strides ",
                strides_of(a));
  }
  if (b.stride(-2) != 1 && k > 1) {
    value_error("mat_b must be K-major: [G, K, N] as a transposed view of a [G, N, K] tensor ",
                "(fp8 tensor cores read both operands K-major), got strides ", strides_of(b),
                " for shape ", shape_of(b), "; pass w.transpose(-2, -1) of the [G, N, K] weight");
  }
  if (k % kAlign || n % kAlign) {
    value_error("fp8 needs K and N to be multiples of ", kAlign, " (16-byte rows), got K=", k,
                ", N=", n);
  }
  if (k && (a.stride(-2) % kAlign || b.stride(0) % kAlign || b.stride(-1) % kAlign)) {
    value_error("fp8 inputs need row strides that are multiples of ", kAlign,
                " elements, got mat_a strides ", strides_of(a), ", mat_b strides ", strides_of(b));
  }
}

void check_scale_result(const std::optional<Tensor>& scale_result, const Tensor& a) {
  if (!scale_result.has_value()) return;
  const Tensor& s = *scale_result;
  if (s.scalar_type() != ScalarType::Float || s.numel() != 1) {
    value_error("scale_result must be one float32 value, got ", dtype_name(s.scalar_type()),
                " of shape ", shape_of(s));
  }
  if (s.device() != a.device()) {
    value_error("scale_result is on ", device_of(s), " but mat_a is on ", device_of(a));
  }
}

// Every check of scaled_grouped_mm's inputs; the scaling.
Scaling check(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
              const std::optional<Tensor>& offs, const std::optional<Tensor>& bias,
              const std::optional<Tensor>& scale_result, ScalarType out_dtype) {
  if ((a.dim() != 2 && a.dim() != 3) || b.dim() != 3) {
    value_error("scaled_grouped_mm takes mat_a [T, K] with mat_b [G, K, N] and offs, or mat_a ",
                "[G, M, K] with mat_b [G, K, N]; got mat_a ", shape_of(a), ", mat_b ", shape_of(b),
                " (fp8 weight gradients, 2-D x 2-D, are not supported)");
  }
  check_tensor(a, "mat_a", a.dim(), Family::kDTypes);
  check_tensor(b, "mat_b", 3, Family::kDTypes);
  check_same(b, "mat_b", a, "mat_a");
  const int64_t groups = b.size(0), k = b.size(1), n = b.size(2);
  if (a.size(-1) != k || (a.dim() == 3 && a.size(0) != groups)) {
    value_error("mat_a is ", shape_of(a), " and mat_b is ", shape_of(b),
                ": expected mat_a [T, K] or [G, M, K] with mat_b [G, K, N]");
  }
  if (a.dim() == 2) {
    if (!offs.has_value()) value_error("offs is required when mat_a is 2-D");
    check_offsets(*offs, "mat_b", groups, a);
  } else if (offs.has_value()) {
    value_error("offs must be None when mat_a is 3-D");
  }
  if (!stores(Family::kOutDTypes, out_dtype)) {
    type_error("out_dtype must be ", dtype_list(Family::kOutDTypes, "torch."), ", got ",
               dtype_name(out_dtype));
  }
  const Scaling scaling = scaling_of(a, scale_a, scale_b);
  Shape rows = sizes_of(a);
  rows.pop_back();
  const auto [shape_a, shape_b] = scale_shapes(scaling, groups, rows, n, k);
  check_scale(scale_a, "scale_a", shape_a, a);
  check_scale(scale_b, "scale_b", shape_b, a);
  check_scale_result(scale_result, a);
  if (bias.has_value()) {
    check_bias(*bias, groups, n, out_dtype, a);
  }
  check_layouts(a, b);
  return scaling;
}

// out[T, N] of a [T, K] (row-major), b [G, K, N] (K-major), int32 end offsets,
// contiguous scales and bias, scaled and accumulated as `axes` say.
Tensor ragged_rows(const Axes& axes, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                   const Tensor& scale_b, const Tensor& offs, const std::optional<Tensor>& bias,
                   ScalarType out_dtype) {
  const int64_t rows = a.size(0), k = a.size(1), groups = b.size(0), n = b.size(2);
  if (!shapes_only(a) && (address(a) % kAlign || address(b) % kAlign)) {
    value_error("fp8 inputs need 16-byte aligned data pointers (a view starting at an offset ",
                "that is not a multiple of ", kAlign, " elements is not): call .contiguous()");
  }
  if (k == 0 && bias.has_value()) {  // an empty product plus bias: ragged_m's 16-bit kernels
    return grouped_mm(new_output(a, {rows, 0}, ScalarType::BFloat16),
                      new_output(b, {groups, 0, n}, ScalarType::BFloat16), offs, bias, out_dtype,
                      false);
  }
  Tensor out = new_output(a, {rows, n}, out_dtype);
  if (groups == 0 || k == 0) return zeroed(out);  // the product is zero
  if (shapes_only(out)) return out;
  const Family args{.a_ptr = address(a),
                    .b_ptr = address(b),
                    .c_ptr = address(out),
                    .offs_ptr = address(offs),
                    .scale_a_ptr = address(scale_a),
                    .scale_b_ptr = address(scale_b),
                    .T = rows,
                    .N = n,
                    .K = k,
                    .G = groups,
                    .lda = a.stride(0),
                    .b_group_stride = b.stride(0),
                    .ldb = b.stride(2),
                    .ldc = n,
                    .bias_ptr = bias ? address(*bias) : 0,
                    .has_bias = bias ? 1 : 0};
  sm90_only([&] { launch(args, axes, target_of(a, out_dtype)); });
  return out;
}

// a [G, M, K] as G*M stacked rows (one copy where its batches are not), one
// group per batch.
Tensor batched(const Axes& axes, const Tensor& a_in, const Tensor& b, const Tensor& scale_a,
               const Tensor& scale_b, const std::optional<Tensor>& bias, ScalarType out_dtype) {
  const int64_t groups = a_in.size(0), m = a_in.size(1), k = a_in.size(2), n = b.size(2);
  const Tensor a = a_in.stride(0) != m * a_in.stride(1) ? contiguous_copy(a_in) : a_in;
  Shape flat_scale_a = sizes_of(scale_a);
  flat_scale_a.erase(flat_scale_a.begin(), flat_scale_a.begin() + 2);
  flat_scale_a.insert(flat_scale_a.begin(), groups * m);
  const Tensor out = ragged_rows(axes, torch::stable::reshape(a, {groups * m, k}), b,
                                 torch::stable::reshape(scale_a, flat_scale_a), scale_b,
                                 batch_offsets(a, groups, m), bias, out_dtype);
  return torch::stable::view(out, {groups, m, n});
}

}  // namespace

Tensor scaled_grouped_mm(Tensor mat_a, Tensor mat_b, Tensor scale_a, Tensor scale_b,
                         std::optional<Tensor> offs, std::optional<Tensor> bias,
                         std::optional<Tensor> scale_result, std::optional<ScalarType> out_dtype,
                         bool use_fast_accum) {
  const ScalarType out_type = out_dtype.value_or(ScalarType::BFloat16);
  const Axes axes{
      .scaling = check(mat_a, mat_b, scale_a, scale_b, offs, bias, scale_result, out_type),
      .accumulation =
          use_fast_accum ? family::Accumulation::kFast : family::Accumulation::kPromoted};
  if (scale_result.has_value()) {
    scale_a = aten("aten::mul", "Tensor", scale_a, torch::stable::reshape(*scale_result, {}));
  }
  scale_a = as_contiguous(scale_a);
  scale_b = as_contiguous(scale_b);
  if (bias.has_value()) bias = as_contiguous(*bias);
  if (mat_a.dim() == 2) {
    return ragged_rows(axes, mat_a, mat_b, scale_a, scale_b, *offs, bias, out_type);
  }
  return batched(axes, mat_a, mat_b, scale_a, scale_b, bias, out_type);
}

}  // namespace gg::ops
