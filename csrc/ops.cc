#include "ops.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "dispatch.h"
#include "driver.h"
#include "launch.h"

namespace gg {
namespace {

constexpr int64_t kElementBytes = 2;  // float16 and bfloat16
constexpr int64_t kTmaAlignBytes = 16;

bool tma_aligned_ptr(uint64_t ptr) { return ptr % kTmaAlignBytes == 0; }
bool tma_aligned_stride(int64_t elements) {
  return elements > 0 && (elements * kElementBytes) % kTmaAlignBytes == 0;
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The chosen variant, loaded and configured for the target device.
struct Chosen {
  const KernelInfo* info;
  ReadyKernel ready;
  unsigned max_programs;  // one resident wave
};

Chosen choose(const Target& t, Family family, bool a_t, bool b_t, bool tma_ok, int64_t rows) {
  const DeviceProps& props = device_props(t.device);
  require_supported(t.device, props);
  Request request{family, t.dtype, a_t, b_t, tma_ok && t.allow_tma, static_cast<long>(rows)};
  const size_t index =
      t.variant.empty() ? pick_variant(request, props) : find_variant(t.variant, request, props);
  ReadyKernel ready = ready_kernel(index, t.device, props.shared_optin);
  return Chosen{&kernel_table()[index], ready,
                static_cast<unsigned>(props.sm_count * ready.max_programs_per_sm)};
}

// Kernels number tiles in int32.
void require_int32_tiles(int64_t tiles) {
  if (tiles > std::numeric_limits<int32_t>::max()) {
    throw std::invalid_argument("more than 2**31 output tiles in one call; split the problem");
  }
}

unsigned programs_for(const Chosen& chosen, int64_t tiles) {
  return static_cast<unsigned>(std::min<int64_t>(tiles, chosen.max_programs));
}

void launch_with_scratch(const Target& t, const Chosen& chosen, unsigned programs, ArgPack& args) {
  StreamBuffer scratch(t.device, t.stream, scratch_bytes(*chosen.info, programs));
  launch(*chosen.info, chosen.ready.function, programs, t.stream, args, scratch.ptr());
}

// The list kernel's metadata (aot/kernels/list_gemm.py): kKernelFields int64 per
// group, then (appended once the variant is known) the running tile count.
constexpr size_t kKernelFields = 9;  // a, b, c, m, n, k, lda, ldb, ldc

struct ListMeta {
  std::vector<int64_t> words;
  int64_t rows = 0, busy_groups = 0;  // over groups with output elements
  bool tma_ok = true;
};

ListMeta list_meta(const ListProblem& p) {
  using F = ListProblem::Field;
  ListMeta meta;
  meta.words.reserve(p.group_count() * (kKernelFields + 1));
  int64_t c_offset = 0;  // elements
  for (size_t g = 0; g < p.group_count(); ++g) {
    const int64_t* in = p.group(g);
    const int64_t a = in[F::kA], b = in[F::kB], m = in[F::kM], n = in[F::kN], k = in[F::kK],
                  lda = in[F::kLda], ldb = in[F::kLdb];
    if (std::max({m, n, k}) > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("group " + std::to_string(g) + ": a dimension exceeds 2**31 - 1");
    }
    const int64_t c = static_cast<int64_t>(p.c_base) + c_offset * kElementBytes;
    c_offset += cdiv(m * n, p.c_align) * p.c_align;
    meta.words.insert(meta.words.end(), {a, b, c, m, n, k, lda, ldb, n});
    if (m == 0 || n == 0) continue;  // no tile ever touches this group
    meta.rows += m;
    ++meta.busy_groups;
    meta.tma_ok = meta.tma_ok && tma_aligned_ptr(a) && tma_aligned_ptr(b) && tma_aligned_ptr(c) &&
                  tma_aligned_stride(lda) && tma_aligned_stride(ldb) && tma_aligned_stride(n);
  }
  return meta;
}

void refuse_capture(cu::Stream stream) {
  if (stream_is_capturing(stream)) {
    throw std::invalid_argument(
        "grouped_gemm copies its metadata from host memory and cannot be captured in a CUDA "
        "graph; use grouped_mm (device-side offsets) inside graphs");
  }
}

}  // namespace

std::string run_list(const Target& t, const ListProblem& p) {
  if (p.groups.size() % ListProblem::kFields != 0 || p.c_align <= 0) {
    throw std::invalid_argument("run_list: malformed group fields");
  }
  ListMeta meta = list_meta(p);
  if (meta.busy_groups == 0) return "";
  DeviceScope scope(t.device);
  refuse_capture(t.stream);
  const Chosen chosen =
      choose(t, Family::kList, false, p.b_t, meta.tma_ok, meta.rows / meta.busy_groups);
  const KernelInfo& k = *chosen.info;
  const size_t groups = p.group_count();
  int64_t tiles = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t* in = p.group(g);
    tiles += cdiv(in[ListProblem::kM], k.block_m) * cdiv(in[ListProblem::kN], k.block_n);
    meta.words.push_back(tiles);  // the tile prefix follows the per-group words
  }
  require_int32_tiles(tiles);
  // One host buffer, one copy.
  const size_t meta_bytes = meta.words.size() * sizeof(int64_t);
  StreamBuffer device_meta(t.device, t.stream, meta_bytes);
  upload_async(t.stream, device_meta.ptr(), meta.words.data(), meta_bytes);
  ArgPack args;
  args.ptr(device_meta.ptr()).ptr(device_meta.ptr() + groups * kKernelFields * sizeof(int64_t));
  args.i32(static_cast<int64_t>(groups));
  launch_with_scratch(t, chosen, programs_for(chosen, tiles), args);
  return k.key;
}

std::string run_ragged_m(const Target& t, const RaggedMProblem& p) {
  if (p.rows == 0 || p.n == 0) return "";
  DeviceScope scope(t.device);
  // The tma kernel clips stores with a 2**30-row ragged descriptor (ragged.py).
  const bool tma_ok = tma_aligned_ptr(p.a) && tma_aligned_ptr(p.b) && tma_aligned_ptr(p.out) &&
                      tma_aligned_stride(p.lda) && tma_aligned_stride(p.ldb) &&
                      tma_aligned_stride(p.b_group_stride) && tma_aligned_stride(p.ldc) &&
                      p.rows <= (int64_t{1} << 30);
  const Chosen chosen =
      choose(t, Family::kRaggedM, false, p.b_t, tma_ok, p.rows / std::max<int64_t>(p.groups, 1));
  const KernelInfo& k = *chosen.info;
  // Each group boundary adds at most one partial m-tile; +1 for the rows past the last group.
  const int64_t tiles_bound = (cdiv(p.rows, k.block_m) + p.groups + 1) * cdiv(p.n, k.block_n);
  require_int32_tiles(tiles_bound);
  ArgPack args;
  args.ptr(p.a).ptr(p.b).ptr(p.out).ptr(p.offs);
  args.i32(p.rows).i32(p.n).i32(p.k).i32(p.groups);
  args.i64(p.lda).i64(p.b_group_stride).i64(p.ldb).i64(p.ldc);
  launch_with_scratch(t, chosen, programs_for(chosen, tiles_bound), args);
  return k.key;
}

std::string run_ragged_k(const Target& t, const RaggedKProblem& p) {
  if (p.m == 0 || p.n == 0 || p.groups == 0) return "";
  DeviceScope scope(t.device);
  // Row-major A has no tma variant (aot/variants.py says why); dispatch falls back.
  // Rows are clipped with 2**30-row ragged descriptors (ragged.py).
  const bool tma_ok = p.a_t && tma_aligned_ptr(p.a) && tma_aligned_ptr(p.b) &&
                      tma_aligned_ptr(p.out) && tma_aligned_stride(p.lda) &&
                      tma_aligned_stride(p.ldb) && tma_aligned_stride(p.n) &&
                      p.rows <= (int64_t{1} << 30);
  const Chosen chosen = choose(t, Family::kRaggedK, p.a_t, false, tma_ok, p.m);
  const KernelInfo& k = *chosen.info;
  const int64_t tiles = p.groups * cdiv(p.m, k.block_m) * cdiv(p.n, k.block_n);
  require_int32_tiles(tiles);
  ArgPack args;
  args.ptr(p.a).ptr(p.b).ptr(p.out).ptr(p.offs);
  args.i32(p.m).i32(p.n).i32(p.rows).i32(p.groups);
  args.i64(p.lda).i64(p.ldb);
  launch_with_scratch(t, chosen, programs_for(chosen, tiles), args);
  return k.key;
}

}  // namespace gg
