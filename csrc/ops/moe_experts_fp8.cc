// gg_runtime::moe_experts_fp8: moe_experts' forward with float8_e4m3fn
// expert weights and float32 scales, for inference, in one operator: every
// check (messages name moe_experts' arguments), then the routing, the
// tokens quantized and their rows gathered, the up projection (scaled_ragged_m),
// SwiGLU, its output quantized, the down projection and the weighted
// combine.  Activations are quantized as the weights are: per token per 128
// columns for 128 x 128 weight blocks, per token for per-channel weights.
// Meta tensors run the same code without the launches.
#include <family_args.h>

#include <optional>
#include <string>
#include <tuple>

#include "fp8.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// How the weights are scaled, and so how the activations are quantized.
enum class Scales { kBlockwise, kChannelwise };

const char* activation_granularity(Scales scales) {
  return scales == Scales::kBlockwise ? "1x128" : "rowwise";
}

void check_weight(const Tensor& w, const char* name, const char* shape_text) {
  if (w.scalar_type() != kFp8) {
    type_error(name, " must be float8_e4m3fn with its scales given, got ",
               dtype_name(w.scalar_type()));
  }
  // fp8 tensor cores read both operands K-major: each expert's [out, in]
  // rows with unit stride along `in`, 16-byte aligned.
  if (w.stride(2) != 1 || w.stride(1) % kAlign != 0 || w.stride(0) % kAlign != 0) {
    value_error(name, " must be stored ", shape_text, " with unit stride in its last dimension ",
                "and the others multiples of 16 (fp8 products read it K-major), got strides ",
                strides_of(w));
  }
}

// The scale's shape for `weight` [E, N, K]: blocks or channels; a trailing 1
// (compressed-tensors' [E, N, 1]) is accepted for channels.
Scales scales_of(const Tensor& scale, const char* name, const Tensor& weight) {
  const int64_t experts = weight.size(0), n = weight.size(1), k = weight.size(2);
  const Shape shape = sizes_of(scale);
  if (shape == Shape{experts, blocks(n), blocks(k)}) return Scales::kBlockwise;
  if (shape == Shape{experts, n} || shape == Shape{experts, n, 1}) return Scales::kChannelwise;
  value_error(name, " must be [E, ceil(N/128), ceil(K/128)] = ",
              tuple_text({experts, blocks(n), blocks(k)}),
              " (128 x 128 blocks) or [E, N] = ", tuple_text({experts, n}),
              " (per output channel) for its weight ", shape_of(weight), ", got ", shape_of(scale));
}

// Every check of the arguments; how the weights are scaled.
Scales check(const MoeInputs& in, const Tensor& w13_scale, const Tensor& w2_scale) {
  check_dtype(in.x, "x", family::Swiglu::kDTypes);  // its output's, h's
  check_routing_dtypes(in);
  check_like_x(in, {{"b13", given(in.b13)}, {"b2", given(in.b2)}});
  check_devices(in, {{"w13_scale", &w13_scale}, {"w2_scale", &w2_scale}});
  check_shapes(in);
  const int64_t hidden = in.x.size(1), inter = in.w2.size(2);
  if (hidden % kAlign != 0 || inter % kAlign != 0) {
    value_error("fp8 weights need H and I to be multiples of 16 (16-byte rows), got H=", hidden,
                ", I=", inter);
  }
  check_weight(in.w13, "w13", "[E, 2I, H]");
  check_weight(in.w2, "w2", "[E, H, I]");
  for (const auto& [name, scale] : {Named{"w13_scale", &w13_scale}, {"w2_scale", &w2_scale}}) {
    if (scale->scalar_type() != ScalarType::Float) {
      type_error(name, " must be float32, got ", dtype_name(scale->scalar_type()));
    }
  }
  const Scales scales = scales_of(w13_scale, "w13_scale", in.w13);
  if (scales_of(w2_scale, "w2_scale", in.w2) != scales) {
    value_error("w13_scale and w2_scale must both be 128 x 128 blocks or both per channel, got ",
                shape_of(w13_scale), " and ", shape_of(w2_scale));
  }
  return scales;
}

// A per-channel scale as [E, N] (the form scaled_grouped_mm takes).
Tensor channel_form(const Tensor& scale, Scales scales) {
  if (scales == Scales::kBlockwise || scale.dim() == 2) return scale;
  return torch::stable::reshape(scale, {scale.size(0), scale.size(1)});
}

// The products' output and bias dtype: the scaled kernels write bfloat16
// (or float32); float16 tokens get theirs converted at the end.
constexpr ScalarType kRows = ScalarType::BFloat16;

std::optional<Tensor> as_rows_dtype(const std::optional<Tensor>& bias) {
  if (!bias.has_value()) return bias;
  return converted(*bias, kRows);
}

// The ragged-M product of the slots' fp8 rows with the weights w [E, N, K]:
// [S, N] in bfloat16, tensor-core accumulation (the blocks' scales applied
// per 128 columns of K).
Tensor scaled_product(const std::tuple<Tensor, Tensor>& rows, const Tensor& w,
                      const Tensor& w_scale, const Tensor& offs,
                      const std::optional<Tensor>& bias) {
  const auto& [q, q_scale] = rows;
  return scaled_grouped_mm(q, torch::stable::transpose(w, 1, 2), q_scale, w_scale, offs, bias,
                           std::nullopt, kRows, /*use_fast_accum=*/true);
}

}  // namespace

Tensor moe_experts_fp8(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2,
                       Tensor w13_scale, Tensor w2_scale, std::optional<Tensor> b13,
                       std::optional<Tensor> b2, std::string gate_up, std::string activation) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const Scales scales = check(in, w13_scale, w2_scale);
  // Parsed here so that a bad value is refused before anything launches.
  parse_choice<family::GateUp>("gate_up", gate_up);
  parse_choice<family::Activation>("activation", activation);
  const int64_t tokens = x.size(0), k = topk_ids.size(1), experts = w13.size(0);
  const char* granularity = activation_granularity(scales);
  LaunchGroup launches;
  const Tensor ids = converted(topk_ids, ScalarType::Long);
  const Tensor weights = as_contiguous(converted(topk_weights, ScalarType::Float));
  Outputs temporaries(x);
  const auto [order, offs, inverse] = route_slots(ids, experts, temporaries);
  // Each token quantized once, then its fp8 row and scales gathered for each
  // of its slots, in the routing's order.
  const auto [xq, x_scale] = quantize_fp8(x, granularity);
  const Tensor token = aten("aten::floor_divide", "", order, long_scalar(k, order));
  const std::tuple<Tensor, Tensor> slots{
      aten("aten::index_select", "", xq, int64_t{0}, token),
      aten("aten::index_select", "", x_scale, int64_t{0}, token)};
  const Tensor gu =
      scaled_product(slots, w13, channel_form(w13_scale, scales), offs, as_rows_dtype(b13));
  const Tensor h = swiglu(gu, gate_up, activation);
  const Tensor ys = scaled_product(quantize_fp8(h, granularity), w2, channel_form(w2_scale, scales),
                                   offs, as_rows_dtype(b2));
  const Tensor out = combine_slots(ys, inverse, tokens, k, weights, offs);
  launches.submit();
  return converted(out, x.scalar_type());
}

}  // namespace gg::ops
