// gg_runtime::quantize_fp8_columns: x [T, C] float16 / bfloat16 / float32 ->
// q [C, W] float8_e4m3fn quantised along T within each group of rows (offs),
// K-major, each group's 128-row blocks starting at a 128-column boundary,
// and float32 scales per column of a group ("rowwise", [G, C]) or of a
// 128-row block of it ("1x128", [T / 128 + G, C]): the operands of the fp8
// weight gradient (aot/kernels/quantize_columns.py says the layout).  Checks,
// outputs, one launch.  With rows, the rows quantized are x's rows rows[r] /
// k (the routing's gather, read in place), T of them.  Meta tensors run the
// same code without the launch.
#include <family_args.h>

#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "fp8.h"
#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::QuantizeFp8Columns;
using family::Granularity;

// The family's granularities: quantize_fp8's but 128x128 (no fp8 weight gradient takes it).
Granularity parse_granularity(const std::string& name) {
  const std::optional<Granularity> granularity = family::parse<Granularity>(name);
  if (!granularity || *granularity == Granularity::k128x128) {
    value_error("granularity must be 'rowwise' or '1x128', got '", name, "'");
  }
  return *granularity;
}

void check(const Tensor& x, const Tensor& offs, const std::optional<Tensor>& rows, int64_t k) {
  check_tensor(x, "x", 2, Family::kDTypes);
  check_offsets(offs, "offs", offs.dim() == 1 ? offs.size(0) : 0, x);
  if (rows.has_value()) check_rows(*rows, x, "x");
  check_k(k);
  // The kernel divides the gathered slot numbers (x's rows times k) in int32.
  if (rows.has_value() && x.size(0) * k > std::numeric_limits<int32_t>::max()) {
    value_error("x's rows times k must be below 2**31, got ", x.size(0), " x ", k);
  }
}

// 128-row blocks of q's columns: every group's blocks fit, whatever its rows.
int64_t column_blocks(int64_t rows, int64_t groups) { return rows / kBlock + groups; }

// Its rows: x's in order, or x's rows gathered[r] / k.
struct Rows {
  const Tensor& gathered;  // offs where none are (rows_div 0: never read)
  int64_t count, k;
};

void launch_quantize(Granularity granularity, const Tensor& x_in, const Tensor& offs,
                     const Rows& rows, const Tensor& q, const Tensor& scale) {
  const Matrix x = row_major(x_in);
  const Family args{.x_ptr = address(x.t),
                    .q_ptr = address(q),
                    .scale_ptr = address(scale),
                    .offs_ptr = address(offs),
                    .T = rows.count,
                    .C = x.t.size(1),
                    .G = offs.size(0),
                    // A single row's stride is arbitrary: C keeps the aligned flavour's rule.
                    .ldx = x.t.size(0) > 1 ? x.ld : x.t.size(1),
                    .rows_ptr = address(rows.gathered),
                    .rows_div = rows.k};
  // The input's own dtype code (tf32=false): TF32 has no meaning here.
  sm90_only(
      [&] { launch(args, {.granularity = granularity}, target_of(x.t, kFp8, /*tf32=*/false)); });
}

}  // namespace

std::tuple<Tensor, Tensor> quantize_fp8_columns(Tensor x, Tensor offs, std::string granularity_name,
                                                std::optional<Tensor> gathered, int64_t k) {
  const Granularity granularity = parse_granularity(granularity_name);
  check(x, offs, gathered, k);
  const int64_t rows = gathered ? gathered->size(0) : x.size(0), cols = x.size(1),
                groups = offs.size(0);
  const int64_t blocks = column_blocks(rows, groups);
  Tensor q = new_output(x, {cols, blocks * kBlock}, kFp8);
  Tensor scale = new_output(x, {granularity == Granularity::kRowwise ? groups : blocks, cols},
                            ScalarType::Float);
  // No group, or no column: nothing the layout specifies.
  if (groups > 0 && cols > 0 && !shapes_only(q)) {
    const Tensor order = gathered ? as_contiguous(*gathered) : offs;
    launch_quantize(granularity, x, offs, {order, rows, gathered ? k : 0}, q, scale);
  }
  return {q, scale};
}

}  // namespace gg::ops
