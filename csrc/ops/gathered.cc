// gg_runtime::grouped_mm_glu, gathered_mm and gathered_mm_k: grouped products
// over rows read through the routing's order (moe_experts' up projection with
// its activation in the epilogue, and its backward's products), so that no
// permuted copy of the tokens or of the gradient rows is made.  Checks,
// outputs, launches; Meta tensors run the same code without the launches.
#include <family_args.h>

#include <string>
#include <tuple>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using family::Activation;
using family::GateUp;
using family::Major;

// w13 [G, 2I, H] against x [T, H]; returns I.
int64_t check_w13(const Tensor& w13, const Tensor& x) {
  check_tensor(w13, "w13", 3, family::RaggedGlu::kDTypes);
  check_same(w13, "w13", x, "x");
  if (w13.size(1) % 2 != 0 || w13.size(2) != x.size(1)) {
    value_error("w13 must be [G, 2I, H] with H = ", x.size(1), " (x's columns), got shape ",
                shape_of(w13));
  }
  return w13.size(1) / 2;
}

// One launch of ragged_glu or gathered_m (one kernel, one parameter list):
// row r < count of the product is a[rows[r] / rows_div] (a's row r where
// rows_div is 0: rows is then not read) times b[g] (+ bias[g]), into c (rows
// ldc apart): gathered_m's the product; ragged_glu's its activation
// (`activation`), gu where save_gu.
struct GatheredProduct {
  const Matrix& a;
  const Tensor& rows;
  int64_t rows_div;
  const Matrix& b;  // [G, K, N]
  int64_t count, n;
  const Tensor& offs;
  const std::optional<Tensor>& bias;
};

template <typename Family>
void launch_gathered(const GatheredProduct& p, const Tensor& c, int64_t ldc, const Tensor& gu,
                     bool save_gu, Activation activation, const typename Family::Axes& axes) {
  const std::optional<Tensor> bias_rows =
      p.bias.has_value() ? std::optional(as_contiguous(*p.bias)) : std::nullopt;
  const Family args{.a_ptr = address(p.a.t),
                    .b_ptr = address(p.b.t),
                    .c_ptr = address(c),
                    .offs_ptr = address(p.offs),
                    .T = p.count,
                    .N = p.n,
                    .K = p.a.t.size(1),
                    .G = p.b.t.size(0),
                    .lda = p.a.ld,
                    .b_group_stride = p.b.t.stride(0),
                    .ldb = p.b.ld,
                    .ldc = ldc,
                    .bias_ptr = bias_rows ? address(*bias_rows) : 0,
                    .has_bias = bias_rows ? 1 : 0,
                    .gu_ptr = address(save_gu ? gu : c),
                    .save_gu = save_gu ? 1 : 0,
                    .activation = family::choice_code(activation),
                    .rows_ptr = address(p.rows),
                    .rows_div = p.rows_div};
  launch(args, axes, target_of(p.a.t, p.a.t.scalar_type()));
}

}  // namespace

std::tuple<Tensor, Tensor> grouped_mm_glu(Tensor x, std::optional<Tensor> rows, int64_t k,
                                          Tensor w13, Tensor offs, std::optional<Tensor> bias,
                                          std::string gate_up, std::string activation,
                                          bool save_gu) {
  check_tensor(x, "x", 2, family::RaggedGlu::kDTypes);
  if (rows.has_value()) check_rows(*rows, x, "x");
  check_k(k);
  const int64_t inter = check_w13(w13, x), groups = w13.size(0);
  check_offsets(offs, "w13", groups, x);
  const auto gate_up_value = parse_choice<GateUp>("gate_up", gate_up);
  const auto activation_value = parse_choice<Activation>("activation", activation);
  if (bias.has_value()) check_bias(*bias, groups, 2 * inter, x.scalar_type(), x);
  const int64_t count = rows.has_value() ? rows->size(0) : x.size(0);
  Tensor gu = new_output(x, {save_gu ? count : 0, 2 * inter}, x.scalar_type());
  Outputs results(x);
  Tensor h = up_projection(x, rows, k, w13, offs, bias, gate_up_value, activation_value,
                           save_gu ? &gu : nullptr, results);
  return {h, gu};
}

Tensor up_projection(const Tensor& x_in, const std::optional<Tensor>& rows_in, int64_t k,
                     const Tensor& w13, const Tensor& offs, const std::optional<Tensor>& bias,
                     GateUp gate_up, Activation activation, Tensor* gu, Outputs& outputs) {
  const int64_t inter = w13.size(1) / 2, groups = w13.size(0);
  const int64_t rows = rows_in.has_value() ? rows_in->size(0) : x_in.size(0);
  const Matrix b = matrix_of_transpose(w13);  // [G, H, 2I]: the b of x @ b
  const Matrix a = row_major(x_in);
  // Without rows the kernels read x's rows in order (rows_div 0; offs stands in).
  const Tensor gather = rows_in.has_value() ? as_contiguous(*rows_in) : offs;
  Tensor h = outputs.make({rows, inter}, x_in.scalar_type());
  if (groups == 0) {  // every row past the last group: zeros
    if (gu != nullptr) zeroed(*gu);
    return zeroed(h);
  }
  if (shapes_only(h)) return h;
  const GatheredProduct product{a,    gather, rows_in.has_value() ? k : 0, b, rows, 2 * inter,
                                offs, bias};
  launch_gathered<family::RaggedGlu>(product, h, inter, gu != nullptr ? *gu : h, gu != nullptr,
                                     activation, {.b_major = b.major, .gate_up = gate_up});
  return h;
}

Tensor gathered_mm(Tensor x, Tensor rows_in, int64_t k, Tensor b_in, Tensor offs) {
  check_tensor(x, "x", 2, family::GatheredM::kDTypes);
  check_tensor(b_in, "b", 3, family::GatheredM::kDTypes);
  check_same(b_in, "b", x, "x");
  check_rows(rows_in, x, "x");
  check_k(k);
  if (b_in.size(1) != x.size(1)) {
    value_error("b must be [G, K, N] with K = ", x.size(1), " (x's columns), got shape ",
                shape_of(b_in));
  }
  const int64_t groups = b_in.size(0), rows = rows_in.size(0), n = b_in.size(2);
  check_offsets(offs, "b", groups, x);
  Tensor out = new_output(x, {rows, n}, x.scalar_type());
  if (groups == 0) return zeroed(out);  // every row past the last group
  if (shapes_only(out)) return out;
  const Matrix a = row_major(x), b = matrix_of(b_in);
  const Tensor gather = as_contiguous(rows_in);
  launch_gathered<family::GatheredM>({a, gather, k, b, rows, n, offs, std::nullopt}, out, n, out,
                                     false, Activation::kSwiglu, {.b_major = b.major});
  return out;
}

Tensor gathered_mm_k(Tensor a_in, Tensor b_in, Tensor offs, Tensor rows_in, int64_t k,
                     bool gather_a) {
  check_tensor(a_in, "a", 2, family::GatheredK::kDTypes);
  check_tensor(b_in, "b", 2, family::GatheredK::kDTypes);
  check_same(b_in, "b", a_in, "a");
  check_rows(rows_in, a_in, "a");
  check_k(k);
  const char* ordered = gather_a ? "b" : "a";
  if ((gather_a ? b_in : a_in).size(0) != rows_in.size(0)) {
    value_error(ordered, " must have a row for each of rows' ", rows_in.size(0),
                " entries, got shape ", shape_of(gather_a ? b_in : a_in));
  }
  check_offsets(offs, "offs", offs.size(0), a_in);
  const int64_t m = a_in.size(1), n = b_in.size(1), groups = offs.size(0);
  Tensor out = new_output(a_in, {groups, m, n}, a_in.scalar_type());
  if (out.numel() == 0 || shapes_only(out)) return out;
  const Matrix a = row_major(a_in), b = row_major(b_in);
  const Tensor rows = as_contiguous(rows_in);
  const family::GatheredK args{.a_ptr = address(a.t),
                               .b_ptr = address(b.t),
                               .c_ptr = address(out),
                               .offs_ptr = address(offs),
                               .M = m,
                               .N = n,
                               .T = rows.size(0),
                               .G = groups,
                               .lda = a.ld,
                               .ldb = b.ld,
                               .ldc = n,
                               .rows_ptr = address(rows),
                               .rows_div = k};
  launch(args, {.gathered = gather_a ? family::Operand::kA : family::Operand::kB},
         target_of(a.t, a.t.scalar_type()));
  return out;
}

}  // namespace gg::ops
