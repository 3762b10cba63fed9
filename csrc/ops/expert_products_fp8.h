// What fp8 moe_experts' products (expert_products_fp8.cc) and its decode path
// (expert_products_fp8_decode.cc) share.
#pragma once

#include <family_args.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "expert_products.h"
#include "fp8.h"
#include "moe_inputs.h"
#include "op_support.h"

namespace gg::ops {

// How the weights are scaled, and so how the activations are quantized:
// the kernels' Scaling (blockwise: 128 x 128 weight blocks, rowwise: a scale
// per output channel).
using family::Scaling;

// The products' output and bias dtype: the scaled kernels write bfloat16
// (or float32); float16 tokens get theirs converted at the end.
inline constexpr ScalarType kRows = ScalarType::BFloat16;

// The output's dtype: x's, or bfloat16 where x comes quantized.
inline ScalarType fp8_out_dtype(const Tensor& x) {
  return x.scalar_type() == kFp8 ? kRows : x.scalar_type();
}

// What the down projection reads beyond the up projection's.
struct DownProjection {
  const Tensor& w2;
  const Tensor& w2_scale;
  const std::optional<Tensor>& b2;  // bfloat16
};

// The tokens quantized as the weights' scales ask, x_scale beside them: as
// given (x fp8, contiguous scales), else quantize_fp8's.
using Quantized = std::tuple<Tensor, Tensor>;
Quantized quantized_tokens(const Tensor& x, const std::optional<Tensor>& x_scale, Scaling scales);

// Bytes of the routed products' temporaries (h and its scales) for `slots`
// slots and I = inter.
int64_t fp8_rows_temporary_bytes(int64_t slots, int64_t inter);

// Whether the forward takes the decode path (expert_products_fp8_decode.cc).
bool decode_fits(int64_t slots, int64_t experts, bool blockwise_tokens_given);

// The decode path's output [T, H], bfloat16 (into `into` where given and of
// that dtype), from ids (int64, contiguous) and weights (float32).
Tensor decode_forward(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& ids,
                      const Tensor& weights_in, const DownProjection& weights,
                      const Tensor& w13_scale, const std::optional<Tensor>& b13, Scaling scales,
                      Choices choices, Outputs& outputs, const Tensor* into);

}  // namespace gg::ops
