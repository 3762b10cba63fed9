// gg_runtime::grouped_gemm: independent C_i = A_i @ B_i (B_i^T with trans_b)
// of any sizes on the grouped_gemm kernel family, in one launch.  The checks of every
// group (messages name the group), the group table, the outputs, the launch:
// here and nowhere else.  Meta tensors run the same code without the launch
// (torch.compile's fake kernel).
#include <family_args.h>

#include <array>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "op_support.h"
#include "ops.h"

namespace gg::ops {
namespace {

using Family = family::GroupedGemm;
using Group = Family::Group;

// With mixed N every C_i starts at a multiple of this many elements (128
// bytes), so every C_i can take TMA stores.
constexpr int64_t kMixedNAlign = 64;

int64_t padded(int64_t elements) {
  return (elements + kMixedNAlign - 1) / kMixedNAlign * kMixedNAlign;
}

void check_unit_inner_stride(const Tensor& x, const std::string& name) {
  if (x.stride(-1) != 1 && x.size(-1) > 1) {
    value_error(name, " must have unit stride in its last dimension, got strides ", strides_of(x),
                " for shape ", shape_of(x), " (call .contiguous())");
  }
}

// What is wrong with group i: its first failing check, in a fixed order that
// messages and tests rely on.  Runs only after the combined test of group_of
// has failed, since it formats the names.
void check_group(size_t i, const Tensor& a, const Tensor& b, bool trans_b, const Tensor& ref) {
  const std::string a_name = text("As[", i, "]"), b_name = text("Bs[", i, "]");
  check_tensor(a, a_name.c_str(), 2, Family::kDTypes);
  check_tensor(b, b_name.c_str(), 2, Family::kDTypes);
  check_same(a, a_name.c_str(), ref, "As[0]");
  check_same(b, b_name.c_str(), ref, "As[0]");
  check_unit_inner_stride(a, a_name);
  check_unit_inner_stride(b, b_name);
  const int64_t b_k = b.size(trans_b ? 1 : 0);
  if (a.size(1) != b_k) {
    value_error("group ", i, ": ", a_name, " is ", shape_of(a), " ([M, K]) but ", b_name, " is ",
                shape_of(b), " (", trans_b ? "[N, K]" : "[K, N]", "): K differs (", a.size(1),
                " vs ", b_k, ")");
  }
}

// One group's words (c left 0 until the outputs exist), or none where any of
// check_group's checks fails: one cheap combined test per group, given that
// ref (As[0]) has passed check_tensor, so its dtype and device are allowed.
std::optional<Group> group_of(const Tensor& a, const Tensor& b, bool trans_b, ScalarType dtype,
                              const torch::stable::Device& device) {
  const auto a_sizes = a.sizes(), b_sizes = b.sizes();
  if (a_sizes.size() != 2 || b_sizes.size() != 2 || a.scalar_type() != dtype ||
      b.scalar_type() != dtype || a.device() != device || b.device() != device) {
    return std::nullopt;
  }
  const auto a_strides = a.strides(), b_strides = b.strides();
  const int64_t m = a_sizes[0], k = a_sizes[1];
  const int64_t n = trans_b ? b_sizes[0] : b_sizes[1], b_k = trans_b ? b_sizes[1] : b_sizes[0];
  if (k != b_k || (a_strides[1] != 1 && k > 1) || (b_strides[1] != 1 && b_sizes[1] > 1)) {
    return std::nullopt;
  }
  return Group{.a = address(a),
               .b = address(b),
               .c = 0,
               .M = m,
               .N = n,
               .K = k,
               .lda = a_strides[0],
               .ldb = b_strides[0],
               .ldc = n};  // C_i is contiguous
}

// Every group's words; raises check_group's error where one fails.
std::vector<Group> read_groups(const std::vector<Tensor>& As, const std::vector<Tensor>& Bs,
                               bool trans_b) {
  const Tensor& ref = As[0];
  const ScalarType dtype = ref.scalar_type();
  const torch::stable::Device device = ref.device();
  std::vector<Group> groups;
  groups.reserve(As.size());
  for (size_t i = 0; i < As.size(); ++i) {
    const std::optional<Group> group = group_of(As[i], Bs[i], trans_b, dtype, device);
    if (!group.has_value()) break;
    groups.push_back(*group);
  }
  if (groups.size() == As.size()) return groups;
  for (size_t i = 0; i < As.size(); ++i) check_group(i, As[i], Bs[i], trans_b, ref);
  throw std::logic_error("grouped_gemm: the fast and the full group checks disagree");
}

// A [rows, cols] tensor on buffer's storage, `offset` elements in: a plain
// tensor on the shared storage, made without the dispatcher.  A view op per
// group (or one split) would pass every output through the dispatcher and
// autograd's view tracking, which grouped_gemm, not differentiable, has no
// use for; making the outputs is most of its host time.
Tensor slice(const Tensor& buffer, int64_t rows, int64_t cols, int64_t row_stride, int64_t offset) {
  const std::array<int64_t, 2> sizes{rows, cols}, strides{row_stride, 1};
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch__reinterpret_tensor(buffer.get(), 2, sizes.data(),
                                                        strides.data(), offset, &handle));
  return Tensor(handle);
}

// Every C_i in one allocation, back to back, each contiguous, and its address
// in its group's c: one allocation instead of one per group.  When every N is
// equal the C_i are row slices of one [sum M, N] tensor, otherwise each starts
// at a multiple of kMixedNAlign elements of a flat buffer.
std::vector<Tensor> outputs(std::vector<Group>& groups, const Tensor& ref) {
  const int64_t n0 = groups[0].N;
  bool equal_n = true;
  int64_t rows = 0, elements = 0;
  for (const Group& g : groups) {
    equal_n = equal_n && g.N == n0;
    rows += g.M;
    elements += padded(g.M * g.N);
  }
  const Tensor buffer = equal_n ? new_output(ref, {rows, n0}, ref.scalar_type())
                                : new_output(ref, {elements}, ref.scalar_type());
  const int64_t base = address(buffer), size = static_cast<int64_t>(buffer.element_size());
  // With N = 0 the buffer's row stride is 1, as torch makes it (and split keeps it).
  const int64_t row_stride = equal_n ? buffer.stride(0) : 0;
  std::vector<Tensor> cs;
  cs.reserve(groups.size());
  int64_t offset = 0;
  for (Group& g : groups) {
    cs.push_back(slice(buffer, g.M, g.N, equal_n ? row_stride : g.N, offset));
    g.c = base + size * offset;
    offset += equal_n ? g.M * row_stride : padded(g.M * g.N);
  }
  return cs;
}

std::vector<int64_t> table_of(const std::vector<Group>& groups) {
  std::vector<int64_t> table;
  table.reserve(groups.size() * family::GroupedGemm::kGroupWidth);
  for (const Group& g : groups) g.append_to(table);
  return table;
}

}  // namespace

std::vector<Tensor> grouped_gemm(std::vector<Tensor> As, std::vector<Tensor> Bs, bool trans_b) {
  if (As.size() != Bs.size()) {
    value_error("As has ", As.size(), " matrices but Bs has ", Bs.size());
  }
  if (As.empty()) return {};
  const Tensor& ref = As[0];
  check_tensor(ref, "As[0]", 2, Family::kDTypes);
  std::vector<Group> groups = read_groups(As, Bs, trans_b);
  std::vector<Tensor> cs = outputs(groups, ref);
  for (const Tensor& c : cs) {
    if (shapes_only(c)) return cs;
  }
  const Family::Axes axes{.b_major = trans_b ? family::Major::kColumn : family::Major::kRow};
  run(Family::kIndex, Family::code(axes), Family{}.abi(), table_of(groups),
      target_of(ref, ref.scalar_type()));
  return cs;
}

}  // namespace gg::ops
