// moe_experts' products with 16-bit weights in x's dtype: the up projection
// with its activation in the epilogue (ragged_glu: the tokens read through
// the routing's order where the experts are at most family::RaggedGlu::
// kGatherMaxInter wide, else from a permuted copy of x), then the down
// projection (ragged_m).
#include <family_args.h>

#include <memory>
#include <optional>

#include "expert_products.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

class UnquantizedProducts final : public ExpertProducts {
 public:
  UnquantizedProducts(const MoeInputs& in, Choices choices)
      : ExpertProducts(in),
        choices_(choices),
        gathers_(in.w13.size(1) / 2 <= family::RaggedGlu::kGatherMaxInter) {}

  Tensor rows(const RoutedSlots& routed, Tensor* gu, Outputs& temporaries) const override {
    const Tensor& x = in_.x;
    const auto up = [&](const Tensor& tokens, const std::optional<Tensor>& order, int64_t k) {
      return up_projection(tokens, order, k, in_.w13, routed.offs, in_.b13, choices_.gate_up,
                           choices_.activation, gu, temporaries);
    };
    const Tensor h = [&] {
      if (gathers_) return up(x, routed.order, routed.k);
      const Tensor token =
          aten("aten::floor_divide", "", routed.order, long_scalar(routed.k, routed.order));
      return up(aten("aten::index_select", "", x, int64_t{0}, token), std::nullopt, 1);
    }();
    return ragged_m(h, matrix_of_transpose(in_.w2), x.size(1), routed.offs, in_.b2, x.scalar_type(),
                    false, temporaries);
  }

  bool gathers() const override { return gathers_; }

 private:
  Choices choices_;
  bool gathers_;
};

}  // namespace

std::unique_ptr<ExpertProducts> unquantized_products(const MoeInputs& in, const Scales& scales,
                                                     Choices choices) {
  check_dtype(in.x, "x", family::RaggedGlu::kDTypes);  // the up projection's
  check_routing_dtypes(in);
  // w13, w2 and the biases have x's dtype, one moe_experts runs on.
  check_like_x(in,
               {{"w13", &in.w13}, {"w2", &in.w2}, {"b13", given(in.b13)}, {"b2", given(in.b2)}});
  check_no_scales(scales, true, "with unquantized weights (weight_format 'unquantized')");
  check_devices(in);
  check_shapes(in);
  return std::make_unique<UnquantizedProducts>(in, choices);
}

}  // namespace gg::ops
