// gg_runtime::route: moe_experts' routing (the route kernel family): the token
// slots sorted by expert, stably, with the groups' end offsets and the inverse
// permutation, on the GPU (no host sync): three kernels (launched as one
// graph), or one where the slots fit one program's chunk.  Checks, outputs, scratch,
// launches; Meta tensors run the same code without the launches.
#include <family_args.h>

#include <optional>
#include <tuple>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::Route;

// (the sorted values, the order): t's stable sort.
std::tuple<Tensor, Tensor> stable_sort(const Tensor& t) {
  auto stack = call_aten("aten::sort", "stable", t, std::optional(true), int64_t{0}, false);
  return {torch::stable::detail::to<Tensor>(stack[0]), torch::stable::detail::to<Tensor>(stack[1])};
}

// route's results by torch's operators, for more experts than the kernels'
// bins: each id outside [0, experts) taken as `experts` (clamped into
// [-1, experts], then -1 wrapped), sorted stably; offs[e] the number of
// sorted ids <= e; the inverse permutation the order of the order.
std::tuple<Tensor, Tensor, Tensor> route_by_sort(const Tensor& ids, int64_t experts) {
  const Tensor clamped = aten("aten::clamp", "Tensor", ids, std::optional(long_scalar(-1, ids)),
                              std::optional(long_scalar(experts, ids)));
  const Tensor expert = aten("aten::remainder", "Tensor", clamped, long_scalar(experts + 1, ids));
  auto [sorted, order] = stable_sort(expert);
  const Tensor ones = full({experts}, 1.0, ScalarType::Long, ids);
  const Tensor ends = aten("aten::cumsum", "", ones, int64_t{0}, std::optional(ScalarType::Long));
  const Tensor offs =
      aten("aten::searchsorted", "Tensor", sorted, ends, true, false, std::nullopt, std::nullopt);
  auto [slots, inverse] = stable_sort(order);
  return {order, offs, inverse};
}

// Each chunk's counts per bin, then the totals (a row more): the scratch of
// the three-launch sort, rows of the most bins a variant has; up to
// kSingleSlots slots are sorted by one program without it.
Shape hist_shape(int64_t slots) {
  if (slots <= Family::kSingleSlots) return {};
  const int64_t chunks = (slots + Family::kSlotsPerChunk - 1) / Family::kSlotsPerChunk;
  return {chunks + 1, Family::kBins};
}

bool sorts_by_torch(int64_t slots, int64_t experts) {
  return experts > Family::kBins - 1 && slots > 0;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> route(Tensor ids, int64_t experts) {
  check_tensor(ids, "ids", 1, ScalarType::Long);
  if (experts < 0) value_error("experts must be >= 0, got ", experts);
  Outputs results(ids);
  LaunchGroup launches;
  auto routed = route_slots(ids, experts, results);
  launches.submit();
  return routed;
}

int64_t route_bytes(int64_t slots, int64_t experts) {
  if (sorts_by_torch(slots, experts)) return 0;
  const Shape hist = hist_shape(slots);
  return 2 * Outputs::part_bytes({slots}, ScalarType::Long) +
         Outputs::part_bytes({experts}, ScalarType::Int) +
         (hist.empty() ? 0 : Outputs::part_bytes(hist, ScalarType::Int));
}

std::tuple<Tensor, Tensor, Tensor> route_slots(const Tensor& ids_in, int64_t experts,
                                               Outputs& outputs) {
  const int64_t slots = ids_in.numel();
  if (sorts_by_torch(slots, experts) && !shapes_only(ids_in)) {
    return route_by_sort(torch::stable::reshape(ids_in, {slots}), experts);
  }
  Tensor order = outputs.make({slots}, ScalarType::Long);
  Tensor inverse = outputs.make({slots}, ScalarType::Long);
  Tensor offs = outputs.make({experts}, ScalarType::Int);
  if (shapes_only(order)) return {order, offs, inverse};
  if (slots == 0) {  // every group empty; no launch
    filled(offs, 0.0);
    return {order, offs, inverse};
  }
  const Shape hist_rows = hist_shape(slots);
  const int64_t chunks = hist_rows.empty() ? 1 : hist_rows[0] - 1;
  const std::optional<Tensor> hist =
      hist_rows.empty() ? std::nullopt : std::optional(outputs.make(hist_rows, ScalarType::Int));
  const Tensor ids = as_contiguous(ids_in);
  const Family args{.ids_ptr = address(ids),
                    .hist_ptr = hist ? address(*hist) : address(offs),
                    .order_ptr = address(order),
                    .inverse_ptr = address(inverse),
                    .offs_ptr = address(offs),
                    .N = slots,
                    .E = experts,
                    .CHUNKS = chunks};
  // The family's one dtype: its pointers' types are fixed.
  const Target target = target_of(ids, Family::kDTypes[0], Family::kDTypes[0]);
  using family::Phase;
  if (!hist) {
    launch(args, {.phase = Phase::kSingle}, target);
  } else {
    for (Phase phase : {Phase::kCount, Phase::kScan, Phase::kPlace}) {
      launch(args, {.phase = phase}, target);
    }
  }
  return {order, offs, inverse};
}

}  // namespace gg::ops
