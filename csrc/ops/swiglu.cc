// gg_runtime::swiglu and swiglu_backward: the SwiGLU between moe_experts'
// grouped products (the swiglu kernel family), one launch each way.  Checks,
// outputs, launches; Meta tensors run the same code without the launches.
#include <family_args.h>

#include <string>
#include <tuple>

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

// The variant for `direction` of the str arguments gate_up and activation.
Family::Axes axes_of(Direction direction, const std::string& gate_up,
                     const std::string& activation) {
  return {.direction = direction,
          .gate_up = parse_choice<family::GateUp>("gate_up", gate_up),
          .activation = parse_choice<family::Activation>("activation", activation)};
}

}  // namespace

Tensor swiglu(Tensor gu_in, std::string gate_up, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  const Family::Axes axes = axes_of(Direction::kForward, gate_up, activation);
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
                    .C = c};
  launch(args, axes, target_of(gu, gu.scalar_type()));
  return h;
}

std::tuple<Tensor, Tensor, Tensor> swiglu_backward(Tensor gu_in, Tensor grad_in, Tensor scale_in,
                                                   std::string gate_up, std::string activation) {
  const int64_t c = check_gate_up(gu_in);
  const Family::Axes axes = axes_of(Direction::kBackward, gate_up, activation);
  const int64_t rows = gu_in.size(0);
  check_tensor(grad_in, "grad", 2, Family::kDTypes);
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
                    .C = c};
  launch(args, axes, target_of(gu, gu.scalar_type()));
  return {dgu, h, dot};
}

}  // namespace gg::ops
