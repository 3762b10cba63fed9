#include "moe_inputs.h"

#include <string>
#include <tuple>

namespace gg::ops {
namespace {

std::string dtype_of(const Tensor& t) { return dtype_name(t.scalar_type()); }

bool is_floating(ScalarType type) {
  return type == ScalarType::Half || type == ScalarType::BFloat16 || type == ScalarType::Float ||
         type == ScalarType::Double;
}

}  // namespace

void check_routing_dtypes(const MoeInputs& in) {
  if (in.topk_ids.scalar_type() != ScalarType::Int &&
      in.topk_ids.scalar_type() != ScalarType::Long) {
    type_error("topk_ids must be int32 or int64, got ", dtype_of(in.topk_ids));
  }
  if (!is_floating(in.topk_weights.scalar_type())) {
    type_error("topk_weights must be a floating-point tensor, got ", dtype_of(in.topk_weights));
  }
}

void check_like_x(const MoeInputs& in, std::initializer_list<Named> tensors) {
  for (const auto& [name, value] : tensors) {
    if (value != nullptr && value->scalar_type() != in.x.scalar_type()) {
      type_error(name, " must have x's dtype (", dtype_of(in.x), "), got ", dtype_of(*value));
    }
  }
}

void check_devices(const MoeInputs& in, std::initializer_list<Named> more) {
  const torch::stable::Device device = in.x.device();
  auto same_device = [&](const Named& named) {
    const auto& [name, value] = named;
    if (value != nullptr && value->device() != device) {
      value_error(name, " is on ", device_of(*value), " but x is on ", device_of(in.x));
    }
  };
  for (const Named& named : {Named{"topk_ids", &in.topk_ids},
                             {"topk_weights", &in.topk_weights},
                             {"w13", &in.w13},
                             {"w2", &in.w2},
                             {"b13", given(in.b13)},
                             {"b2", given(in.b2)}}) {
    same_device(named);
  }
  for (const Named& named : more) same_device(named);
  if (!in.x.is_cuda() && !is_meta(in.x)) {
    value_error("x must be on a CUDA device, got ", device_of(in.x),
                " (gg_runtime has no CPU kernels)");
  }
}

void check_shapes(const MoeInputs& in, int64_t values_per_element) {
  if (in.x.dim() != 2 || in.topk_ids.dim() != 2 || in.topk_ids.size(0) != in.x.size(0)) {
    value_error("x must be [T, H] and topk_ids [T, k], got shapes ", shape_of(in.x), " and ",
                shape_of(in.topk_ids));
  }
  if (in.topk_ids.size(1) < 1 || sizes_of(in.topk_weights) != sizes_of(in.topk_ids)) {
    value_error("topk_weights must have topk_ids' shape [T, k] with k >= 1, got ",
                shape_of(in.topk_weights), " and ", shape_of(in.topk_ids));
  }
  const int64_t hidden = in.x.size(1), packing = values_per_element;
  const std::string per = packing == 1 ? "" : "/" + std::to_string(packing);
  if (in.w13.dim() != 3 || in.w13.size(1) % 2 != 0 || in.w13.size(2) * packing != hidden) {
    value_error("w13 must be [E, 2I, H", per, "] with H = ", hidden, " (x's columns), got ",
                shape_of(in.w13));
  }
  const int64_t experts = in.w13.size(0), inter = in.w13.size(1) / 2;
  if (inter % packing != 0) {
    value_error("w13's rows [E, 2I, H", per, "] must give an I that is a multiple of ", packing,
                ", got ", shape_of(in.w13));
  }
  const std::initializer_list<std::tuple<const char*, const Tensor*, Shape>> expected{
      {"w2", &in.w2, {experts, hidden, inter / packing}},
      {"b13", given(in.b13), {experts, 2 * inter}},
      {"b2", given(in.b2), {experts, hidden}}};
  for (const auto& [name, value, shape] : expected) {
    if (value != nullptr && sizes_of(*value) != shape) {
      value_error(name, " must have shape ", tuple_text(shape), " (from w13 [E, 2I, H", per,
                  "] and x), got ", shape_of(*value));
    }
  }
}

}  // namespace gg::ops
