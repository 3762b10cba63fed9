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

// The variant's layout: DIRECTION_GATEUP_ACTIVATION.
std::string layout_of(const char* direction, bool interleaved, const std::string& activation) {
  return std::string(direction) + (interleaved ? "_interleaved_" : "_concatenated_") + activation;
}

// The activations the family is built for (aot/families/swiglu.py).
const std::initializer_list<const char*> kActivations{"swiglu", "gpt_oss"};

}  // namespace

void check_activation(const std::string& activation) {
  bool known = false;
  for (const char* name : kActivations) known = known || activation == name;
  if (!known) value_error("activation must be 'swiglu' or 'gpt_oss', got '", activation, "'");
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
  if (h.numel() == 0) filled(dot, 0.0);  // the sum over no columns
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
