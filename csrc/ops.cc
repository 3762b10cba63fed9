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

bool list_tma_ok(const ListProblem& p) {
  for (size_t g = 0; g < p.a.size(); ++g) {
    if (p.m[g] == 0 || p.n[g] == 0) continue;  // no tile ever touches this group
    if (!tma_aligned_ptr(p.a[g]) || !tma_aligned_ptr(p.b[g]) || !tma_aligned_ptr(p.c[g]) ||
        !tma_aligned_stride(p.lda[g]) || !tma_aligned_stride(p.ldb[g]) ||
        !tma_aligned_stride(p.ldc[g])) {
      return false;
    }
  }
  return true;
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
  const size_t groups = p.a.size();
  int64_t rows = 0, busy = 0;
  for (size_t g = 0; g < groups; ++g) {
    if (std::max({p.m[g], p.n[g], p.k[g]}) > std::numeric_limits<int32_t>::max()) {
      throw std::invalid_argument("group " + std::to_string(g) + ": a dimension exceeds 2**31 - 1");
    }
    if (p.m[g] > 0 && p.n[g] > 0) rows += p.m[g], ++busy;
  }
  if (busy == 0) return "";
  DeviceScope scope(t.device);
  refuse_capture(t.stream);
  const Chosen chosen = choose(t, Family::kList, false, p.b_t, list_tma_ok(p), rows / busy);
  const KernelInfo& k = *chosen.info;

  // One host buffer, one copy: FIELDS int64 per group, then the tile prefix.
  constexpr size_t kFields = 9;
  std::vector<int64_t> meta(groups * (kFields + 1));
  int64_t tiles = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t row[kFields] = {static_cast<int64_t>(p.a[g]), static_cast<int64_t>(p.b[g]),
                                  static_cast<int64_t>(p.c[g]), p.m[g], p.n[g], p.k[g],
                                  p.lda[g], p.ldb[g], p.ldc[g]};
    std::copy(row, row + kFields, meta.begin() + g * kFields);
    tiles += cdiv(p.m[g], k.block_m) * cdiv(p.n[g], k.block_n);
    meta[groups * kFields + g] = tiles;
  }
  require_int32_tiles(tiles);
  const size_t meta_bytes = meta.size() * sizeof(int64_t);
  StreamBuffer device_meta(t.device, t.stream, meta_bytes);
  upload_async(t.stream, device_meta.ptr(), meta.data(), meta_bytes);
  ArgPack args;
  args.ptr(device_meta.ptr()).ptr(device_meta.ptr() + groups * kFields * sizeof(int64_t));
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
