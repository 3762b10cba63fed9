// gg_runtime::grouped_mm: torch._grouped_mm's four cases on the ragged_m and
// ragged_k kernel families.  Every check of the inputs (messages name the
// argument), the case, how each operand is read (row- or column-major), the
// output, the launch: here and nowhere else.  Meta tensors run the same code
// without the launch (torch.compile's fake kernel).
#include <family_args.h>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using family::Major;

// Every case takes the ragged families' dtypes: checked before the case is known.
constexpr auto kDTypes = family::RaggedM::kDTypes;
static_assert(family::RaggedK::kDTypes == kDTypes, "grouped_mm's families take the same dtypes");

enum class Case {
  kRaggedM,  // a [T, K], b [G, K, N], offs [G] -> [T, N]
  kRaggedK,  // a [M, T], b [T, N], offs [G] -> [G, M, N]
  kRaggedN,  // a [G, M, K], b [K, T], offs [G] -> [M, T]
  kBatched,  // a [G, M, K], b [G, K, N] -> [G, M, N]
};

std::string shapes(const Tensor& a, const Tensor& b) {
  return text("mat_a is ", shape_of(a), " and mat_b is ", shape_of(b));
}

const Tensor& required_offsets(const std::optional<Tensor>& offs, const char* when) {
  if (!offs.has_value()) value_error("offs is required when ", when);
  return *offs;
}

// The case's own checks: shapes that agree, offsets where the case has them.
void check_case(Case c, const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs) {
  switch (c) {
    case Case::kRaggedM:
      if (a.size(1) != b.size(1)) {
        value_error("K differs: ", shapes(a, b), " (expected [T, K] and [G, K, N])");
      }
      check_offsets(required_offsets(offs, "mat_a is 2-D and mat_b is 3-D (ragged M)"), "mat_b",
                    b.size(0), a);
      return;
    case Case::kRaggedK: {
      if (a.size(1) != b.size(0)) {
        value_error("T differs: ", shapes(a, b), " (expected [M, T] and [T, N])");
      }
      const Tensor& o = required_offsets(offs, "mat_a and mat_b are 2-D (ragged K)");
      check_offsets(o, "offs", o.dim() == 1 ? o.size(0) : 0, a);
      return;
    }
    case Case::kRaggedN:
      if (a.size(2) != b.size(0)) {
        value_error("K differs: ", shapes(a, b), " (expected [G, M, K] and [K, T])");
      }
      check_offsets(required_offsets(offs, "mat_a is 3-D and mat_b is 2-D (ragged N)"), "mat_a",
                    a.size(0), a);
      return;
    case Case::kBatched:
      if (offs.has_value()) value_error("offs must be None when mat_a and mat_b are 3-D (batched)");
      if (a.size(0) != b.size(0) || a.size(2) != b.size(1)) {
        value_error("G or K differs: ", shapes(a, b), " (expected [G, M, K] and [G, K, N])");
      }
      return;
  }
}

// Every check of grouped_mm's inputs; the call's case.
Case classify(const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs,
              const std::optional<Tensor>& bias, ScalarType out_dtype) {
  const int64_t a_dims = a.dim(), b_dims = b.dim();
  if (a_dims < 2 || a_dims > 3 || b_dims < 2 || b_dims > 3) {
    value_error("mat_a and mat_b must be 2-D or 3-D: ", shapes(a, b));
  }
  check_tensor(a, "mat_a", a_dims, kDTypes);
  check_tensor(b, "mat_b", b_dims, kDTypes);
  check_same(b, "mat_b", a, "mat_a");
  if (out_dtype != a.scalar_type() && out_dtype != ScalarType::Float) {
    type_error("out_dtype=", dtype_name(out_dtype), " is not supported: give None, the inputs' ",
               "dtype (", dtype_name(a.scalar_type()), ") or torch.float32");
  }
  const Case c = a_dims == 2 ? (b_dims == 3 ? Case::kRaggedM : Case::kRaggedK)
                             : (b_dims == 2 ? Case::kRaggedN : Case::kBatched);
  check_case(c, a, b, offs);
  if (bias.has_value()) {
    if (b_dims != 3) {
      value_error("bias is supported where mat_b is 3-D, one matrix per group (ragged M and ",
                  "batched): mat_b is 2-D here");
    }
    check_bias(*bias, b.size(0), b.size(2), out_dtype, a);
  }
  return c;
}

// Whether sm90's kernels read x, whose groups lie along its contiguous
// dimension, in place: TMA with a 16-byte aligned row stride and base.
// Elsewhere element loads along that dimension ran slower than one copy of x
// (docs/notes/2026-11-24-ragged-n-row-major.md), so x is copied.
bool tma_reads(const Tensor& x, int64_t ld) {
  return ld * static_cast<int64_t>(x.element_size()) % 16 == 0 && address(x) % 16 == 0 &&
         runs_tma(x);
}

}  // namespace

Tensor ragged_m(const Tensor& a_in, const Matrix& b, int64_t n, const Tensor& offs,
                const std::optional<Tensor>& bias, ScalarType out_dtype, bool tf32,
                Outputs& outputs, Major out_major) {
  Matrix a = matrix_of(a_in);
  if (a.major == Major::kColumn && !tma_reads(a.t, a.ld)) a = row_major(as_contiguous(a.t));
  const int64_t rows = a.t.size(0), k = a.t.size(1), groups = b.t.size(0);
  const bool out_transposed = out_major == Major::kColumn;
  Tensor out =
      out_transposed ? outputs.make({n, rows}, out_dtype) : outputs.make({rows, n}, out_dtype);
  if (groups == 0) return zeroed(out);
  if (shapes_only(out)) return out;
  const std::optional<Tensor> bias_rows =
      bias.has_value() ? std::optional(as_contiguous(*bias)) : std::nullopt;
  const family::RaggedM args{.a_ptr = address(a.t),
                             .b_ptr = address(b.t),
                             .c_ptr = address(out),
                             .offs_ptr = address(offs),
                             .T = rows,
                             .N = n,
                             .K = k,
                             .G = groups,
                             .lda = a.ld,
                             .b_group_stride = b.t.stride(0),
                             .ldb = b.ld,
                             .ldc = out_transposed ? rows : n,
                             .bias_ptr = bias_rows ? address(*bias_rows) : 0,
                             .has_bias = bias_rows ? 1 : 0};
  launch(args, {.a_major = a.major, .b_major = b.major, .c_major = out_major},
         target_of(a.t, out_dtype, tf32));
  return out;
}

namespace {

Tensor ragged_k(const Tensor& a_in, const Tensor& b_in, const Tensor& offs, ScalarType out_dtype,
                bool tf32) {
  const Matrix b = row_major(b_in);
  // a [M, T]: read in place where it is row-major and TMA can, else
  // column-major, as a transposed view of row-major [T, M] (no copy for dB's
  // a = x^T).
  const bool in_place =
      a_in.stride(1) == 1 && a_in.stride(0) != 1 && tma_reads(a_in, a_in.stride(0));
  Matrix a = in_place ? Matrix{a_in, Major::kRow, a_in.stride(0)} : matrix_of_transpose(a_in);
  if (a.major == Major::kColumn) a = row_major(torch::stable::transpose(a_in, 0, 1));  // copied
  const int64_t m = a_in.size(0), n = b.t.size(1), groups = offs.size(0);
  Tensor out = new_output(a_in, {groups, m, n}, out_dtype);
  if (shapes_only(out)) return out;
  const family::RaggedK args{.a_ptr = address(a.t),
                             .b_ptr = address(b.t),
                             .c_ptr = address(out),
                             .offs_ptr = address(offs),
                             .M = m,
                             .N = n,
                             .T = a_in.size(1),
                             .G = groups,
                             .lda = a.ld,
                             .ldb = b.ld,
                             .ldc = n};
  launch(args, {.a_major = in_place ? Major::kRow : Major::kColumn},
         target_of(a.t, out_dtype, tf32));
  return out;
}

// out[M, T] row-major (torch's layout), computed as out^T = b^T (ragged rows)
// @ a[g]^T: one ragged_m on transposed views, its output stored transposed.
Tensor ragged_n(const Tensor& a, const Tensor& b, const Tensor& offs, ScalarType out_dtype,
                bool tf32) {
  Outputs results(a);
  return ragged_m(torch::stable::transpose(b, 0, 1), matrix_of_transpose(a), a.size(1), offs,
                  std::nullopt, out_dtype, tf32, results, /*out_major=*/Major::kColumn);
}

// a[g] @ b[g] (+ bias[g]) on the ragged kernels without copies where a's
// batches are stacked rows ([G*M, K]) or, without bias, stacked columns (a
// transposed view of [G, K, M], as in the backward).
Tensor batched(const Tensor& a_in, const Tensor& b, const std::optional<Tensor>& bias,
               ScalarType out_dtype, bool tf32) {
  const int64_t groups = a_in.size(0), m = a_in.size(1), k = a_in.size(2), n = b.size(2);
  const bool stacked_columns = !bias.has_value() && m > 1 && k > 1 && a_in.stride(1) == 1 &&
                               a_in.stride(0) == k * a_in.stride(2) && b.is_contiguous();
  if (stacked_columns) {
    const Tensor a_cols =
        torch::stable::reshape(torch::stable::transpose(a_in, 1, 2), {groups * k, m});
    return ragged_k(torch::stable::transpose(a_cols, 0, 1),
                    torch::stable::reshape(b, {groups * k, n}), batch_offsets(a_in, groups, k),
                    out_dtype, tf32);
  }
  const bool stacked_rows = (k <= 1 || a_in.stride(2) == 1) && a_in.stride(0) == m * a_in.stride(1);
  const Tensor a = stacked_rows ? a_in : as_contiguous(a_in);
  Outputs results(a);
  const Tensor out = ragged_m(torch::stable::reshape(a, {groups * m, k}), matrix_of(b), n,
                              batch_offsets(a, groups, m), bias, out_dtype, tf32, results);
  return torch::stable::view(out, {groups, m, n});
}

}  // namespace

Tensor grouped_mm(Tensor mat_a, Tensor mat_b, std::optional<Tensor> offs,
                  std::optional<Tensor> bias, std::optional<ScalarType> out_dtype, bool tf32) {
  const ScalarType out_type = out_dtype.value_or(mat_a.scalar_type());
  switch (classify(mat_a, mat_b, offs, bias, out_type)) {
    case Case::kRaggedM: {
      Outputs results(mat_a);
      return ragged_m(mat_a, matrix_of(mat_b), mat_b.size(2), *offs, bias, out_type, tf32, results);
    }
    case Case::kRaggedK:
      return ragged_k(mat_a, mat_b, *offs, out_type, tf32);
    case Case::kRaggedN:
      return ragged_n(mat_a, mat_b, *offs, out_type, tf32);
    case Case::kBatched:
      return batched(mat_a, mat_b, bias, out_type, tf32);
  }
  throw std::logic_error("grouped_mm: unknown case");
}

}  // namespace gg::ops
