// gg_runtime::moe_experts_w4: moe_experts' forward with 4-bit expert weights
// (two values a byte along K) in one of two formats, MXFP4 (e2m1 values, an
// e8m0 scale a group of 32) or symmetric INT4 (offset-8 integers, a
// bfloat16 scale a group of 32 or 128), for inference, in one operator:
// every check (messages name moe_experts' arguments), then the routing, the
// up projection on the tokens' rows gathered through the routing with the
// activation in its epilogue (w4_glu), the down projection (w4_ragged_m)
// and the weighted combine.  The weights are widened to the tokens' 16 bits
// in the kernels' K loops (W4A16).  Meta tensors run the same code without
// the launches.
#include <family_args.h>

#include <optional>
#include <string>

#include "fp8.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// The weights' format by name (gg_runtime.formats' MXFP4 and INT4).
enum class Format { kMxfp4, kInt4 };

Format parse_weight_format(const std::string& text) {
  if (text == "mxfp4") return Format::kMxfp4;
  if (text == "int4") return Format::kInt4;
  value_error("weight_format must be 'mxfp4' or 'int4', got '", text, "'");
}

// Values along K a scale covers: MXFP4's 32; INT4's 32 or 128, from the
// scale's last dimension (whole groups: K / group scales).
int64_t scale_group(Format format, const Tensor& scale, const Tensor& weight) {
  if (format == Format::kMxfp4 || scale.dim() != 3 || scale.size(2) == 0) return 32;
  const int64_t k = 2 * weight.size(2);
  return k == 128 * scale.size(2) ? 128 : 32;
}

// The packed values and MXFP4's scales come as bytes: torch's
// float4_e2m1fn_x2 and float8_e8m0fnu are viewed so by moe_experts (the
// stable ABI cannot name them), whose messages name them too.
// The kernels read each expert's rows in 16-byte vectors from 16-byte
// aligned rows (H and I multiples of 32 make the rows' lengths so).
void check_weight(const Tensor& w, const char* name, const char* shape_text) {
  if (w.scalar_type() != ScalarType::Byte) {
    type_error(name, " must be float4_e2m1fn_x2 or uint8 (two 4-bit values a byte) with 4-bit ",
               "weights, got ", dtype_name(w.scalar_type()));
  }
  if (w.stride(2) != 1 || w.stride(1) % kAlign != 0 || w.stride(0) % kAlign != 0 ||
      (!shapes_only(w) && address(w) % kAlign != 0)) {
    value_error(name, " must be stored ", shape_text, " with unit stride in its last dimension, ",
                "16-byte aligned, its other strides multiples of 16, got strides ", strides_of(w));
  }
}

// scale [E, N, K / group] for weight [E, N, K / 2] (bytes): MXFP4's e8m0
// bytes a group of 32, INT4's bfloat16 a group of 32 or 128.
void check_scale(const Tensor& scale, const char* name, const Tensor& weight, Format format) {
  if (format == Format::kMxfp4 && scale.scalar_type() != ScalarType::Byte) {
    type_error(name, " must be float8_e8m0fnu or uint8 (e8m0 exponents) with MXFP4 weights, got ",
               dtype_name(scale.scalar_type()));
  }
  if (format == Format::kInt4 && scale.scalar_type() != ScalarType::BFloat16) {
    type_error(name, " must be bfloat16 with INT4 weights, got ", dtype_name(scale.scalar_type()));
  }
  const int64_t k = 2 * weight.size(2), group = scale_group(format, scale, weight);
  const Shape shape{weight.size(0), weight.size(1), k / group};
  if (sizes_of(scale) != shape) {
    value_error(
        name, " must be [E, N, K/", group, "] = ", tuple_text(shape), " (a scale for each ", group,
        " values along K", format == Format::kInt4 ? "; INT4 takes groups of 32 or 128" : "",
        ") for its weight ", shape_of(weight), " ([E, N, K/2] bytes), got ", shape_of(scale));
  }
}

// Every check; the scales' group.
int64_t check(const MoeInputs& in, const Tensor& w13_scale, const Tensor& w2_scale, Format format) {
  check_dtype(in.x, "x", family::W4Glu::kDTypes);
  check_routing_dtypes(in);
  check_like_x(in, {{"b13", given(in.b13)}, {"b2", given(in.b2)}});
  check_devices(in, {{"w13_scale", &w13_scale}, {"w2_scale", &w2_scale}});
  check_shapes(in, /*values_per_element=*/2);
  const int64_t group = scale_group(format, w13_scale, in.w13);
  const int64_t hidden = in.x.size(1), inter = in.w13.size(1) / 2;
  if (hidden % group != 0 || inter % group != 0) {
    value_error("4-bit weights need H and I to be multiples of their scale group (", group,
                ": whole groups), got H=", hidden, ", I=", inter);
  }
  check_weight(in.w13, "w13", "[E, 2I, H/2]");
  check_weight(in.w2, "w2", "[E, H, I/2]");
  check_scale(w13_scale, "w13_scale", in.w13, format);
  check_scale(w2_scale, "w2_scale", in.w2, format);
  if (scale_group(format, w2_scale, in.w2) != group) {
    value_error("w13_scale and w2_scale must have the same group (", group, " values), got ",
                shape_of(w13_scale), " and ", shape_of(w2_scale));
  }
  return group;
}

// The kernels' format for the weights' format and scale group.
family::W4Format kernel_format(Format format, int64_t group) {
  if (format == Format::kMxfp4) return family::W4Format::kMxfp4;
  return group == 128 ? family::W4Format::kInt4G128 : family::W4Format::kInt4G32;
}

// What both projections read of an expert's weights: its packed values and
// their scales.
struct Weights {
  const Tensor& values;
  const Tensor& scales;  // contiguous
  family::W4Format format;
};

// h [S, I]: each slot's token row (token order[r] / k) times w13 (+ b13),
// activated, in one w4_glu launch.
Tensor up_projection(const Tensor& x, const Tensor& order, int64_t k, const Tensor& offs,
                     const Weights& w13, const std::optional<Tensor>& b13, family::GateUp gate_up,
                     family::Activation activation, Outputs& outputs) {
  const int64_t slots = order.size(0), n = w13.values.size(1);
  Tensor h = outputs.make({slots, n / 2}, x.scalar_type());
  // No experts: every slot is dropped and nothing reads h (the kernels would
  // read a group's weights).
  if (w13.values.size(0) == 0 || shapes_only(h)) return h;
  const family::W4Glu args{.a_ptr = address(x),
                           .b_ptr = address(w13.values),
                           .c_ptr = address(h),
                           .offs_ptr = address(offs),
                           .b_scale_ptr = address(w13.scales),
                           .T = slots,
                           .N = n,
                           .K = x.size(1),
                           .G = w13.values.size(0),
                           .lda = x.stride(0),
                           .b_group_stride = w13.values.stride(0),
                           .ldb = w13.values.stride(1),
                           .b_scale_group_stride = w13.scales.stride(0),
                           .lds = w13.scales.stride(1),
                           .ldc = n / 2,
                           .bias_ptr = b13 ? address(*b13) : 0,
                           .has_bias = b13 ? 1 : 0,
                           .gpt_oss = activation == family::Activation::kGptOss ? 1 : 0,
                           .rows_ptr = address(order),
                           .rows_div = k};
  launch(args, {.format = w13.format, .gate_up = gate_up}, target_of(x, x.scalar_type()));
  return h;
}

// The down projection's rows [S, H] in the routing's order: h's rows of
// each group times w2 (+ b2), one w4_ragged_m launch.
Tensor down_projection(const Tensor& h, const Tensor& offs, const Weights& w2,
                       const std::optional<Tensor>& b2, Outputs& outputs) {
  const int64_t slots = h.size(0), hidden = w2.values.size(1);
  Tensor ys = outputs.make({slots, hidden}, h.scalar_type());
  if (w2.values.size(0) == 0 || shapes_only(ys)) return ys;
  const family::W4RaggedM args{.a_ptr = address(h),
                               .b_ptr = address(w2.values),
                               .c_ptr = address(ys),
                               .offs_ptr = address(offs),
                               .b_scale_ptr = address(w2.scales),
                               .T = slots,
                               .N = hidden,
                               .K = h.size(1),
                               .G = w2.values.size(0),
                               .lda = h.stride(0),
                               .b_group_stride = w2.values.stride(0),
                               .ldb = w2.values.stride(1),
                               .b_scale_group_stride = w2.scales.stride(0),
                               .lds = w2.scales.stride(1),
                               .ldc = hidden,
                               .bias_ptr = b2 ? address(*b2) : 0,
                               .has_bias = b2 ? 1 : 0};
  launch(args, {.format = w2.format}, target_of(h, h.scalar_type()));
  return ys;
}

}  // namespace

Tensor moe_experts_w4(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2,
                      Tensor w13_scale, Tensor w2_scale, std::string weight_format,
                      std::optional<Tensor> b13, std::optional<Tensor> b2, std::string gate_up,
                      std::string activation) {
  const MoeInputs in{x, topk_ids, topk_weights, w13, w2, b13, b2};
  const Format format = parse_weight_format(weight_format);
  const family::W4Format kernels = kernel_format(format, check(in, w13_scale, w2_scale, format));
  // Parsed here so that a bad value is refused before anything launches.
  const auto gate_up_value = parse_choice<family::GateUp>("gate_up", gate_up);
  const auto activation_value = parse_choice<family::Activation>("activation", activation);
  const int64_t tokens = x.size(0), hidden = x.size(1), k = topk_ids.size(1);
  const int64_t experts = w13.size(0), inter = w13.size(1) / 2, slots = tokens * k;
  // The conversions, torch's work, before the launches (as in moe_experts).
  const Tensor ids = converted(topk_ids, ScalarType::Long);
  const Tensor weights = as_contiguous(converted(topk_weights, ScalarType::Float));
  const Tensor rows = packed_aligned(x);
  const Tensor w13_scales = as_contiguous(w13_scale), w2_scales = as_contiguous(w2_scale);
  const std::optional<Tensor> b13_rows = b13 ? std::optional(as_contiguous(*b13)) : b13;
  const std::optional<Tensor> b2_rows = b2 ? std::optional(as_contiguous(*b2)) : b2;
  LaunchGroup launches;
  Outputs temporaries(x, Outputs::part_bytes({slots, inter}, x.scalar_type()) +
                             Outputs::part_bytes({slots, hidden}, x.scalar_type()) +
                             route_bytes(slots, experts));
  const auto [order, offs, inverse] = route_slots(ids, experts, temporaries);
  const Tensor h = up_projection(rows, order, k, offs, {w13, w13_scales, kernels}, b13_rows,
                                 gate_up_value, activation_value, temporaries);
  const Tensor ys = down_projection(h, offs, {w2, w2_scales, kernels}, b2_rows, temporaries);
  const Tensor out = combine_slots(ys, inverse, tokens, k, weights, offs);
  launches.submit();
  return out;
}

}  // namespace gg::ops
