// gg_runtime::swiglu and swiglu_backward: the SwiGLU between moe_experts'
// grouped products (the swiglu kernel family), one launch each way; and
// swiglu_backward_fp8, the backward with its outputs quantized for fp8
// training (the swiglu_backward_fp8 family).  Checks, outputs, launches; Meta
// tensors run the same code without the launches.
#include <family_args.h>

#include <string>
#include <tuple>

#include "fp8.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::Swiglu;
using family::Direction;

// gu [R, 2C]: each row's gate and up halves; returns C.
int64_t check_gate_up(const Tensor& gu) {
  check_tensor(gu, "gu", 2, Family::kDTypes);
  if (gu.size(1) % 2 != 0) {
    value_error("gu must be [R, 2C] (each row's gate and up halves), got shape ", shape_of(gu));
  }
  return gu.size(1) / 2;
}

// grad [R, C] (gu's rows, half its columns), gu's dtype; scale [R] float32.
void check_backward_inputs(const Tensor& gu, const Tensor& grad, const Tensor& scale, int64_t c) {
  check_same(grad, "grad", gu, "gu");
  const int64_t rows = gu.size(0);
  if (grad.size(0) != rows || grad.size(1) != c) {
    value_error("grad must have shape (", rows, ", ", c, ") (gu's rows, half its columns), got ",
                shape_of(grad));
  }
  check_companion(scale, "scale", {rows}, ScalarType::Float, gu, "float32",
                  "(one routing weight per row)");
}

// The variant for `direction` of the str argument gate_up.
Family::Axes axes_of(Direction direction, const std::string& gate_up) {
  return {.direction = direction, .gate_up = parse_choice<family::GateUp>("gate_up", gate_up)};
}

// The kernels' `activation` argument of the str argument activation.
int64_t activation_code(const std::string& activation) {
  return family::choice_code(parse_choice<family::Activation>("activation", activation));
}

}  // namespace

Tensor swiglu(Tensor gu_in, std::string gate_up, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  const Family::Axes axes = axes_of(Direction::kForward, gate_up);
  const int64_t activation_value = activation_code(activation);
  Tensor h = new_output(gu_in, {gu_in.size(0), c}, gu_in.scalar_type());
  if (h.numel() == 0 || shapes_only(h)) return h;
  const Tensor gu = dense(gu_in);
  // The backward's pointers are not read: gu and h stand in.
  const Family args{.gu_ptr = address(gu),
                    .grad_ptr = address(gu),
                    .scale_ptr = address(gu),
                    .h_ptr = address(h),
                    .dgu_ptr = address(h),
                    .dot_ptr = address(h),
                    .R = gu.size(0),
                    .C = c,
                    .activation = activation_value};
  launch(args, axes, target_of(gu, gu.scalar_type()));
  return h;
}

std::tuple<Tensor, Tensor, Tensor> swiglu_backward(Tensor gu_in, Tensor grad_in, Tensor scale_in,
                                                   std::string gate_up, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  const Family::Axes axes = axes_of(Direction::kBackward, gate_up);
  const int64_t activation_value = activation_code(activation);
  const int64_t rows = gu_in.size(0);
  check_tensor(grad_in, "grad", 2, Family::kDTypes);
  check_backward_inputs(gu_in, grad_in, scale_in, c);
  Tensor dgu = new_output(gu_in, {rows, 2 * c}, gu_in.scalar_type());
  Tensor h = new_output(gu_in, {rows, c}, gu_in.scalar_type());
  Tensor dot = new_output(gu_in, {rows}, ScalarType::Float);
  if (h.numel() == 0) filled(dot, 0.0);  // the sum over no columns
  if (h.numel() == 0 || shapes_only(h)) return {dgu, h, dot};
  const Tensor gu = dense(gu_in), grad = dense(grad_in);
  const Tensor scale = as_contiguous(scale_in);
  const Family args{.gu_ptr = address(gu),
                    .grad_ptr = address(grad),
                    .scale_ptr = address(scale),
                    .h_ptr = address(h),
                    .dgu_ptr = address(dgu),
                    .dot_ptr = address(dot),
                    .R = rows,
                    .C = c,
                    .activation = activation_value};
  launch(args, axes, target_of(gu, gu.scalar_type()));
  return {dgu, h, dot};
}

Fp8Backward swiglu_backward_fp8(Tensor gu_in, Tensor grad_in, Tensor scale_in, Tensor offs,
                                std::string gate_up, std::string activation, bool dgu_sums) {
  using Fp8Family = family::SwigluBackwardFp8;
  check_tensor(gu_in, "gu", 2, Fp8Family::kDTypes);
  const int64_t c = check_gate_up(gu_in);
  const Fp8Family::Axes axes{.gate_up = parse_choice<family::GateUp>("gate_up", gate_up),
                             .sums = dgu_sums ? family::Sums::kDgu : family::Sums::kNone};
  const int64_t activation_value = activation_code(activation);
  check_tensor(grad_in, "grad", 2, Fp8Family::kDTypes);
  check_backward_inputs(gu_in, grad_in, scale_in, c);
  check_offsets(offs, "offs", offs.dim() == 1 ? offs.size(0) : 0, gu_in);
  if (c % kAlign != 0) value_error("gu's halves must have a multiple of 16 columns, got ", c);
  if (axes.gate_up == family::GateUp::kConcatenated && c % kBlock != 0) {
    value_error("gate_up='concatenated' needs gu's halves to have a multiple of 128 columns ",
                "(each half's 1x128 blocks), got ", c);
  }
  const int64_t rows = gu_in.size(0), groups = offs.size(0);
  // quantize_fp8_columns' layout: every group's 128-row blocks, 128 columns each.
  const int64_t column_blocks = rows / kBlock + groups;
  Tensor dgu = new_output(gu_in, {rows, 2 * c}, kFp8);
  Tensor dgu_scale = new_output(gu_in, {rows, blocks(2 * c)}, ScalarType::Float);
  Tensor dgu_columns = new_output(gu_in, {2 * c, column_blocks * kBlock}, kFp8);
  Tensor dgu_columns_scale = new_output(gu_in, {column_blocks, 2 * c}, ScalarType::Float);
  Tensor h_columns = new_output(gu_in, {c, column_blocks * kBlock}, kFp8);
  Tensor h_columns_scale = new_output(gu_in, {column_blocks, c}, ScalarType::Float);
  // Rows outside the groups (dropped slots) are not written: their sums are 0;
  // so are the column sums of the blocks no group's rows fall in.
  Tensor dot = filled(new_output(gu_in, {blocks(c), rows}, ScalarType::Float), 0.0);
  Tensor dgu_columns_sum =
      filled(new_output(gu_in, {dgu_sums ? column_blocks : 0, 2 * c}, ScalarType::Float), 0.0);
  const Fp8Backward out{dgu,       dgu_scale,       dgu_columns, dgu_columns_scale,
                        h_columns, h_columns_scale, dot,         dgu_columns_sum};
  if (groups == 0 || rows == 0 || c == 0 || shapes_only(dgu)) return out;
  const Tensor gu = packed_aligned(gu_in), grad = packed_aligned(grad_in);
  const Tensor scale = as_contiguous(scale_in);
  const Fp8Family args{.gu_ptr = address(gu),
                       .grad_ptr = address(grad),
                       .scale_ptr = address(scale),
                       .offs_ptr = address(offs),
                       .dgu_q_ptr = address(dgu),
                       .dgu_scale_ptr = address(dgu_scale),
                       .dgu_cols_ptr = address(dgu_columns),
                       .dgu_cols_scale_ptr = address(dgu_columns_scale),
                       .h_cols_ptr = address(h_columns),
                       .h_cols_scale_ptr = address(h_columns_scale),
                       .dot_ptr = address(dot),
                       .dgu_cols_sum_ptr = address(dgu_columns_sum),
                       .R = rows,
                       .C = c,
                       .G = groups,
                       .activation = activation_value};
  sm90_only([&] { launch(args, axes, target_of(gu, kFp8, /*tf32=*/false)); });
  return out;
}

}  // namespace gg::ops
