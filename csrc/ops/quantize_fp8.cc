// gg_runtime::quantize_fp8: float16 / bfloat16 / float32 -> float8_e4m3fn
// with float32 scales (the quantize_fp8 kernel family), the inputs of
// scaled_grouped_mm in one call each; quantize_fp8_both_orientations: 128 x
// 128 blocks of x and of x transposed, from one read.  Checks, outputs, one launch.  Meta
// tensors run the same code without the launch.
#include <family_args.h>

#include <utility>
#include <vector>

#include "fp8.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::QuantizeFp8;
using family::Granularity;

// An all-zero block's amax is floored at 1e-12, so its scale is 1e-12 / 448 in
// float32 as torch computes scale.fill_(1e-12).div_(448) (CUDA multiplies by
// the float32 reciprocal there; for these values both round alike).
constexpr float kEmptyScale = 1e-12f / 448.0f;

void check(const Tensor& x) {
  if (x.dim() != 2 && x.dim() != 3) {
    value_error("x must be 2-D [T, K] (activations) or 3-D [G, N, K] (weights), got shape ",
                shape_of(x));
  }
  check_tensor(x, "x", x.dim(), Family::kDTypes);
}

// The scales of x of this shape: per row, per row and 128 columns, or per
// 128 x 128 block of each group's [N, K].
Shape scale_shape(Granularity granularity, Shape shape) {
  const int64_t cols = shape.back();
  shape.pop_back();
  const int64_t rows = shape.back();
  shape.pop_back();  // the groups, if any, are left
  switch (granularity) {
    case Granularity::kRowwise:
      shape.push_back(rows);
      break;
    case Granularity::k1x128:
      shape.insert(shape.end(), {rows, blocks(cols)});
      break;
    case Granularity::k128x128:
      shape.insert(shape.end(), {blocks(rows), blocks(cols)});
      break;
  }
  return shape;
}

// Row-major x as [R, C], groups stacked (copied where they are not), and its
// row stride.
Matrix stacked_rows(const Tensor& x) {
  const int64_t cols = x.size(-1);
  const Tensor flat = torch::stable::reshape(x, {x.numel() / cols, cols});
  // A single row's stride is arbitrary: C keeps the aligned flavour's rule.
  return {flat, family::Major::kRow, flat.size(0) > 1 ? flat.stride(0) : cols};
}

// Elements from one group of a column-major x to the next (0 where there is
// one group, whose stride is arbitrary: 0 keeps the aligned flavour's rule).
int64_t group_stride(const Tensor& x) { return x.dim() == 3 && x.size(0) > 1 ? x.stride(0) : 0; }

// The 128x128 blocks' transposed copy (quantize_fp8_both_orientations), where made.
struct Transposed {
  const Tensor* q = nullptr;
  const Tensor* scale = nullptr;
};

// One launch over x read as `read` says: column-major in place, group by
// group, or row-major with its groups stacked (stacked_rows).
void launch_read(Granularity granularity, const Tensor& x, const Matrix& read, const Tensor& q,
                 const Tensor& scale, Transposed transposed = {}) {
  const bool by_columns = read.major == family::Major::kColumn;
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const Family args{.x_ptr = address(read.t),
                    .q_ptr = address(q),
                    .scale_ptr = address(scale),
                    .R = x.numel() / cols,
                    .C = cols,
                    .group_rows = rows,
                    .ldx = read.ld,
                    .group_stride = by_columns ? group_stride(x) : 0,
                    .contiguous_rows = by_columns ? rows : 0,
                    .qt_ptr = address(transposed.q ? *transposed.q : q),
                    .qt_scale_ptr = address(transposed.scale ? *transposed.scale : scale),
                    .qt_columns = transposed.q ? rows : 0};
  // The input's own dtype code (tf32=false): TF32 has no meaning here.
  sm90_only([&] {
    launch(args, {.granularity = granularity, .x_major = read.major},
           target_of(x, kFp8, /*tf32=*/false));
  });
}

void launch_quantize(Granularity granularity, const Tensor& x, const Tensor& q,
                     const Tensor& scale) {
  // Column-major x (a transposed view, as a weight's w.transpose(1, 2)) is
  // read in place; a copy only where neither of x's last two dimensions is
  // contiguous.
  const Matrix stored = matrix_of(x);
  const bool by_columns = stored.major == family::Major::kColumn;
  launch_read(granularity, x, by_columns ? stored : stacked_rows(stored.t), q, scale);
}

// x's shape with its last two dimensions swapped.
Shape transposed_shape(Shape shape) {
  std::swap(shape[shape.size() - 1], shape[shape.size() - 2]);
  return shape;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor, Tensor> quantize_fp8_both_orientations(Tensor x) {
  check(x);
  const Shape shape = sizes_of(x);
  const Shape shape_t = transposed_shape(shape);
  Tensor q = new_output(x, shape, kFp8);
  Tensor scale = new_output(x, scale_shape(Granularity::k128x128, shape), ScalarType::Float);
  Tensor q_t = new_output(x, shape_t, kFp8);
  Tensor scale_t = new_output(x, scale_shape(Granularity::k128x128, shape_t), ScalarType::Float);
  if (q.numel() == 0 || shapes_only(q)) return {q, scale, q_t, scale_t};
  // The kernel reads x column-major, along its contiguous rows, and converts
  // each block for its q stores (q_t's run along the rows as read): a
  // row-major x goes in as x.mT, whose q and q_t are x's q_t and q.
  const Matrix stored = matrix_of(x);
  if (stored.major == family::Major::kColumn) {
    launch_read(Granularity::k128x128, x, stored, q, scale, {.q = &q_t, .scale = &scale_t});
  } else {
    const Tensor x_t = torch::stable::transpose(row_major(x).t, -2, -1);
    const Matrix read{x_t, family::Major::kColumn,
                      x_t.size(-1) > 1 ? x_t.stride(-1) : x_t.size(-2)};
    launch_read(Granularity::k128x128, x_t, read, q_t, scale_t, {.q = &q, .scale = &scale});
  }
  return {q, scale, q_t, scale_t};
}

std::tuple<Tensor, Tensor> quantize_fp8(Tensor x, std::string granularity_name) {
  const auto granularity = parse_choice<Granularity>("granularity", granularity_name);
  check(x);
  const Shape shape = sizes_of(x);
  Tensor q = new_output(x, shape, kFp8);
  Tensor scale = new_output(x, scale_shape(granularity, shape), ScalarType::Float);
  if (q.numel() > 0) {
    if (!shapes_only(q)) launch_quantize(granularity, x, q, scale);
  } else if (scale.numel() > 0) {  // rowwise scales of empty rows: an all-zero row's
    filled(scale, static_cast<double>(kEmptyScale));
  }
  return {q, scale};
}

}  // namespace gg::ops
