// fp8 moe_experts' decode path: a call of few slots (serving's decode) runs
// the routing, the tokens' quantization per 128 columns and both projections
// of each unit (a tile of an expert's slots and 128 columns of h) in one
// kernel (scaled_experts_decode), combine_parts summing its parts
// (expert_products_fp8.cc); or, where its units are few, the whole forward
// with each slot's H cut into parts in one launch (scaled_decode_split).
#include <family_args.h>

#include <algorithm>
#include <optional>

#include "expert_products_fp8.h"
#include "ops.h"

namespace gg::ops {
namespace {

// How many parts of H the split forward cuts each slot's up projection into,
// or 0 where the one-kernel forward runs.  Where a call has few units (at
// most kSplitUnits slots x h's chunks), each unit's stream of weights is long
// and most SMs idle: then about kSplitPrograms programs over the units, each
// with at least kSplitBlocks blocks of H, none empty, where that makes two
// parts or more.  Elsewhere the one-kernel forward measured faster (docs/
// notes/2026-11-30-fp8-decode-split-in-one-launch.md).  A test forcing the
// split forward gets it (at least 2 parts where H has two blocks) unless H
// is empty (nothing to cut, and no division by zero parts); one forcing the
// one-kernel forward or its combine_parts, that.
constexpr int64_t kSplitUnits = 32;
constexpr int64_t kSplitPrograms = 256;
constexpr int64_t kSplitBlocks = 4;
constexpr int64_t kDecodeSlotsAnExpert = 2;

int64_t decode_splits(int64_t slots, int64_t hidden, int64_t inter) {
  const int64_t units = std::max<int64_t>(slots * blocks(inter), 1);
  const int64_t steps = blocks(hidden);
  if (steps == 0) return 0;
  int64_t want = units <= kSplitUnits ? std::min(kSplitPrograms / units, steps / kSplitBlocks) : 0;
  if (forces_family(family::ScaledDecodeSplit::kIndex)) {
    want = std::max<int64_t>(want, std::min<int64_t>(steps, 2));
  } else if (forces_family(family::ScaledExpertsDecode::kIndex) ||
             forces_family(family::CombineParts::kIndex) || want < 2) {
    return 0;
  }
  return cdiv(steps, cdiv(steps, want));
}

// What the decode kernels read of the tokens: 16-bit rows (blockwise: the
// kernels quantize them per 128 columns) or quantize_fp8's per token, given
// or made here (a launch before).
struct DecodeTokens {
  std::optional<Tensor> x;
  std::optional<Quantized> quantized;

  DecodeTokens(const MoeInputs& in, const std::optional<Tensor>& x_scale, Scaling scales) {
    if (scales == Scaling::kBlockwise) {
      x = packed_aligned(in.x);
    } else {
      quantized = quantized_tokens(in.x, x_scale, scales);
    }
  }
  int64_t x_ptr() const { return x ? address(*x) : 0; }
  int64_t xq_ptr() const { return quantized ? address(std::get<0>(*quantized)) : 0; }
  int64_t x_scale_ptr() const { return quantized ? address(std::get<1>(*quantized)) : 0; }
};

// The one-kernel forward's rows in parts, [S, cdiv(I, 128), H] float32 in
// the slots' own order, for combine_parts.
Tensor decode_parts(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& ids,
                    const DownProjection& weights, const Tensor& w13_scale,
                    const std::optional<Tensor>& b13, Scaling scales, family::Scaling scaling,
                    Choices choices, Outputs& outputs) {
  const int64_t slots = ids.numel(), hidden = in.x.size(1), inter = in.w2.size(2);
  Tensor parts = outputs.make({slots, blocks(inter), hidden}, ScalarType::Float);
  // No experts: every slot is dropped, and combine_parts writes zeros.
  if (in.w13.size(0) == 0 || shapes_only(parts)) return parts;
  const DecodeTokens tokens(in, x_scale, scales);
  const family::ScaledExpertsDecode args{.x_ptr = tokens.x_ptr(),
                                         .xq_ptr = tokens.xq_ptr(),
                                         .x_scale_ptr = tokens.x_scale_ptr(),
                                         .ids_ptr = address(ids),
                                         .k = in.topk_ids.size(1),
                                         .w13_ptr = address(in.w13),
                                         .w13_scale_ptr = address(w13_scale),
                                         .w2_ptr = address(weights.w2),
                                         .w2_scale_ptr = address(weights.w2_scale),
                                         .b13_ptr = b13 ? address(*b13) : 0,
                                         .has_b13 = b13 ? 1 : 0,
                                         .b2_ptr = weights.b2 ? address(*weights.b2) : 0,
                                         .has_b2 = weights.b2 ? 1 : 0,
                                         .activation = family::choice_code(choices.activation),
                                         .parts_ptr = address(parts),
                                         .S = slots,
                                         .H = hidden,
                                         .N = in.w13.size(1),
                                         .G = in.w13.size(0),
                                         .w13_group_stride = in.w13.stride(0),
                                         .ld13 = in.w13.stride(1),
                                         .w2_group_stride = weights.w2.stride(0),
                                         .ld2 = weights.w2.stride(1)};
  // The family's dtype is the 16-bit tokens': the output's where they come quantized.
  sm90_only([&] {
    launch(args, {.scaling = scaling, .gate_up = choices.gate_up},
           target_of(in.x, runtime_dtype(fp8_out_dtype(in.x)), runtime_dtype(ScalarType::Float)));
  });
  return parts;
}

}  // namespace

// Whether the forward takes the decode path: few slots, at most
// kDecodeSlotsAnExpert an expert on average, where the experts' weight bytes
// are all the work (aot/families/scaled_experts_decode.py); past that the
// routed products measured faster (docs/notes/
// 2026-11-30-fp8-decode-two-slots-an-expert.md).  A test forcing a kernel of
// either path takes that path.  Its blockwise kernels quantize 16-bit tokens
// themselves: tokens given quantized per 128 columns take the other path.
bool decode_fits(int64_t slots, int64_t experts, bool blockwise_tokens_given) {
  if (blockwise_tokens_given) return false;
  for (const int decode_family :
       {family::ScaledExpertsDecode::kIndex, family::ScaledDecodeSplit::kIndex,
        family::CombineParts::kIndex}) {
    if (forces_family(decode_family)) return true;
  }
  if (forces_family(family::ScaledRaggedGlu::kIndex) ||
      forces_family(family::ScaledRaggedM::kIndex) || forces_family(family::Combine::kIndex)) {
    return false;
  }
  return slots <= family::ScaledExpertsDecode::kMaxSlots && slots <= kDecodeSlotsAnExpert * experts;
}

// The forward's output [T, H] (bfloat16, into `into` where given and of
// that dtype): the one-kernel forward (scaled_experts_decode: the routing,
// the tokens' quantization per 128 columns and both projections of each
// tile of an expert's slots and 128 columns of h, its rows in parts [S,
// cdiv(I, 128), H] float32 that combine_parts sums), or, where its units are
// few, scaled_decode_split with each slot's H cut into decode_splits' parts.
Tensor decode_forward(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& ids,
                      const Tensor& weights_in, const DownProjection& weights,
                      const Tensor& w13_scale, const std::optional<Tensor>& b13, Scaling scales,
                      Choices choices, Outputs& outputs, const Tensor* into) {
  const int64_t slots = ids.numel(), hidden = in.x.size(1), inter = in.w2.size(2);
  const int64_t tokens = in.x.size(0), k = in.topk_ids.size(1), experts = in.w13.size(0);
  const int64_t splits = decode_splits(slots, hidden, inter);
  const family::Scaling scaling =
      scales == Scaling::kBlockwise ? family::Scaling::kBlockwise : family::Scaling::kRowwise;
  if (splits == 0 || experts == 0) {
    const Tensor parts =
        decode_parts(in, x_scale, ids, weights, w13_scale, b13, scales, scaling, choices, outputs);
    return combine_parts(parts, ids, tokens, k, weights_in, experts, into);
  }
  Tensor out = output_into(into, in.x, tokens, hidden, ScalarType::BFloat16);
  if (out.numel() == 0 || shapes_only(out)) return out;
  const int64_t units = slots * blocks(inter);
  const Tensor gu = outputs.make({splits, units, 2 * kBlock}, ScalarType::Float);
  const Tensor h = outputs.make({units, kBlock}, kFp8);
  const Tensor h_scale = outputs.make({units}, ScalarType::Float);
  const Tensor counters = zeroed(outputs.make({2 + units}, ScalarType::Int));
  const Tensor routing_weights = as_contiguous(weights_in);
  const DecodeTokens tokens_read(in, x_scale, scales);
  const family::ScaledDecodeSplit args{.x_ptr = tokens_read.x_ptr(),
                                       .xq_ptr = tokens_read.xq_ptr(),
                                       .x_scale_ptr = tokens_read.x_scale_ptr(),
                                       .ids_ptr = address(ids),
                                       .weights_ptr = address(routing_weights),
                                       .k = k,
                                       .w13_ptr = address(in.w13),
                                       .w13_scale_ptr = address(w13_scale),
                                       .w2_ptr = address(weights.w2),
                                       .w2_scale_ptr = address(weights.w2_scale),
                                       .b13_ptr = b13 ? address(*b13) : 0,
                                       .has_b13 = b13 ? 1 : 0,
                                       .b2_ptr = weights.b2 ? address(*weights.b2) : 0,
                                       .has_b2 = weights.b2 ? 1 : 0,
                                       .activation = family::choice_code(choices.activation),
                                       .gu_ptr = address(gu),
                                       .h_ptr = address(h),
                                       .h_scale_ptr = address(h_scale),
                                       .counters_ptr = address(counters),
                                       .out_ptr = address(out),
                                       .T = tokens,
                                       .H = hidden,
                                       .N = in.w13.size(1),
                                       .G = experts,
                                       .splits = splits,
                                       .w13_group_stride = in.w13.stride(0),
                                       .ld13 = in.w13.stride(1),
                                       .w2_group_stride = weights.w2.stride(0),
                                       .ld2 = weights.w2.stride(1)};
  sm90_only([&] {
    launch(
        args, {.scaling = scaling, .gate_up = choices.gate_up},
        target_of(in.x, runtime_dtype(fp8_out_dtype(in.x)), runtime_dtype(ScalarType::BFloat16)));
  });
  return out;
}

}  // namespace gg::ops
