// gg_runtime::moe_experts: the forward of gg_runtime.moe_experts in one
// operator, so that its host work is one call: every check of its arguments
// (messages name moe_experts' arguments), the routing, the up projection
// with its activation, the down projection and the weighted combine, whose
// kernels are launched together (LaunchGroup).  Meta tensors run the same
// code without the launches.
#include <family_args.h>

#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

std::string dtype_of(const Tensor& t) { return dtype_name(t.scalar_type()); }

bool is_floating(ScalarType type) {
  return type == ScalarType::Half || type == ScalarType::BFloat16 || type == ScalarType::Float ||
         type == ScalarType::Double;
}

using Named = std::pair<const char*, const Tensor*>;

const Tensor* given(const std::optional<Tensor>& t) { return t ? &*t : nullptr; }

// moe_experts' tensor arguments.
struct Inputs {
  const Tensor& x;
  const Tensor& topk_ids;
  const Tensor& topk_weights;
  const Tensor& w13;
  const Tensor& w2;
  const std::optional<Tensor>& b13;
  const std::optional<Tensor>& b2;
};

void check_dtypes(const Inputs& in) {
  check_dtype(in.x, "x", family::RaggedGlu::kDTypes);  // the up projection's
  if (in.topk_ids.scalar_type() != ScalarType::Int &&
      in.topk_ids.scalar_type() != ScalarType::Long) {
    type_error("topk_ids must be int32 or int64, got ", dtype_of(in.topk_ids));
  }
  if (!is_floating(in.topk_weights.scalar_type())) {
    type_error("topk_weights must be a floating-point tensor, got ", dtype_of(in.topk_weights));
  }
  for (const auto& [name, value] :
       {Named{"w13", &in.w13}, {"w2", &in.w2}, {"b13", given(in.b13)}, {"b2", given(in.b2)}}) {
    if (value != nullptr && value->scalar_type() != in.x.scalar_type()) {
      type_error(name, " must have x's dtype (", dtype_of(in.x), "), got ", dtype_of(*value));
    }
  }
}

void check_devices(const Inputs& in) {
  const torch::stable::Device device = in.x.device();
  for (const auto& [name, value] : {Named{"topk_ids", &in.topk_ids},
                                    {"topk_weights", &in.topk_weights},
                                    {"w13", &in.w13},
                                    {"w2", &in.w2},
                                    {"b13", given(in.b13)},
                                    {"b2", given(in.b2)}}) {
    if (value != nullptr && value->device() != device) {
      value_error(name, " is on ", device_of(*value), " but x is on ", device_of(in.x));
    }
  }
  if (!in.x.is_cuda() && !is_meta(in.x)) {
    value_error("x must be on a CUDA device, got ", device_of(in.x),
                " (gg_runtime has no CPU kernels)");
  }
}

void check_shapes(const Inputs& in) {
  if (in.x.dim() != 2 || in.topk_ids.dim() != 2 || in.topk_ids.size(0) != in.x.size(0)) {
    value_error("x must be [T, H] and topk_ids [T, k], got shapes ", shape_of(in.x), " and ",
                shape_of(in.topk_ids));
  }
  if (in.topk_ids.size(1) < 1 || sizes_of(in.topk_weights) != sizes_of(in.topk_ids)) {
    value_error("topk_weights must have topk_ids' shape [T, k] with k >= 1, got ",
                shape_of(in.topk_weights), " and ", shape_of(in.topk_ids));
  }
  const int64_t hidden = in.x.size(1);
  if (in.w13.dim() != 3 || in.w13.size(1) % 2 != 0 || in.w13.size(2) != hidden) {
    value_error("w13 must be [E, 2I, H] with H = ", hidden, " (x's columns), got ",
                shape_of(in.w13));
  }
  const int64_t experts = in.w13.size(0), inter = in.w13.size(1) / 2;
  const std::initializer_list<std::tuple<const char*, const Tensor*, Shape>> expected{
      {"w2", &in.w2, {experts, hidden, inter}},
      {"b13", given(in.b13), {experts, 2 * inter}},
      {"b2", given(in.b2), {experts, hidden}}};
  for (const auto& [name, value, shape] : expected) {
    if (value != nullptr && sizes_of(*value) != shape) {
      value_error(name, " must have shape ", tuple_text(shape),
                  " (from w13 [E, 2I, H] and x), got ", shape_of(*value));
    }
  }
}

// What the backward reads beyond the inputs (ExpertsForBackward's tensors).
struct Saved {
  Tensor gu, order, offs, inverse;
  bool gathered;
};

// The forward; where `saved` is given, what the backward reads goes there
// (else the routing is a temporary too).
Tensor experts(const Inputs& in, family::GateUp gate_up, family::Activation activation,
               Saved* saved) {
  const Tensor& x = in.x;
  const int64_t tokens = x.size(0), hidden = x.size(1), k = in.topk_ids.size(1);
  const int64_t experts = in.w13.size(0), inter = in.w13.size(1) / 2, slots = tokens * k;
  const ScalarType dtype = x.scalar_type();
  const bool gather = inter <= family::RaggedGlu::kGatherMaxInter;
  // Its kernels (the routing's, the projections', the combine's) go to the
  // GPU as one graph: one driver call instead of one each.  The conversions,
  // torch's work, come first, so that nothing splits the group.
  LaunchGroup launches;
  const Tensor ids = converted(in.topk_ids, ScalarType::Long);
  const Tensor weights = as_contiguous(converted(in.topk_weights, ScalarType::Float));
  // The products' rows, and the routing unless the backward reads it, are
  // temporaries: one block.
  Outputs results(x);
  Outputs temporaries(x, Outputs::part_bytes({slots, inter}, dtype) +
                             Outputs::part_bytes({slots, hidden}, dtype) +
                             (saved ? 0 : route_bytes(slots, experts)));
  auto [order, offs, inverse] = route_slots(ids, experts, saved ? results : temporaries);
  std::optional<Tensor> gu;
  if (saved) gu = new_output(x, {slots, 2 * inter}, dtype);
  Tensor* saved_gu = gu ? &*gu : nullptr;
  const Tensor h = [&] {
    if (gather) {
      return up_projection(x, order, k, in.w13, offs, in.b13, gate_up, activation, saved_gu,
                           temporaries);
    }
    const Tensor token = aten("aten::floor_divide", "", order, long_scalar(k, order));
    return up_projection(aten("aten::index_select", "", x, int64_t{0}, token), std::nullopt, 1,
                         in.w13, offs, in.b13, gate_up, activation, saved_gu, temporaries);
  }();
  const Tensor ys =
      ragged_m(h, matrix_of_transpose(in.w2), hidden, offs, in.b2, dtype, false, temporaries);
  const Tensor out = combine_slots(ys, inverse, tokens, k, weights, offs);
  launches.submit();
  if (saved) *saved = {*gu, order, offs, inverse, gather};
  return out;
}

// Every check of moe_experts' arguments; its gate_up and activation.
std::pair<family::GateUp, family::Activation> check(const Inputs& in, const std::string& gate_up,
                                                    const std::string& activation) {
  check_dtypes(in);
  check_devices(in);
  check_shapes(in);
  return {parse_choice<family::GateUp>("gate_up", gate_up),
          parse_choice<family::Activation>("activation", activation)};
}

}  // namespace

Tensor moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2,
                   std::optional<Tensor> b13, std::optional<Tensor> b2, std::string gate_up,
                   std::string activation) {
  const Inputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto [gate_up_value, activation_value] = check(in, gate_up, activation);
  return experts(in, gate_up_value, activation_value, nullptr);
}

ExpertsForBackward moe_experts_for_backward(Tensor x, Tensor topk_ids, Tensor topk_weights,
                                            Tensor w13, Tensor w2, std::optional<Tensor> b13,
                                            std::optional<Tensor> b2, std::string gate_up,
                                            std::string activation) {
  const Inputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto [gate_up_value, activation_value] = check(in, gate_up, activation);
  Saved saved;
  const Tensor out = experts(in, gate_up_value, activation_value, &saved);
  return {out, saved.gu, saved.order, saved.offs, saved.inverse, saved.gathered};
}

}  // namespace gg::ops
