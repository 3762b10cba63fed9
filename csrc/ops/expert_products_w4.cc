// moe_experts' products with 4-bit expert weights (two values a byte along
// K) in one of two formats, MXFP4 (e2m1 values, an e8m0 scale a group of
// 32) or symmetric INT4 (offset-8 integers, a bfloat16 scale a group of 32
// or 128): the up projection on the tokens' rows gathered through the
// routing with the activation in its epilogue (w4_glu), then the down
// projection (w4_ragged_m); at decode their twins w4_decode_glu and
// w4_decode_down, or, where those have few units, the whole forward in one
// launch with each slot's H cut into parts (w4_decode_split).  The weights
// are widened to the tokens' 16 bits in the kernels' K loops (W4A16); at
// prefill, MXFP4 weights are widened to fp8 once a call instead and the fp8
// products run on that copy (widen_mxfp4, then expert_products_fp8.cc: W4A8).
// Inference only.
#include <family_args.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <utility>

#include "expert_products.h"
#include "expert_products_fp8.h"
#include "fp8.h"
#include "moe_inputs.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// Values along K a scale covers: MXFP4's 32; INT4's 32 or 128, from the
// scale's last dimension (whole groups: K / group scales).
int64_t scale_group(WeightFormat format, const Tensor& scale, const Tensor& weight) {
  if (format == WeightFormat::kMxfp4 || scale.dim() != 3 || scale.size(2) == 0) return 32;
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
void check_scale(const Tensor& scale, const char* name, const Tensor& weight, WeightFormat format) {
  if (format == WeightFormat::kMxfp4 && scale.scalar_type() != ScalarType::Byte) {
    type_error(name, " must be float8_e8m0fnu or uint8 (e8m0 exponents) with MXFP4 weights, got ",
               dtype_name(scale.scalar_type()));
  }
  if (format == WeightFormat::kInt4 && scale.scalar_type() != ScalarType::BFloat16) {
    type_error(name, " must be bfloat16 with INT4 weights, got ", dtype_name(scale.scalar_type()));
  }
  const int64_t k = 2 * weight.size(2), group = scale_group(format, scale, weight);
  const Shape shape{weight.size(0), weight.size(1), k / group};
  if (sizes_of(scale) != shape) {
    value_error(
        name, " must be [E, N, K/", group, "] = ", tuple_text(shape), " (a scale for each ", group,
        " values along K", format == WeightFormat::kInt4 ? "; INT4 takes groups of 32 or 128" : "",
        ") for its weight ", shape_of(weight), " ([E, N, K/2] bytes), got ", shape_of(scale));
  }
}

// Every check; the scales' group.
int64_t check(const MoeInputs& in, const Tensor& w13_scale, const Tensor& w2_scale,
              WeightFormat format) {
  check_dtype(in.x, "x", family::W4Glu::kDTypes);
  check_routing_dtypes(in);
  check_like_x(in, {{"b13", given(in.b13)}, {"b2", given(in.b2)}});
  check_devices(in, {{"w13.scales", &w13_scale}, {"w2.scales", &w2_scale}});
  check_shapes(in, /*values_per_element=*/2);
  const int64_t group = scale_group(format, w13_scale, in.w13);
  const int64_t hidden = in.x.size(1), inter = in.w13.size(1) / 2;
  if (hidden % group != 0 || inter % group != 0) {
    value_error("4-bit weights need H and I to be multiples of their scale group (", group,
                ": whole groups), got H=", hidden, ", I=", inter);
  }
  check_weight(in.w13, "w13", "[E, 2I, H/2]");
  check_weight(in.w2, "w2", "[E, H, I/2]");
  check_scale(w13_scale, "w13.scales", in.w13, format);
  check_scale(w2_scale, "w2.scales", in.w2, format);
  if (scale_group(format, w2_scale, in.w2) != group) {
    value_error("w13.scales and w2.scales must have the same group (", group, " values), got ",
                shape_of(w13_scale), " and ", shape_of(w2_scale));
  }
  return group;
}

// The kernels' format for the weights' format and scale group.
family::W4Format kernel_format(WeightFormat format, int64_t group) {
  if (format == WeightFormat::kMxfp4) return family::W4Format::kMxfp4;
  return group == 128 ? family::W4Format::kInt4G128 : family::W4Format::kInt4G32;
}

// What both projections read of an expert's weights: its packed values and
// their scales.
struct Weights {
  const Tensor& values;
  const Tensor& scales;  // contiguous
  family::W4Format format;
};

// At most one slot an expert (serving's decode): the kernels that load the
// packed weights straight into the MMA's registers (w4_decode_glu,
// w4_decode_down), every step's chain shorter; else the routed kernels.  Not
// where the experts outnumber the slots kFewSlots times over, where the decode
// kernels measured slower (each of their units searches offs, G long, for its
// expert: docs/notes/2026-11-29-w4-decode-kernels-in-the-wheel.md).
constexpr int64_t kFewSlots = 32;
bool decodes(int64_t slots, int64_t experts) {
  return slots <= experts && experts <= kFewSlots * slots;
}

// Whether a test forces a variant of any of `families` (the other paths' kernels).
bool forces_any(std::initializer_list<int> families) {
  return std::any_of(families.begin(), families.end(), forces_family);
}

// Where the forward widens MXFP4 weights to fp8 in 128 x 128 blocks
// (widen_mxfp4) and runs the fp8 products on that copy (W4A8): at least
// kWidenRows slots an expert on average, where widening every expert's
// weights once a call measured faster than the routed W4A16 kernels, which
// widen each weight tile again for every tile of tokens
// (docs/notes/2026-12-01-w4-prefill-widened-to-fp8.md).  MXFP4 only (its
// values times its scales are e4m3 blocks exactly; INT4's are not), on GPUs
// that run the sm90 kernels (the fp8 products').  A test forcing widen_mxfp4
// gets it; one forcing a W4A16 kernel, W4A16.
constexpr int64_t kWidenRows = 64;
bool widens(int64_t slots, const Tensor& w13, family::W4Format format, const Tensor& x) {
  const int64_t experts = w13.size(0);
  if (format != family::W4Format::kMxfp4 || experts == 0 || !runs_tma(x)) return false;
  if (forces_family(family::WidenMxfp4::kIndex)) return true;
  if (forces_any({family::W4DecodeGlu::kIndex, family::W4DecodeDown::kIndex, family::W4Glu::kIndex,
                  family::W4RaggedM::kIndex, family::W4DecodeSplit::kIndex})) {
    return false;
  }
  return slots >= kWidenRows * experts;
}

// An MXFP4 weight [E, N, K/2] (bytes) and its scales [E, N, K/32] widened
// to fp8 (widen_mxfp4): (values [E, N, K] float8_e4m3fn, scales [E,
// ceil(N/128), ceil(K/128)] float32), temporaries of the call.
std::pair<Tensor, Tensor> widened(const Tensor& values, const Tensor& scales, const Tensor& x,
                                  Outputs& temporaries) {
  const int64_t experts = values.size(0), n = values.size(1), k = 2 * values.size(2);
  Tensor q = temporaries.make({experts, n, k}, kFp8);
  Tensor q_scales = temporaries.make({experts, blocks(n), blocks(k)}, ScalarType::Float);
  if (q.numel() > 0) {
    launch(family::WidenMxfp4{.v_ptr = address(values),
                              .s_ptr = address(scales),
                              .q_ptr = address(q),
                              .bs_ptr = address(q_scales),
                              .G = experts,
                              .N = n,
                              .K = k,
                              .v_group_stride = values.stride(0),
                              .ldv = values.stride(1),
                              .s_group_stride = scales.stride(0),
                              .lds = scales.stride(1)},
           {}, target_of(x, x.scalar_type()));
  }
  return {q, q_scales};
}

// widened()'s bytes of temporaries for a weight [E, N, K/2].
int64_t widened_bytes(const Tensor& values) {
  const int64_t experts = values.size(0), n = values.size(1), k = 2 * values.size(2);
  return Outputs::part_bytes({experts, n, k}, kFp8) +
         Outputs::part_bytes({experts, blocks(n), blocks(k)}, ScalarType::Float);
}

// Where the forward takes w4_decode_split: no biases (its kernel adds none),
// I not empty, at most one slot an expert, and an up projection of at most
// kSplitUnits units of 128 w13 rows a slot, where the decode kernels leave
// most SMs idle and the split forward measured faster
// (docs/notes/2026-12-01-w4-decode-split.md).  A test forcing it gets it
// (with biases, the other kernels all the same); one forcing a kernel of the
// other paths, that path.
constexpr int64_t kSplitUnits = 128;
bool splits_decode(int64_t slots, int64_t experts, int64_t inter, bool biases) {
  if (biases || inter == 0) return false;
  if (forces_family(family::W4DecodeSplit::kIndex)) return true;
  if (forces_any({family::W4DecodeGlu::kIndex, family::W4DecodeDown::kIndex, family::W4Glu::kIndex,
                  family::W4RaggedM::kIndex, family::Combine::kIndex,
                  family::WidenMxfp4::kIndex})) {
    return false;
  }
  return slots <= experts && slots * cdiv(2 * inter, 128) <= kSplitUnits;
}

// w4_decode_split's parts: about kSplitPrograms tickets of each kind, an up
// part at least kSplitSteps of its K steps along H, a down part at least one
// of a token's (slot, chunk) pairs (at least one: I is not empty); none
// empty.
constexpr int64_t kSplitPrograms = 256;
constexpr int64_t kSplitSteps = 2;
int64_t up_splits(int64_t units, int64_t hidden) {
  const int64_t steps = std::max<int64_t>(cdiv(hidden, family::W4DecodeSplit::kUpStep), 1);
  const int64_t want = std::clamp<int64_t>(kSplitPrograms / std::max<int64_t>(units, 1), 1,
                                           std::max<int64_t>(steps / kSplitSteps, 1));
  return cdiv(steps, cdiv(steps, want));
}
int64_t down_splits(int64_t row_tiles, int64_t pairs) {
  const int64_t want = std::clamp<int64_t>(kSplitPrograms / std::max<int64_t>(row_tiles, 1), 1,
                                           std::max<int64_t>(pairs, 1));
  return cdiv(pairs, cdiv(pairs, want));
}

// The up projection's arguments, the same for both of its families.
template <typename Family>
Family up_args(const Tensor& x, const Tensor& order, int64_t k, const Tensor& offs,
               const Weights& w13, const std::optional<Tensor>& b13, family::Activation activation,
               const Tensor& h) {
  const int64_t n = w13.values.size(1);
  return Family{.a_ptr = address(x),
                .b_ptr = address(w13.values),
                .c_ptr = address(h),
                .offs_ptr = address(offs),
                .b_scale_ptr = address(w13.scales),
                .T = order.size(0),
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
                .activation = family::choice_code(activation),
                .rows_ptr = address(order),
                .rows_div = k};
}

// h [S, I]: each slot's token row (token order[r] / k) times w13 (+ b13),
// activated, in one launch.
Tensor up_projection(const Tensor& x, const Tensor& order, int64_t k, const Tensor& offs,
                     const Weights& w13, const std::optional<Tensor>& b13, family::GateUp gate_up,
                     family::Activation activation, Outputs& outputs) {
  const int64_t slots = order.size(0), n = w13.values.size(1);
  Tensor h = outputs.make({slots, n / 2}, x.scalar_type());
  // No experts: every slot is dropped and nothing reads h (the kernels would
  // read a group's weights).
  if (w13.values.size(0) == 0 || shapes_only(h)) return h;
  const Target target = target_of(x, x.scalar_type());
  if (decodes(slots, w13.values.size(0))) {
    launch(up_args<family::W4DecodeGlu>(x, order, k, offs, w13, b13, activation, h),
           {.format = w13.format, .gate_up = gate_up}, target);
  } else {
    launch(up_args<family::W4Glu>(x, order, k, offs, w13, b13, activation, h),
           {.format = w13.format, .gate_up = gate_up}, target);
  }
  return h;
}

// The down projection's arguments, the same for both of its families.
template <typename Family>
Family down_args(const Tensor& h, const Tensor& offs, const Weights& w2,
                 const std::optional<Tensor>& b2, const Tensor& ys) {
  const int64_t hidden = w2.values.size(1);
  return Family{.a_ptr = address(h),
                .b_ptr = address(w2.values),
                .c_ptr = address(ys),
                .offs_ptr = address(offs),
                .b_scale_ptr = address(w2.scales),
                .T = h.size(0),
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
}

// The down projection's rows [S, H] in the routing's order: h's rows of
// each group times w2 (+ b2), one launch; the rows past the last group's
// (dropped slots) zero.
Tensor down_projection(const Tensor& h, const Tensor& offs, const Weights& w2,
                       const std::optional<Tensor>& b2, Outputs& outputs) {
  const int64_t slots = h.size(0), hidden = w2.values.size(1);
  Tensor ys = outputs.make({slots, hidden}, h.scalar_type());
  if (w2.values.size(0) == 0 || shapes_only(ys)) return ys;
  const Target target = target_of(h, h.scalar_type());
  if (decodes(slots, w2.values.size(0))) {
    launch(down_args<family::W4DecodeDown>(h, offs, w2, b2, ys), {.format = w2.format}, target);
  } else {
    launch(down_args<family::W4RaggedM>(h, offs, w2, b2, ys), {.format = w2.format}, target);
  }
  return ys;
}

class W4Products final : public ExpertProducts {
 public:
  W4Products(const MoeInputs& in, const Tensor& w13_scale, const Tensor& w2_scale,
             family::W4Format format, Choices choices)
      : ExpertProducts(in),
        format_(format),
        choices_(choices),
        x_(packed_aligned(in.x)),
        w13_scale_(as_contiguous(w13_scale)),
        w2_scale_(as_contiguous(w2_scale)),
        b13_(contiguous_bias(in.b13)),
        b2_(contiguous_bias(in.b2)) {}

  Tensor rows(const RoutedSlots& routed, Tensor* /*gu: inference only*/,
              Outputs& temporaries) const override {
    if (widens(routed.order.size(0), in_.w13, format_, x_)) return fp8_rows(routed, temporaries);
    const Tensor h =
        up_projection(x_, routed.order, routed.k, routed.offs, {in_.w13, w13_scale_, format_}, b13_,
                      choices_.gate_up, choices_.activation, temporaries);
    return down_projection(h, routed.offs, {in_.w2, w2_scale_, format_}, b2_, temporaries);
  }

  int64_t temporary_bytes(int64_t slots) const override {
    if (!widens(slots, in_.w13, format_, x_)) return ExpertProducts::temporary_bytes(slots);
    return widened_bytes(in_.w13) + widened_bytes(in_.w2) +
           fp8_rows_temporary_bytes(slots, in_.w2.size(2) * 2);
  }

  bool gathers() const override { return true; }

  bool takes_decode(int64_t slots) const override {
    return splits_decode(slots, in_.w13.size(0), in_.w2.size(2) * 2, b13_ || b2_);
  }

  // The whole forward in w4_decode_split's one launch.
  Tensor decode(const Tensor& ids, const Tensor& weights, Outputs& temporaries,
                const Tensor* into) const override {
    const int64_t tokens = x_.size(0), hidden = x_.size(1), inter = in_.w2.size(2) * 2;
    const int64_t k = in_.topk_ids.size(1);
    Tensor out = output_into(into, x_, tokens, hidden, x_.scalar_type());
    if (out.numel() == 0 || shapes_only(out)) return out;
    if (in_.w13.size(0) == 0) return zeroed(out);  // every slot dropped
    const int64_t chunks = cdiv(inter, 128), units = tokens * k * chunks;
    const int64_t splits = up_splits(units, hidden);
    const int64_t row_tiles = cdiv(hidden, family::W4DecodeSplit::kDownRows);
    const int64_t parts = down_splits(tokens * row_tiles, k * chunks);
    const Tensor ids_read = packed_aligned(ids);
    const Tensor gu = temporaries.make({splits, units, 256}, ScalarType::Float);
    const Tensor h = temporaries.make({units, 128}, x_.scalar_type());
    const Tensor dsum = temporaries.make({parts, tokens, hidden}, ScalarType::Float);
    const Tensor counters =
        zeroed(temporaries.make({2 + units + tokens * row_tiles}, ScalarType::Int));
    const family::W4DecodeSplit args{.x_ptr = address(x_),
                                     .ids_ptr = address(ids_read),
                                     .weights_ptr = address(weights),
                                     .k = k,
                                     .w13_ptr = address(in_.w13),
                                     .w13_scale_ptr = address(w13_scale_),
                                     .w2_ptr = address(in_.w2),
                                     .w2_scale_ptr = address(w2_scale_),
                                     .activation = family::choice_code(choices_.activation),
                                     .gu_ptr = address(gu),
                                     .h_ptr = address(h),
                                     .dsum_ptr = address(dsum),
                                     .counters_ptr = address(counters),
                                     .out_ptr = address(out),
                                     .T = tokens,
                                     .H = hidden,
                                     .N = in_.w13.size(1),
                                     .G = in_.w13.size(0),
                                     .splits = splits,
                                     .down_splits = parts,
                                     .w13_group_stride = in_.w13.stride(0),
                                     .ld13 = in_.w13.stride(1),
                                     .w13_scale_group_stride = w13_scale_.stride(0),
                                     .lds13 = w13_scale_.stride(1),
                                     .w2_group_stride = in_.w2.stride(0),
                                     .ld2 = in_.w2.stride(1),
                                     .w2_scale_group_stride = w2_scale_.stride(0),
                                     .lds2 = w2_scale_.stride(1)};
    launch(args, {.format = format_, .gate_up = choices_.gate_up}, target_of(x_, x_.scalar_type()));
    return out;
  }

 private:
  // The rows of fp8's products on the weights widened to fp8 (W4A8).
  Tensor fp8_rows(const RoutedSlots& routed, Outputs& temporaries) const {
    const auto [w13, w13_scale] = widened(in_.w13, w13_scale_, x_, temporaries);
    const auto [w2, w2_scale] = widened(in_.w2, w2_scale_, x_, temporaries);
    const std::optional<Tensor> scales13(w13_scale), scales2(w2_scale), none;
    const MoeInputs widened_in{in_.x, in_.topk_ids, in_.topk_weights, w13, w2, in_.b13, in_.b2};
    return fp8_products(widened_in, {scales13, scales2, none}, WeightFormat::kFp8SquareBlocks,
                        choices_)
        ->rows(routed, nullptr, temporaries);
  }

  static std::optional<Tensor> contiguous_bias(const std::optional<Tensor>& bias) {
    return bias ? std::optional(as_contiguous(*bias)) : bias;
  }

  family::W4Format format_;
  Choices choices_;
  Tensor x_, w13_scale_, w2_scale_;
  std::optional<Tensor> b13_, b2_;
};

}  // namespace

std::unique_ptr<ExpertProducts> w4_products(const MoeInputs& in, const Scales& scales,
                                            WeightFormat format, Choices choices) {
  for (const auto& [name, scale] :
       {Named{"w13.scales", given(scales.w13)}, Named{"w2.scales", given(scales.w2)}}) {
    if (scale == nullptr) {
      type_error(name, " must be a tensor with 4-bit weights (weight_format 'mxfp4' or 'int4'), ",
                 "got None");
    }
  }
  check_no_scales(scales, false, "with 4-bit weights (the tokens are 16-bit)");
  const int64_t group = check(in, *scales.w13, *scales.w2, format);
  return std::make_unique<W4Products>(in, *scales.w13, *scales.w2, kernel_format(format, group),
                                      choices);
}

}  // namespace gg::ops
