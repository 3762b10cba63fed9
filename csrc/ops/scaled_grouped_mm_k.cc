// gg_runtime::scaled_grouped_mm_k: the fp8 weight gradient, out[g] = a_g @
// b_g^T for each group g of the offsets, from a [M, W] and b [N, W] that
// quantize_fp8_columns made from [rows, M] and [rows, N] with the same
// offsets (scales per row per group, or per 1x128 block along T), on the
// scaled_ragged_k kernel family.  Checks, output, one launch.  Meta tensors
// run the same code without the launch.
#include <family_args.h>

#include "fp8.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::ScaledRaggedK;
using family::Scaling;

// quantize_fp8_columns' layout: every group's rows in whole 128-wide blocks.
int64_t padded_blocks(int64_t rows, int64_t groups) { return rows / kBlock + groups; }

void check_width(const Tensor& x, const char* name, int64_t width) {
  if (x.size(1) != width || (x.numel() > 0 && x.stride(0) != width) ||
      (x.size(1) > 1 && x.stride(1) != 1)) {
    value_error(name, " must be a contiguous [*, ", width,
                "] tensor (quantize_fp8_columns' layout for these rows and offsets), got shape ",
                shape_of(x), " strides ", strides_of(x));
  }
}

Scaling check(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
              const Tensor& offs, int64_t rows, const std::string& scaling_name,
              ScalarType out_dtype) {
  const auto scaling = parse_choice<Scaling>("scaling", scaling_name);
  if (scaling == Scaling::kBlockwiseRowwise) {
    value_error("scaling must be 'rowwise' or 'blockwise', got '", scaling_name, "'");
  }
  if (rows < 0) value_error("rows must be >= 0, got ", rows);
  check_tensor(a, "a", 2, Family::kDTypes);
  check_tensor(b, "b", 2, Family::kDTypes);
  check_same(b, "b", a, "a");
  const int64_t groups = offs.dim() == 1 ? offs.size(0) : 0;
  check_offsets(offs, "offs", groups, a);
  const int64_t width = padded_blocks(rows, groups) * kBlock;
  check_width(a, "a", width);
  check_width(b, "b", width);
  if (a.size(0) % kAlign || b.size(0) % kAlign) {
    value_error("a's and b's rows (the output's rows and columns) must be multiples of ", kAlign,
                ", got ", a.size(0), " and ", b.size(0));
  }
  // Scales are stored group by group or block by block (a row each).
  const int64_t scale_rows = scaling == Scaling::kRowwise ? groups : width / kBlock;
  const char* why =
      scaling == Scaling::kRowwise ? "one per group per row" : "one per 128-wide block per row";
  check_companion(scale_a, "scale_a", {scale_rows, a.size(0)}, ScalarType::Float, a, "float32",
                  why);
  check_companion(scale_b, "scale_b", {scale_rows, b.size(0)}, ScalarType::Float, a, "float32",
                  why);
  if (!stores(Family::kOutDTypes, out_dtype)) {
    type_error("out_dtype must be ", dtype_list(Family::kOutDTypes, "torch."), ", got ",
               dtype_name(out_dtype));
  }
  return scaling;
}

}  // namespace

Tensor scaled_grouped_mm_k(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs,
                           int64_t rows, std::string scaling, std::optional<ScalarType> out_dtype) {
  const ScalarType out_type = out_dtype.value_or(ScalarType::BFloat16);
  const Family::Axes axes{.scaling = check(a, b, scale_a, scale_b, offs, rows, scaling, out_type)};
  const int64_t groups = offs.size(0), m = a.size(0), n = b.size(0);
  Tensor out = new_output(a, {groups, m, n}, out_type);
  if (out.numel() == 0 || shapes_only(out)) return out;
  scale_a = as_contiguous(scale_a);
  scale_b = as_contiguous(scale_b);
  const Family args{.a_ptr = address(a),
                    .b_ptr = address(b),
                    .c_ptr = address(out),
                    .offs_ptr = address(offs),
                    .scale_a_ptr = address(scale_a),
                    .scale_b_ptr = address(scale_b),
                    .M = m,
                    .N = n,
                    .T = rows,
                    .G = groups,
                    .ldc = n};
  sm90_only([&] { launch(args, axes, target_of(a, out_type)); });
  return out;
}

}  // namespace gg::ops
