// gg_runtime::swiglu and swiglu_backward: the SwiGLU between moe_experts'
// grouped products (the swiglu kernel family), one launch each way; and
// grouped_mm_glu, the up projection with its SwiGLU in the epilogue (the
// ragged_glu family).  Checks, outputs, launches; Meta tensors run the same
// code without the launches.
#include <family_args.h>

#include <limits>
#include <string>
#include <tuple>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// The dtypes the swiglu family is built for (aot/families/swiglu.py).
const std::initializer_list<ScalarType> kDTypes{ScalarType::Half, ScalarType::BFloat16};

// gu [R, 2C]: each row's gate and up halves; returns C.
int64_t check_gate_up(const Tensor& gu) {
  check_tensor(gu, "gu", 2, kDTypes);
  if (gu.size(1) % 2 != 0) {
    value_error("gu must be [R, 2C] (each row's gate and up halves), got shape ", shape_of(gu));
  }
  return gu.size(1) / 2;
}

// The activations the family is built for (aot/families/swiglu.py).
const std::initializer_list<const char*> kActivations{"swiglu", "gpt_oss"};

void check_activation(const std::string& activation) {
  bool known = false;
  for (const char* name : kActivations) known = known || activation == name;
  if (!known) value_error("activation must be 'swiglu' or 'gpt_oss', got '", activation, "'");
}

// The variant's layout: DIRECTION_GATEUP_ACTIVATION.
std::string layout_of(const char* direction, bool interleaved, const std::string& activation) {
  return std::string(direction) + (interleaved ? "_interleaved_" : "_concatenated_") + activation;
}

// w13 [G, 2I, H] against x [T, H]; returns I.
int64_t check_w13(const Tensor& w13, const Tensor& x) {
  check_tensor(w13, "w13", 3, kDTypes);
  check_same(w13, "w13", x, "x");
  if (w13.size(1) % 2 != 0 || w13.size(2) != x.size(1)) {
    value_error("w13 must be [G, 2I, H] with H = ", x.size(1), " (x's columns), got shape ",
                shape_of(w13));
  }
  return w13.size(1) / 2;
}

}  // namespace

std::tuple<Tensor, Tensor> grouped_mm_glu(Tensor x_in, std::optional<Tensor> rows_in, int64_t k,
                                          Tensor w13, Tensor offs, std::optional<Tensor> bias,
                                          bool interleaved, std::string activation, bool save_gu) {
  check_tensor(x_in, "x", 2, kDTypes);
  if (rows_in.has_value()) {
    check_tensor(*rows_in, "rows", 1, {ScalarType::Long});
    if (rows_in->device() != x_in.device()) {
      value_error("rows is on ", device_of(*rows_in), " but x is on ", device_of(x_in));
    }
  }
  if (k < 1 || k > std::numeric_limits<int32_t>::max()) {
    value_error("k must be in [1, 2**31), got ", k);
  }
  const int64_t inter = check_w13(w13, x_in), groups = w13.size(0);
  const int64_t rows = rows_in.has_value() ? rows_in->size(0) : x_in.size(0);
  check_offsets(offs, "w13", groups, x_in);
  check_activation(activation);
  if (bias.has_value()) check_bias(*bias, groups, 2 * inter, x_in.scalar_type(), x_in);
  const Matrix b = matrix_of_transpose(w13);  // [G, H, 2I]: the b of x @ b
  const Matrix a = row_major(x_in);
  // Without rows the kernels read x's rows in order (rows_div 0; offs stands in).
  const Tensor gather = rows_in.has_value() ? as_contiguous(*rows_in) : offs;
  Tensor h = new_output(x_in, {rows, inter}, x_in.scalar_type());
  Tensor gu = new_output(x_in, {save_gu ? rows : 0, 2 * inter}, x_in.scalar_type());
  if (groups == 0) {  // every row past the last group: zeros
    torch::stable::zero_(gu);
    return {torch::stable::zero_(h), gu};
  }
  if (shapes_only(h)) return {h, gu};
  const std::optional<Tensor> bias_rows =
      bias.has_value() ? std::optional(as_contiguous(*bias)) : std::nullopt;
  const family::RaggedGlu args{.a_ptr = address(a.t),
                               .b_ptr = address(b.t),
                               .c_ptr = address(h),
                               .offs_ptr = address(offs),
                               .T = rows,
                               .N = 2 * inter,
                               .K = a.t.size(1),
                               .G = groups,
                               .lda = a.ld,
                               .b_group_stride = b.t.stride(0),
                               .ldb = b.ld,
                               .ldc = inter,
                               .bias_ptr = bias_rows ? address(*bias_rows) : 0,
                               .has_bias = bias_rows ? 1 : 0,
                               .gu_ptr = address(save_gu ? gu : h),
                               .save_gu = save_gu ? 1 : 0,
                               .gpt_oss = activation == "gpt_oss" ? 1 : 0,
                               .rows_ptr = address(gather),
                               .rows_div = rows_in.has_value() ? k : 0};
  launch(args, text(b.transposed ? "t" : "n", interleaved ? "_interleaved" : "_concatenated"),
         target_of(a.t, a.t.scalar_type()));
  return {h, gu};
}

Tensor swiglu(Tensor gu_in, bool interleaved, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  check_activation(activation);
  Tensor h = new_output(gu_in, {gu_in.size(0), c}, gu_in.scalar_type());
  if (h.numel() == 0 || shapes_only(h)) return h;
  const Tensor gu = dense(gu_in);
  // The backward's pointers are not read: gu and h stand in.
  const family::Swiglu args{.gu_ptr = address(gu),
                            .grad_ptr = address(gu),
                            .scale_ptr = address(gu),
                            .h_ptr = address(h),
                            .dgu_ptr = address(h),
                            .dot_ptr = address(h),
                            .R = gu.size(0),
                            .C = c};
  launch(args, layout_of("forward", interleaved, activation), target_of(gu, gu.scalar_type()));
  return h;
}

std::tuple<Tensor, Tensor, Tensor> swiglu_backward(Tensor gu_in, Tensor grad_in, Tensor scale_in,
                                                   bool interleaved, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  check_activation(activation);
  const int64_t rows = gu_in.size(0);
  check_tensor(grad_in, "grad", 2, kDTypes);
  check_same(grad_in, "grad", gu_in, "gu");
  if (grad_in.size(0) != rows || grad_in.size(1) != c) {
    value_error("grad must have shape (", rows, ", ", c, ") (gu's rows, half its columns), got ",
                shape_of(grad_in));
  }
  check_companion(scale_in, "scale", {rows}, ScalarType::Float, gu_in, "float32",
                  "(one routing weight per row)");
  Tensor dgu = new_output(gu_in, {rows, 2 * c}, gu_in.scalar_type());
  Tensor h = new_output(gu_in, {rows, c}, gu_in.scalar_type());
  Tensor dot = new_output(gu_in, {rows}, ScalarType::Float);
  if (h.numel() == 0) torch::stable::fill_(dot, 0.0);  // the sum over no columns
  if (h.numel() == 0 || shapes_only(h)) return {dgu, h, dot};
  const Tensor gu = dense(gu_in), grad = dense(grad_in);
  const Tensor scale = as_contiguous(scale_in);
  const family::Swiglu args{.gu_ptr = address(gu),
                            .grad_ptr = address(grad),
                            .scale_ptr = address(scale),
                            .h_ptr = address(h),
                            .dgu_ptr = address(dgu),
                            .dot_ptr = address(dot),
                            .R = rows,
                            .C = c};
  launch(args, layout_of("backward", interleaved, activation), target_of(gu, gu.scalar_type()));
  return {dgu, h, dot};
}

}  // namespace gg::ops
