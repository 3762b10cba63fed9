// gg_runtime::moe_experts: the forward of gg_runtime.moe_experts in one
// operator for every weight format, so that its host work is one call: the
// format's checks (messages name moe_experts' arguments), the routing, the
// format's products (expert_products.h) and the weighted combine, whose
// kernels are launched together (LaunchGroup).  Meta tensors run the same
// code without the launches.
#include <family_args.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "expert_products.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {

WeightFormat parse_weight_format(const std::string& text) {
  if (text == "unquantized") return WeightFormat::kUnquantized;
  if (text == "128x128") return WeightFormat::kFp8SquareBlocks;
  if (text == "rowwise") return WeightFormat::kFp8Rowwise;
  if (text == "mxfp4") return WeightFormat::kMxfp4;
  if (text == "int4") return WeightFormat::kInt4;
  value_error("weight_format must be 'unquantized', '128x128', 'rowwise', 'mxfp4' or ",
              "'int4', got '", text, "'");
}

int64_t ExpertProducts::temporary_bytes(int64_t slots) const {
  const ScalarType dtype = in_.x.scalar_type();
  return Outputs::part_bytes({slots, in_.w13.size(1) / 2}, dtype) +
         Outputs::part_bytes({slots, in_.x.size(1)}, dtype);
}

bool ExpertProducts::takes_decode(int64_t /*slots*/) const { return false; }

Tensor ExpertProducts::decode(const Tensor& /*ids*/, const Tensor& /*weights*/,
                              Outputs& /*temporaries*/, const Tensor* /*into*/) const {
  throw std::logic_error("decode() of a format without a decode path");
}

ScalarType ExpertProducts::out_dtype() const { return in_.x.scalar_type(); }

ScalarType ExpertProducts::gu_dtype() const { return in_.x.scalar_type(); }

void check_no_scales(const Scales& scales, bool weights, const char* why) {
  const std::initializer_list<Named> named{{"w13.scales", weights ? given(scales.w13) : nullptr},
                                           {"w2.scales", weights ? given(scales.w2) : nullptr},
                                           {"x.scales", given(scales.x)}};
  for (const auto& [name, scale] : named) {
    if (scale != nullptr) value_error(name, " must be None ", why);
  }
}

namespace {

// What the backward reads beyond the inputs (ExpertsForBackward's tensors).
struct Saved {
  Tensor gu, order, offs, inverse;
  bool gathered;
};

// The format's products, every argument checked (gate_up and activation
// parsed here, once, for every format).
std::unique_ptr<ExpertProducts> products_of(const MoeInputs& in, const Scales& scales,
                                            WeightFormat format, const std::string& gate_up,
                                            const std::string& activation) {
  const Choices choices{parse_choice<family::GateUp>("gate_up", gate_up),
                        parse_choice<family::Activation>("activation", activation)};
  switch (format) {
    case WeightFormat::kUnquantized:
      return unquantized_products(in, scales, choices);
    case WeightFormat::kFp8SquareBlocks:
    case WeightFormat::kFp8Rowwise:
      return fp8_products(in, scales, format, choices);
    case WeightFormat::kMxfp4:
    case WeightFormat::kInt4:
      return w4_products(in, scales, format, choices);
  }
  throw std::logic_error("a weight format without products");
}

// The forward; where `saved` is given, what the backward reads goes there
// (else the routing is a temporary too); the output written into `into`
// where given (checked: [T, H] of out_dtype(), contiguous).
Tensor forward(const MoeInputs& in, const ExpertProducts& products, Saved* saved,
               const Tensor* into = nullptr) {
  const Tensor& x = in.x;
  const int64_t tokens = x.size(0), k = in.topk_ids.size(1), experts = in.w13.size(0);
  const int64_t slots = tokens * k;
  // The conversions, torch's work, before the launches, so that nothing
  // splits the group.
  const Tensor ids = converted(in.topk_ids, ScalarType::Long);
  const Tensor weights = as_contiguous(converted(in.topk_weights, ScalarType::Float));
  // The kernels (the routing's, the products', the combine's) go to the GPU
  // as one graph: one driver call instead of one each.
  LaunchGroup launches;
  Tensor out;
  if (!saved && products.takes_decode(slots)) {
    Outputs temporaries(x);
    out = products.decode(ids, weights, temporaries, into);
  } else {
    // The products' rows, and the routing unless the backward reads it, are
    // temporaries: one block.
    Outputs results(x);
    Outputs temporaries(
        x, products.temporary_bytes(slots) + (saved ? 0 : route_bytes(slots, experts)));
    auto [order, offs, inverse] = route_slots(ids, experts, saved ? results : temporaries);
    std::optional<Tensor> gu;
    if (saved) gu = new_output(x, {slots, in.w13.size(1)}, products.gu_dtype());
    const Tensor ys = products.rows({order, offs, k}, gu ? &*gu : nullptr, temporaries);
    out = combine_slots(ys, inverse, tokens, k, weights, offs, into);
    if (saved) *saved = {*gu, order, offs, inverse, products.gathers()};
  }
  launches.submit();
  out = converted(out, products.out_dtype());
  if (into == nullptr || shapes_only(out) || out.data_ptr() == into->data_ptr()) return out;
  return copied_into(*into, out);  // the kernels' dtype was not into's
}

// out: [T, H] of the forward's output dtype, contiguous, on x's device, not
// overlapping x.
void check_into(const Tensor& out, const MoeInputs& in, const ExpertProducts& products) {
  const ScalarType dtype = products.out_dtype();
  check_companion(out, "out", {in.x.size(0), in.x.size(1)}, dtype, in.x, dtype_name(dtype),
                  "(the output: [T, H])");
  if (out.numel() > 1 && (out.stride(1) != 1 || out.stride(0) != out.size(1)))
    value_error("out must be contiguous");
  const auto first = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); };
  const auto last = [&](const Tensor& t) { return first(t) + t.numel() * t.element_size(); };
  if (!shapes_only(out) && out.numel() > 0 && in.x.numel() > 0 && first(out) < last(in.x) &&
      first(in.x) < last(out))
    value_error("out must not overlap x");
}

}  // namespace

Tensor moe_experts(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2,
                   std::optional<Tensor> b13, std::optional<Tensor> b2, std::string gate_up,
                   std::string activation, std::string weight_format,
                   std::optional<Tensor> w13_scale, std::optional<Tensor> w2_scale,
                   std::optional<Tensor> x_scale) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto products = products_of(in, {w13_scale, w2_scale, x_scale},
                                    parse_weight_format(weight_format), gate_up, activation);
  return forward(in, *products, nullptr);
}

void moe_experts_into(Tensor out, Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13,
                      Tensor w2, std::optional<Tensor> b13, std::optional<Tensor> b2,
                      std::string gate_up, std::string activation, std::string weight_format,
                      std::optional<Tensor> w13_scale, std::optional<Tensor> w2_scale,
                      std::optional<Tensor> x_scale) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const auto products = products_of(in, {w13_scale, w2_scale, x_scale},
                                    parse_weight_format(weight_format), gate_up, activation);
  check_into(out, in, *products);
  forward(in, *products, nullptr, &out);
}

ExpertsForBackward moe_experts_for_backward(Tensor x, Tensor topk_ids, Tensor topk_weights,
                                            Tensor w13, Tensor w2, std::optional<Tensor> b13,
                                            std::optional<Tensor> b2, std::string gate_up,
                                            std::string activation, std::string weight_format,
                                            std::optional<Tensor> w13_scale,
                                            std::optional<Tensor> w2_scale) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const WeightFormat format = parse_weight_format(weight_format);
  if (format == WeightFormat::kMxfp4 || format == WeightFormat::kInt4) {
    value_error("4-bit weights are for inference only: moe_experts_for_backward takes ",
                "unquantized or fp8 weights, got weight_format '", weight_format, "'");
  }
  const std::optional<Tensor> no_x_scale;
  const auto products =
      products_of(in, {w13_scale, w2_scale, no_x_scale}, format, gate_up, activation);
  Saved saved;
  const Tensor out = forward(in, *products, &saved);
  return {out, saved.gu, saved.order, saved.offs, saved.inverse, saved.gathered};
}

}  // namespace gg::ops
