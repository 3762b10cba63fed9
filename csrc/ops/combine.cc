// gg_runtime::combine: the weighted combine of moe_experts' k slots of a
// token (the combine kernel family), one launch; and down_combine, the down
// projection that ends moe_experts' forward with that combine in its
// epilogue.  Checks, output, launch; Meta tensors run the same code without
// the launch.
#include <family_args.h>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {

Tensor combine(Tensor rows_in, Tensor index_in, Tensor weights_in, Tensor offs) {
  check_tensor(rows_in, "rows", 2, {ScalarType::Half, ScalarType::BFloat16});
  check_tensor(index_in, "index", 2, {ScalarType::Long});
  const int64_t tokens = index_in.size(0), k = index_in.size(1);
  check_companion(index_in, "index", {tokens, k}, ScalarType::Long, rows_in, "int64",
                  "(the row of each token's slot)");
  check_companion(weights_in, "weights", {tokens, k}, ScalarType::Float, rows_in, "float32",
                  "(one weight per slot of index)");
  check_offsets(offs, "offs", offs.size(0), rows_in);
  return combine_slots(rows_in, index_in, tokens, k, weights_in, offs);
}

Tensor combine_slots(const Tensor& rows_in, const Tensor& index_in, int64_t tokens, int64_t k,
                     const Tensor& weights_in, const Tensor& offs) {
  const int64_t hidden = rows_in.size(1);
  Tensor out = new_output(rows_in, {tokens, hidden}, rows_in.scalar_type());
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
  launch(args, "rows", target_of(rows, rows.scalar_type()));
  return out;
}

Tensor down_combine(const Tensor& h, const Tensor& w2, const Tensor& offs,
                    const std::optional<Tensor>& bias, const Tensor& order, const Tensor& inverse,
                    const Tensor& weights, int64_t k, Outputs& temporaries) {
  const int64_t slots = h.size(0), hidden = w2.size(1), groups = w2.size(0);
  const int64_t tokens = slots / k;
  Tensor out = new_output(h, {tokens, hidden}, h.scalar_type());
  if (groups == 0) return torch::stable::zero_(out);  // every slot dropped
  const Tensor rows = temporaries.make({slots, hidden}, h.scalar_type());
  if (out.numel() == 0 || shapes_only(out)) return out;
  const Matrix a = row_major(h), b = matrix_of_transpose(w2);  // b [G, I, H]
  const std::optional<Tensor> bias_rows =
      bias.has_value() ? std::optional(as_contiguous(*bias)) : std::nullopt;
  const Tensor weight_rows = as_contiguous(weights);
  const family::DownCombine args{.a_ptr = address(a.t),
                                 .b_ptr = address(b.t),
                                 .c_ptr = address(rows),
                                 .offs_ptr = address(offs),
                                 .T = slots,
                                 .N = hidden,
                                 .K = h.size(1),
                                 .G = groups,
                                 .lda = a.ld,
                                 .b_group_stride = b.t.stride(0),
                                 .ldb = b.ld,
                                 .ldc = hidden,
                                 .bias_ptr = bias_rows ? address(*bias_rows) : 0,
                                 .has_bias = bias_rows ? 1 : 0,
                                 .order_ptr = address(order),
                                 .inverse_ptr = address(inverse),
                                 .weights_ptr = address(weight_rows),
                                 .out_ptr = address(out),
                                 .counts_ptr = 0,  // the runtime's
                                 .TOKENS = tokens,
                                 .TOP_K = k};
  launch(args, b.transposed ? "nt" : "nn", target_of(h, h.scalar_type()));
  return out;
}

}  // namespace gg::ops
