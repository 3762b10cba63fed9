// gg_runtime::dispatch_plan and gg_runtime::received_slots: expert
// parallelism's plan at both ends of a dispatch (the dispatch_plan and
// received_slots kernel families), one launch each.  Checks, outputs,
// launch; Meta tensors run the same code without the launch.
#include <family_args.h>

#include <tuple>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

// k: the slots a token has, as many as the kernels load at once.
void check_slots(int64_t k, const char* name) {
  if (k < 1 || k > family::DispatchPlan::kMostSlots) {
    value_error(name, " must have between 1 and ", family::DispatchPlan::kMostSlots,
                " slots a token (k), got ", k);
  }
}

// The experts' layout every rank shares: W ranks of experts_per_rank experts,
// `capacity` rows a block, this rank `rank`.
void check_layout(int64_t world, int64_t rank, int64_t experts_per_rank, int64_t capacity) {
  if (world < 1) value_error("world must be >= 1, got ", world);
  if (rank < 0 || rank >= world) value_error("rank must be in [0, ", world, "), got ", rank);
  if (experts_per_rank < 1) value_error("experts_per_rank must be >= 1, got ", experts_per_rank);
  if (capacity < 1) value_error("capacity must be >= 1, got ", capacity);
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> dispatch_plan(Tensor topk_ids, Tensor topk_weights,
                                                 int64_t world, int64_t rank,
                                                 int64_t experts_per_rank, int64_t capacity) {
  check_tensor(topk_ids, "topk_ids", 2, ScalarType::Long);
  const int64_t tokens = topk_ids.size(0), k = topk_ids.size(1);
  check_slots(k, "topk_ids");
  check_companion(topk_weights, "topk_weights", {tokens, k}, ScalarType::Float, topk_ids, "float32",
                  "(one weight per slot of topk_ids)");
  check_layout(world, rank, experts_per_rank, capacity);
  if (tokens > capacity)
    value_error("topk_ids has ", tokens, " tokens, more than capacity ", capacity);
  Tensor dest = new_output(topk_ids, {tokens, world}, ScalarType::Long);
  Tensor index = new_output(topk_ids, {tokens, world}, ScalarType::Long);
  Tensor meta = new_output(topk_ids, {tokens, 2 * k}, ScalarType::Int);
  if (tokens == 0 || shapes_only(dest)) return {dest, index, meta};
  const Tensor ids = as_contiguous(topk_ids), weights = as_contiguous(topk_weights);
  const family::DispatchPlan args{.ids_ptr = address(ids),
                                  .weights_ptr = address(weights),
                                  .dest_ptr = address(dest),
                                  .index_ptr = address(index),
                                  .meta_ptr = address(meta),
                                  .T = tokens,
                                  .K = k,
                                  .W = world,
                                  .EPR = experts_per_rank,
                                  .RANK = rank,
                                  .CAP = capacity};
  launch(args, {},
         target_of(ids, family::DispatchPlan::kDTypes[0], family::DispatchPlan::kDTypes[0]));
  return {dest, index, meta};
}

std::tuple<Tensor, Tensor> received_slots(Tensor meta, int64_t world, int64_t rank,
                                          int64_t experts_per_rank, int64_t capacity) {
  check_tensor(meta, "meta", 2, ScalarType::Int);
  check_layout(world, rank, experts_per_rank, capacity);
  const int64_t rows = meta.size(0), k = meta.size(1) / 2;
  if (rows != world * capacity || meta.size(1) % 2) {
    value_error("meta must be [world * capacity, 2k] = [", world * capacity,
                ", 2k] (each row's k ids and k weights), got [", rows, ", ", meta.size(1), "]");
  }
  if (meta.stride(1) != 1 || meta.stride(0) != meta.size(1))
    value_error("meta must be contiguous (it is left blank where it lies)");
  check_slots(k, "meta");
  Tensor ids = new_output(meta, {rows, k}, ScalarType::Long);
  Tensor weights = new_output(meta, {rows, k}, ScalarType::Float);
  if (shapes_only(ids)) return {ids, weights};
  const family::ReceivedSlots args{.meta_ptr = address(meta),
                                   .ids_ptr = address(ids),
                                   .weights_ptr = address(weights),
                                   .R = rows,
                                   .K = k,
                                   .EPR = experts_per_rank,
                                   .RANK = rank};
  launch(args, {},
         target_of(meta, family::ReceivedSlots::kDTypes[0], family::ReceivedSlots::kDTypes[0]));
  return {ids, weights};
}

}  // namespace gg::ops
