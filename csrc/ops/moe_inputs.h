// The arguments of the moe_experts operators, and the checks every weight
// format's products share (expert_products.h), so that all name
// moe_experts' arguments alike.
#pragma once

#include <initializer_list>
#include <optional>
#include <utility>

#include "op_support.h"

namespace gg::ops {

struct MoeInputs {
  const Tensor& x;
  const Tensor& topk_ids;
  const Tensor& topk_weights;
  const Tensor& w13;
  const Tensor& w2;
  const std::optional<Tensor>& b13;
  const std::optional<Tensor>& b2;
};

// An argument by name; nullptr for an optional one not given.
using Named = std::pair<const char*, const Tensor*>;
inline const Tensor* given(const std::optional<Tensor>& t) { return t ? &*t : nullptr; }

// topk_ids int32 or int64, topk_weights of a floating-point dtype.
void check_routing_dtypes(const MoeInputs& in);
// Each tensor given has x's dtype.
void check_like_x(const MoeInputs& in, std::initializer_list<Named> tensors);
// Every tensor (the inputs' and `more`) on x's device, x on a CUDA one.
void check_devices(const MoeInputs& in, std::initializer_list<Named> more = {});
// x [T, H], topk_ids and topk_weights [T, k] (k >= 1), w13 [E, 2I, H],
// w2 [E, H, I], b13 [E, 2I], b2 [E, H]; the weights' last dimensions hold
// values_per_element values an element (2: 4-bit values packed two a byte,
// w13 [E, 2I, H/2] and w2 [E, H, I/2]).
void check_shapes(const MoeInputs& in, int64_t values_per_element = 1);

}  // namespace gg::ops
