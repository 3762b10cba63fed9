// moe_experts' products with float8_e4m3fn expert weights and float32
// scales (per 128 x 128 block, or per output channel): the tokens quantized
// as the weights are (per token per 128 columns for blocks, per token for
// channels; or given so quantized, x_scale beside them, as expert
// parallelism's fp8 dispatch delivers them), the up projection on their rows
// gathered through the routing with the activation and h's quantization
// (per token per 128 columns) in its epilogue (scaled_ragged_glu), then the
// down projection (scaled_ragged_m); gu, for fp8 training's backward, in
// bfloat16.  A call of few slots (serving's decode) runs the routing, the
// tokens' quantization per 128 columns and both projections in one kernel
// instead, or in two where its units are few (expert_products_fp8_decode.cc).
#include <family_args.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "expert_products.h"
#include "expert_products_fp8.h"
#include "fp8.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

const char* activation_granularity(Scaling scaling) {
  return scaling == Scaling::kBlockwise ? "1x128" : "rowwise";
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

// The scale's shape for `weight` [E, N, K] in the weights' format: 128 x 128
// blocks, or per channel (a trailing 1, compressed-tensors' [E, N, 1], too).
void check_scale(const Tensor& scale, const char* name, const Tensor& weight, Scaling scales) {
  const int64_t experts = weight.size(0), n = weight.size(1), k = weight.size(2);
  const Shape shape = sizes_of(scale);
  if (scales == Scaling::kBlockwise && shape != Shape{experts, blocks(n), blocks(k)}) {
    value_error(name, " must be [E, ceil(N/128), ceil(K/128)] = ",
                tuple_text({experts, blocks(n), blocks(k)}), " for its weight ", shape_of(weight),
                " in 128 x 128 blocks (w13.scales and w2.scales must both be 128 x 128 blocks or ",
                "both per channel), got ", shape_of(scale));
  }
  if (scales == Scaling::kRowwise && shape != Shape{experts, n} && shape != Shape{experts, n, 1}) {
    value_error(name, " must be [E, N] = ", tuple_text({experts, n}), " for its weight ",
                shape_of(weight), " per output channel (or [E, N, 1]; w13.scales and w2.scales ",
                "must both be 128 x 128 blocks or both per channel), got ", shape_of(scale));
  }
}

// Biases in the output's dtype or float32 (fp8 training's float32 master
// weights'): the kernels add them in bfloat16, each converted once
// (as_rows_dtype).
void check_bias_dtypes(const MoeInputs& in) {
  const ScalarType out = fp8_out_dtype(in.x);
  for (const auto& [name, bias] : {Named{"b13", given(in.b13)}, {"b2", given(in.b2)}}) {
    if (bias != nullptr && bias->scalar_type() != out && bias->scalar_type() != ScalarType::Float) {
      type_error(name, " must have the output's dtype (", dtype_name(out), ") or be float32, got ",
                 dtype_name(bias->scalar_type()));
    }
  }
}

// x is 16-bit without x_scale, fp8 with it.
void check_token_dtypes(const Tensor& x, const std::optional<Tensor>& x_scale) {
  if (!x_scale) {
    if (x.scalar_type() == kFp8) {
      type_error("x is float8_e4m3fn: give its scales as x.scales (or x in 16 bits)");
    }
    check_dtype(x, "x", family::Swiglu::kDTypes);  // its output's, h's
    return;
  }
  if (x.scalar_type() != kFp8) {
    type_error("x must be float8_e4m3fn when x.scales is given, got ", dtype_name(x.scalar_type()));
  }
  if (x_scale->scalar_type() != ScalarType::Float) {
    type_error("x.scales must be float32, got ", dtype_name(x_scale->scalar_type()));
  }
}

// x_scale's shape for the tokens x [T, H], quantized as the weights' scales
// ask: per token per 128 columns, or per token.
void check_token_scales(const Tensor& x, const Tensor& x_scale, Scaling scales) {
  const int64_t tokens = x.size(0), hidden = x.size(1);
  const Shape shape = sizes_of(x_scale);
  if (scales == Scaling::kBlockwise) {
    if (shape != Shape{tokens, blocks(hidden)}) {
      value_error("x.scales must be [T, ceil(H/128)] = ", tuple_text({tokens, blocks(hidden)}),
                  " (a scale per token per 128 columns, as 128 x 128 weight blocks ask), got ",
                  shape_of(x_scale));
    }
  } else if (shape != Shape{tokens} && shape != Shape{tokens, 1}) {
    value_error("x.scales must be [T] = ", tuple_text({tokens}),
                " (a scale per token, as per-channel weights ask), got ", shape_of(x_scale));
  }
}

// Every check of the arguments, the weights scaled as `scales` says.
void check(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& w13_scale,
           const Tensor& w2_scale, Scaling scales) {
  check_token_dtypes(in.x, x_scale);
  check_routing_dtypes(in);
  check_bias_dtypes(in);
  check_devices(
      in, {{"w13.scales", &w13_scale}, {"w2.scales", &w2_scale}, {"x.scales", given(x_scale)}});
  check_shapes(in);
  const int64_t hidden = in.x.size(1), inter = in.w2.size(2);
  if (hidden % kAlign != 0 || inter % kAlign != 0) {
    value_error("fp8 weights need H and I to be multiples of 16 (16-byte rows), got H=", hidden,
                ", I=", inter);
  }
  check_weight(in.w13, "w13", "[E, 2I, H]");
  check_weight(in.w2, "w2", "[E, H, I]");
  for (const auto& [name, scale] : {Named{"w13.scales", &w13_scale}, {"w2.scales", &w2_scale}}) {
    if (scale->scalar_type() != ScalarType::Float) {
      type_error(name, " must be float32, got ", dtype_name(scale->scalar_type()));
    }
  }
  check_scale(w13_scale, "w13.scales", in.w13, scales);
  check_scale(w2_scale, "w2.scales", in.w2, scales);
  if (x_scale) check_token_scales(in.x, *x_scale, scales);
}

// A scale as the kernels read it: contiguous, a per-channel one as [E, N].
Tensor kernel_form(const Tensor& scale, Scaling scales) {
  if (scales == Scaling::kBlockwise || scale.dim() == 2) return as_contiguous(scale);
  return as_contiguous(torch::stable::reshape(scale, {scale.size(0), scale.size(1)}));
}

std::optional<Tensor> as_rows_dtype(const std::optional<Tensor>& bias) {
  if (!bias.has_value()) return bias;
  return as_contiguous(converted(*bias, kRows));
}

// What the up projection reads: the quantized tokens, the routing (slot r is
// token order[r] / k's, in group order, groups ending at offs), the weights.
struct UpProjection {
  const std::tuple<Tensor, Tensor>& tokens;  // (q [T, H], its scales)
  const Tensor& order;
  int64_t k;
  const Tensor& offs;
  const Tensor& w13;
  const Tensor& w13_scale;
  const std::optional<Tensor>& b13;  // bfloat16
};

// (h [S, I] float8_e4m3fn, its scales [S, ceil(I/128)]): each slot's token
// row times w13 (+ b13), activated, quantized per 128 columns, in one
// scaled_ragged_glu launch; the product plus bias written to gu [S, 2I]
// (bfloat16) too where gu is given.
std::tuple<Tensor, Tensor> up_projection(const UpProjection& p, Scaling scales,
                                         family::GateUp gate_up, family::Activation activation,
                                         Tensor* gu, Outputs& outputs) {
  const auto& [xq, x_scale] = p.tokens;
  const int64_t slots = p.order.size(0), n = p.w13.size(1), inter = n / 2;
  Tensor h = outputs.make({slots, inter}, kFp8);
  Tensor h_scale = outputs.make({slots, blocks(inter)}, ScalarType::Float);
  // No experts (every slot dropped): nothing to launch, and nothing reads h
  // (the down projection of no groups is zeros); the kernels would read a
  // group's scales.
  if (p.w13.size(0) == 0) return {h, h_scale};
  if (shapes_only(h)) return {h, h_scale};
  const family::ScaledRaggedGlu args{.a_ptr = address(xq),
                                     .b_ptr = address(p.w13),
                                     .c_ptr = address(h),
                                     .offs_ptr = address(p.offs),
                                     .scale_a_ptr = address(x_scale),
                                     .scale_b_ptr = address(p.w13_scale),
                                     .c_scale_ptr = address(h_scale),
                                     .T = slots,
                                     .N = n,
                                     .K = xq.size(1),
                                     .G = p.w13.size(0),
                                     .lda = xq.stride(0),
                                     .b_group_stride = p.w13.stride(0),
                                     .ldb = p.w13.stride(1),
                                     .ldc = inter,
                                     .bias_ptr = p.b13 ? address(*p.b13) : 0,
                                     .has_bias = p.b13 ? 1 : 0,
                                     .activation = family::choice_code(activation),
                                     .gu_ptr = gu ? address(*gu) : 0,
                                     .rows_ptr = address(p.order),
                                     .rows_div = p.k};
  const family::ScaledRaggedGlu::Axes axes{.scaling = scales == Scaling::kBlockwise
                                                          ? family::Scaling::kBlockwise
                                                          : family::Scaling::kRowwise,
                                           .gate_up = gate_up,
                                           .gu = gu ? family::Gu::kKept : family::Gu::kDropped};
  sm90_only([&] { launch(args, axes, target_of(xq, kFp8)); });
  return {h, h_scale};
}

// What the decode path and the routed products read: the arguments as the
// kernels read them.
class Fp8Products final : public ExpertProducts {
 public:
  Fp8Products(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& w13_scale,
              const Tensor& w2_scale, Scaling scales, Choices choices)
      : ExpertProducts(in),
        x_scale_(x_scale),
        scales_(scales),
        choices_(choices),
        b13_(as_rows_dtype(in.b13)),
        b2_(as_rows_dtype(in.b2)),
        w13_scale_(kernel_form(w13_scale, scales)),
        w2_scale_(kernel_form(w2_scale, scales)) {}

  Tensor rows(const RoutedSlots& routed, Tensor* gu, Outputs& temporaries) const override {
    // Each token quantized once; the up projection reads each slot's row.
    const Quantized quantized = quantized_tokens(in_.x, x_scale_, scales_);
    const UpProjection up{quantized, routed.order, routed.k, routed.offs,
                          in_.w13,   w13_scale_,   b13_};
    const auto [h, h_scale] =
        up_projection(up, scales_, choices_.gate_up, choices_.activation, gu, temporaries);
    return scaled_grouped_mm(h, torch::stable::transpose(in_.w2, 1, 2), h_scale, w2_scale_,
                             routed.offs, b2_, std::nullopt, kRows, /*use_fast_accum=*/true);
  }

  int64_t temporary_bytes(int64_t slots) const override {
    return fp8_rows_temporary_bytes(slots, in_.w2.size(2));
  }

  bool gathers() const override { return true; }

  bool takes_decode(int64_t slots) const override {
    return decode_fits(slots, in_.w13.size(0), x_scale_ && scales_ == Scaling::kBlockwise);
  }

  Tensor decode(const Tensor& ids, const Tensor& weights, Outputs& temporaries,
                const Tensor* into) const override {
    return decode_forward(in_, x_scale_, packed_aligned(ids), weights, {in_.w2, w2_scale_, b2_},
                          w13_scale_, b13_, scales_, choices_, temporaries, into);
  }

  ScalarType out_dtype() const override { return fp8_out_dtype(in_.x); }
  ScalarType gu_dtype() const override { return kRows; }

 private:
  const std::optional<Tensor>& x_scale_;
  Scaling scales_;
  Choices choices_;
  std::optional<Tensor> b13_, b2_;  // bfloat16
  Tensor w13_scale_, w2_scale_;
};

}  // namespace

int64_t fp8_rows_temporary_bytes(int64_t slots, int64_t inter) {
  return Outputs::part_bytes({slots, inter}, kFp8) +
         Outputs::part_bytes({slots, blocks(inter)}, ScalarType::Float);
}

// The tokens quantized as the weights' scales ask, x_scale beside them: as
// given (x fp8, contiguous scales), else quantize_fp8's.
Quantized quantized_tokens(const Tensor& x, const std::optional<Tensor>& x_scale, Scaling scales) {
  if (x_scale && shapes_only(x)) return {x, *x_scale};
  if (x_scale) return {packed_aligned(x), as_contiguous(*x_scale)};
  return quantize_fp8(x, activation_granularity(scales));
}

std::unique_ptr<ExpertProducts> fp8_products(const MoeInputs& in, const Scales& scales,
                                             WeightFormat format, Choices choices) {
  const Scaling scaling =
      format == WeightFormat::kFp8SquareBlocks ? Scaling::kBlockwise : Scaling::kRowwise;
  for (const auto& [name, scale] :
       {Named{"w13.scales", given(scales.w13)}, Named{"w2.scales", given(scales.w2)}}) {
    if (scale == nullptr) {
      type_error(name, " must be a tensor with fp8 weights (weight_format '128x128' or ",
                 "'rowwise'), got None");
    }
  }
  check(in, scales.x, *scales.w13, *scales.w2, scaling);
  return std::make_unique<Fp8Products>(in, scales.x, *scales.w13, *scales.w2, scaling, choices);
}

}  // namespace gg::ops
