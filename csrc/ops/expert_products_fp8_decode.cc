// fp8 moe_experts' decode path: a call of few slots (serving's decode) runs
// the routing, the tokens' quantization per 128 columns and both projections
// of each unit (a tile of an expert's slots and 128 columns of h) in one
// kernel (scaled_experts_decode), or, where its units are few and H wide,
// with each unit's H cut into parts in two (scaled_decode_up, then
// scaled_decode_down); combine_parts sums the parts (expert_products_fp8.cc).
#include <family_args.h>

#include <algorithm>
#include <optional>

#include "expert_products_fp8.h"

namespace gg::ops {
namespace {

// How many parts of H the decode forward cuts each unit into (1: the
// one-kernel forward).  Where a call has few units (at most kSplitUnits of
// them at one slot an expert: min(S, G) x h's chunks) and H is wide (at
// least kSplitMinBlocks of its 128-row blocks), each unit's stream of
// weights is long and most SMs idle: then about kSplitPrograms programs over
// the units, each with at least kSplitBlocks blocks of H, none empty.
// Elsewhere the one-kernel forward measured faster (docs/notes/
// 2026-11-29-fp8-decode-units-split-over-h.md).  A test forcing a split
// kernel gets at least 2 parts where H has two blocks; one forcing the
// one-kernel forward, 1.
constexpr int64_t kSplitUnits = 32;
constexpr int64_t kSplitMinBlocks = 40;
constexpr int64_t kSplitPrograms = 256;
constexpr int64_t kSplitBlocks = 4;
constexpr int64_t kDecodeSlotsAnExpert = 2;

int64_t decode_splits(int64_t slots, int64_t experts, int64_t hidden, int64_t inter) {
  const int64_t units = std::max<int64_t>(std::min(slots, experts) * blocks(inter), 1);
  const int64_t steps = blocks(hidden);
  int64_t want = units <= kSplitUnits && steps >= kSplitMinBlocks
                     ? std::min(kSplitPrograms / units, steps / kSplitBlocks)
                     : 1;
  if (forces_family(family::ScaledDecodeUp::kIndex) ||
      forces_family(family::ScaledDecodeDown::kIndex)) {
    want = std::max<int64_t>(want, std::min<int64_t>(steps, 2));
  } else if (forces_family(family::ScaledExpertsDecode::kIndex)) {
    want = 1;
  }
  if (want < 2) return 1;
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
       {family::ScaledExpertsDecode::kIndex, family::ScaledDecodeUp::kIndex,
        family::ScaledDecodeDown::kIndex, family::CombineParts::kIndex}) {
    if (forces_family(decode_family)) return true;
  }
  if (forces_family(family::ScaledRaggedGlu::kIndex) ||
      forces_family(family::ScaledRaggedM::kIndex) || forces_family(family::Combine::kIndex)) {
    return false;
  }
  return slots <= family::ScaledExpertsDecode::kMaxSlots && slots <= kDecodeSlotsAnExpert * experts;
}

// The down projection's rows made in parts, [S, cdiv(I, 128), H] float32 in
// the slots' own order (combine_parts sums them): the routing, the tokens'
// quantization per 128 columns and both projections of each tile of an
// expert's slots and 128 columns of h, in one scaled_experts_decode launch,
// or with each unit's H cut into `splits` parts in two (scaled_decode_up,
// its gate and up sums float32 [splits, S, 2I], then scaled_decode_down).
Tensor decode_parts(const MoeInputs& in, const std::optional<Tensor>& x_scale, const Tensor& ids,
                    const DownProjection& weights, const Tensor& w13_scale,
                    const std::optional<Tensor>& b13, Scaling scales, Choices choices,
                    Outputs& outputs) {
  const int64_t slots = ids.numel(), hidden = in.x.size(1), inter = in.w2.size(2);
  const int64_t experts = in.w13.size(0);
  Tensor parts = outputs.make({slots, blocks(inter), hidden}, ScalarType::Float);
  if (experts == 0 || shapes_only(parts)) return parts;  // as up_projection's
  const DecodeTokens tokens(in, x_scale, scales);
  const family::Scaling scaling =
      scales == Scaling::kBlockwise ? family::Scaling::kBlockwise : family::Scaling::kRowwise;
  // The family's dtype is the 16-bit tokens': the output's where they come quantized.
  const Target target =
      target_of(in.x, runtime_dtype(fp8_out_dtype(in.x)), runtime_dtype(ScalarType::Float));
  const int64_t activation = family::choice_code(choices.activation);
  const int64_t b13_ptr = b13 ? address(*b13) : 0, b2_ptr = weights.b2 ? address(*weights.b2) : 0;
  const int64_t splits = decode_splits(slots, experts, hidden, inter);
  if (splits == 1) {
    const family::ScaledExpertsDecode args{.x_ptr = tokens.x_ptr(),
                                           .xq_ptr = tokens.xq_ptr(),
                                           .x_scale_ptr = tokens.x_scale_ptr(),
                                           .ids_ptr = address(ids),
                                           .k = in.topk_ids.size(1),
                                           .w13_ptr = address(in.w13),
                                           .w13_scale_ptr = address(w13_scale),
                                           .w2_ptr = address(weights.w2),
                                           .w2_scale_ptr = address(weights.w2_scale),
                                           .b13_ptr = b13_ptr,
                                           .has_b13 = b13 ? 1 : 0,
                                           .b2_ptr = b2_ptr,
                                           .has_b2 = weights.b2 ? 1 : 0,
                                           .activation = activation,
                                           .parts_ptr = address(parts),
                                           .S = slots,
                                           .H = hidden,
                                           .N = in.w13.size(1),
                                           .G = experts,
                                           .w13_group_stride = in.w13.stride(0),
                                           .ld13 = in.w13.stride(1),
                                           .w2_group_stride = weights.w2.stride(0),
                                           .ld2 = weights.w2.stride(1)};
    sm90_only([&] { launch(args, {.scaling = scaling, .gate_up = choices.gate_up}, target); });
    return parts;
  }
  const Tensor gu = outputs.make({splits, slots, in.w13.size(1)}, ScalarType::Float);
  const family::ScaledDecodeUp up{.x_ptr = tokens.x_ptr(),
                                  .xq_ptr = tokens.xq_ptr(),
                                  .x_scale_ptr = tokens.x_scale_ptr(),
                                  .ids_ptr = address(ids),
                                  .k = in.topk_ids.size(1),
                                  .w13_ptr = address(in.w13),
                                  .w13_scale_ptr = address(w13_scale),
                                  .gu_ptr = address(gu),
                                  .S = slots,
                                  .H = hidden,
                                  .N = in.w13.size(1),
                                  .G = experts,
                                  .splits = splits,
                                  .w13_group_stride = in.w13.stride(0),
                                  .ld13 = in.w13.stride(1)};
  const family::ScaledDecodeDown down{.gu_ptr = address(gu),
                                      .ids_ptr = address(ids),
                                      .w2_ptr = address(weights.w2),
                                      .w2_scale_ptr = address(weights.w2_scale),
                                      .b13_ptr = b13_ptr,
                                      .has_b13 = b13 ? 1 : 0,
                                      .b2_ptr = b2_ptr,
                                      .has_b2 = weights.b2 ? 1 : 0,
                                      .activation = activation,
                                      .parts_ptr = address(parts),
                                      .S = slots,
                                      .H = hidden,
                                      .N = in.w13.size(1),
                                      .G = experts,
                                      .splits = splits,
                                      .w2_group_stride = weights.w2.stride(0),
                                      .ld2 = weights.w2.stride(1)};
  sm90_only([&] {
    launch(up, {.scaling = scaling, .gate_up = choices.gate_up}, target);
    launch(down, {.scaling = scaling, .gate_up = choices.gate_up},
           target_of(gu, runtime_dtype(ScalarType::Float), runtime_dtype(ScalarType::Float)));
  });
  return parts;
}

}  // namespace gg::ops
