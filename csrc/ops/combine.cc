// gg_runtime::combine: the weighted combine that ends moe_experts' forward
// (the combine kernel family), one launch.  Checks, output, launch; Meta
// tensors run the same code without the launch.  combine_parts: the fp8
// decode forward's (the combine_parts family).
#include <family_args.h>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {

Tensor combine(Tensor rows_in, Tensor index_in, Tensor weights_in, Tensor offs) {
  check_tensor(rows_in, "rows", 2, family::Combine::kDTypes);
  check_tensor(index_in, "index", 2, ScalarType::Long);
  const int64_t tokens = index_in.size(0), k = index_in.size(1);
  check_companion(index_in, "index", {tokens, k}, ScalarType::Long, rows_in, "int64",
                  "(the row of each token's slot)");
  check_companion(weights_in, "weights", {tokens, k}, ScalarType::Float, rows_in, "float32",
                  "(one weight per slot of index)");
  check_offsets(offs, "offs", offs.size(0), rows_in);
  return combine_slots(rows_in, index_in, tokens, k, weights_in, offs);
}

Tensor combine_slots(const Tensor& rows_in, const Tensor& index_in, int64_t tokens, int64_t k,
                     const Tensor& weights_in, const Tensor& offs, const Tensor* into) {
  const int64_t hidden = rows_in.size(1);
  Tensor out = output_into(into, rows_in, tokens, hidden, rows_in.scalar_type());
  if (out.numel() == 0 || shapes_only(out)) return out;
  const Tensor rows = dense(rows_in), index = as_contiguous(index_in),
               weights = as_contiguous(weights_in);
  const family::Combine args{.rows_ptr = address(rows),
                             .index_ptr = address(index),
                             .weights_ptr = address(weights),
                             .offs_ptr = address(offs),
                             .out_ptr = address(out),
                             .R = rows.size(0),
                             .T = tokens,
                             .H = hidden,
                             .K = k,
                             .G = offs.size(0)};
  launch(args, {}, target_of(rows, rows.scalar_type()));
  return out;
}

Tensor combine_parts(const Tensor& parts, const Tensor& ids, int64_t tokens, int64_t k,
                     const Tensor& weights_in, int64_t experts, const Tensor* into) {
  const int64_t hidden = parts.size(2);
  Tensor out = output_into(into, parts, tokens, hidden, ScalarType::BFloat16);
  if (out.numel() == 0 || shapes_only(out)) return out;
  const Tensor weights = as_contiguous(weights_in);
  const family::CombineParts args{.parts_ptr = address(parts),
                                  .ids_ptr = address(ids),
                                  .weights_ptr = address(weights),
                                  .out_ptr = address(out),
                                  .T = tokens,
                                  .H = hidden,
                                  .K = k,
                                  .G = experts,
                                  .P = parts.size(1)};
  launch(args, {}, target_of(parts, ScalarType::BFloat16));
  return out;
}

}  // namespace gg::ops
