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

#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// w13, w2 and the biases have x's dtype, one moe_experts runs on.
void check_dtypes(const MoeInputs& in) {
  check_dtype(in.x, "x", family::RaggedGlu::kDTypes);  // the up projection's
  check_routing_dtypes(in);
  check_like_x(in,
               {{"w13", &in.w13}, {"w2", &in.w2}, {"b13", given(in.b13)}, {"b2", given(in.b2)}});
}

// What the backward reads beyond the inputs (ExpertsForBackward's tensors).
struct Saved {
  Tensor gu, order, offs, inverse;
  bool gathered;
};

// The forward; where `saved` is given, what the backward reads goes there
// (else the routing is a temporary too).
Tensor experts(const MoeInputs& in, family::GateUp gate_up, family::Activation activation,
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
std::pair<family::GateUp, family::Activation> check(const MoeInputs& in, const std::string& gate_up,
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
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto [gate_up_value, activation_value] = check(in, gate_up, activation);
  return experts(in, gate_up_value, activation_value, nullptr);
}

ExpertsForBackward moe_experts_for_backward(Tensor x, Tensor topk_ids, Tensor topk_weights,
                                            Tensor w13, Tensor w2, std::optional<Tensor> b13,
                                            std::optional<Tensor> b2, std::string gate_up,
                                            std::string activation) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto [gate_up_value, activation_value] = check(in, gate_up, activation);
  Saved saved;
  const Tensor out = experts(in, gate_up_value, activation_value, &saved);
  return {out, saved.gu, saved.order, saved.offs, saved.inverse, saved.gathered};
}

}  // namespace gg::ops
