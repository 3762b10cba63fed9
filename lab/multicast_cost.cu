// The load path of a 2-CTA ragged_m program alone, in CUDA (no Triton): does TMA
// multicast of B's block pay on this GPU, issued the way each kernel would issue it?
//   nvcc -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/mc lab/multicast_cost.cu && /tmp/mc [CTAS]
// Each CTA streams K blocks through a ring of STAGES slots: its own A block ([128, 64]
// bf16, 16 KiB) and B's block ([256, 64], 32 KiB), one loader thread issuing TMA, one
// consumer thread waiting for each slot and freeing it (no MMA).  Modes, for B:
//   own:       each CTA of the pair loads B's block itself (twice the L2 reads);
//   cta0:      CTA 0 multicasts the whole block into both CTAs (Triton 3.9 Gluon's way);
//   halves:    each CTA multicasts half of it into both (CUTLASS's way);
//   own_met:   as own, but each slot freed by both CTAs' consumers, as multicast needs;
//   one_cta:   no cluster, one CTA per SM as the shipped one-CTA kernel (A [128, 64]
//              and B [256, 64] per slot: the same bytes per CTA).
// Where a slot is filled by multicast, its `empty` barrier in each CTA counts both CTAs'
// consumers, so the loader refills it only when both have read it.  B's blocks cycle
// over a weight of N_ROWS x K (as one expert's weights are re-read by its m-tiles), A's
// over A_TOTAL_ROWS rows: 16 MiB in all, resident in L2, so that the load path from L2
// is measured, not DRAM.  Each mode runs with the ring's waits and cross-CTA arrivals at
// cluster scope (what Triton 3.9 emits around a multicast copy) and at CTA scope.
// Prints us per K block and TB/s landed in shared memory, best of five runs.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <vector>

#define CK(x)                                                     \
  do {                                                            \
    auto r = (x);                                                 \
    if (r) {                                                      \
      printf("error %d at %s:%d: %s\n", (int)r, __FILE__, __LINE__, #x); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

constexpr int BK = 64, A_ROWS = 128, B_ROWS = 256, STAGES = 4;
constexpr int A_BYTES = A_ROWS * BK * 2, B_BYTES = B_ROWS * BK * 2;
constexpr int K = 2048, N_ROWS = 2048, A_TOTAL_ROWS = 2048;
enum Mode { OWN = 0, CTA0 = 1, HALVES = 2, ONE_CTA = 3, OWN_MET = 4 };

__device__ __forceinline__ uint32_t smem(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive; barrier.cluster.wait;" ::: "memory");
}
// CLUSTER_SCOPE: the barriers' waits acquire and their remote arrivals release at
// cluster scope (what Triton 3.9 emits), else at the default CTA scope (CUTLASS's
// ClusterBarrier).
template <bool CLUSTER_SCOPE>
__device__ __forceinline__ void wait(uint32_t bar, uint32_t parity) {
  if (CLUSTER_SCOPE)
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;"
        " @!p bra W; }" ::"r"(bar),
        "r"(parity)
        : "memory");
  else
    asm volatile(
        "{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;"
        " @!p bra W; }" ::"r"(bar),
        "r"(parity)
        : "memory");
}
template <bool CLUSTER_SCOPE>
__device__ __forceinline__ void arrive_in(uint32_t bar, uint32_t cta) {
  if (CLUSTER_SCOPE)
    asm volatile(
        "{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1;"
        " mbarrier.arrive.release.cluster.shared::cluster.b64 _, [r]; }" ::"r"(bar),
        "r"(cta)
        : "memory");
  else
    asm volatile(
        "{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1;"
        " mbarrier.arrive.shared::cluster.b64 _, [r]; }" ::"r"(bar),
        "r"(cta)
        : "memory");
}
__device__ __forceinline__ void expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void load(uint32_t dst, const CUtensorMap* map, int x, int y,
                                     uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void multicast(uint32_t dst, const CUtensorMap* map, int x, int y,
                                          uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar), "h"(mask)
      : "memory");
}

struct __align__(1024) Ring {
  uint8_t a[STAGES][A_BYTES];
  uint8_t b[STAGES][B_BYTES];
  uint64_t full[STAGES], empty[STAGES];
};

template <int MODE, bool CLUSTER_SCOPE>
__global__ void __launch_bounds__(64) stream(const __grid_constant__ CUtensorMap a_map,
                                             const __grid_constant__ CUtensorMap b_map,
                                             const __grid_constant__ CUtensorMap half_map,
                                             int blocks) {
  extern __shared__ __align__(1024) uint8_t raw[];
  Ring& ring = *reinterpret_cast<Ring*>(raw);
  const bool clustered = MODE != ONE_CTA;
  const uint32_t rank = clustered ? cta_rank() : 0;
  const bool met = MODE == CTA0 || MODE == HALVES || MODE == OWN_MET;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem(&ring.full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem(&ring.empty[s])),
                   "r"(met ? 2 : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (clustered)
    cluster_sync();
  else
    __syncthreads();
  const int program = clustered ? blockIdx.x / 2 : blockIdx.x;
  const int b_row = (program % (N_ROWS / B_ROWS)) * B_ROWS;
  const int a_row = (program * (clustered ? 2 : 1) + rank) * A_ROWS % A_TOTAL_ROWS;
  if (threadIdx.x == 0) {  // loader
    for (int i = 0; i < blocks; ++i) {
      const int s = i % STAGES, k = (i * BK) % K;
      wait<CLUSTER_SCOPE>(smem(&ring.empty[s]), ((i / STAGES) & 1) ^ 1);
      const uint32_t full = smem(&ring.full[s]);
      expect(full, A_BYTES + B_BYTES);
      load(smem(ring.a[s]), &a_map, k, a_row, full);
      if (MODE == CTA0) {
        if (rank == 0) multicast(smem(ring.b[s]), &b_map, k, b_row, full, 3);
      } else if (MODE == HALVES) {
        multicast(smem(ring.b[s]) + rank * (B_BYTES / 2), &half_map, k,
                  b_row + rank * (B_ROWS / 2), full, 3);
      } else {
        load(smem(ring.b[s]), &b_map, k, b_row, full);
      }
    }
  } else if (threadIdx.x == 32) {  // consumer
    for (int i = 0; i < blocks; ++i) {
      const int s = i % STAGES;
      wait<CLUSTER_SCOPE>(smem(&ring.full[s]), (i / STAGES) & 1);
      const uint32_t empty = smem(&ring.empty[s]);
      if (met) {
        arrive_in<CLUSTER_SCOPE>(empty, 0);
        arrive_in<CLUSTER_SCOPE>(empty, 1);
      } else {
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(empty) : "memory");
      }
    }
  }
  if (clustered) cluster_sync();  // no CTA exits while its peer may still signal it
}

static PFN_cuTensorMapEncodeTiled_v12000 encode;

static CUtensorMap map_of(void* base, int rows, int box_rows) {
  CUtensorMap map;
  cuuint64_t dims[2] = {K, (cuuint64_t)rows};
  cuuint64_t strides[1] = {K * 2};
  cuuint32_t box[2] = {BK, (cuuint32_t)box_rows};
  cuuint32_t element_strides[2] = {1, 1};
  CK(encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box,
            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
  return map;
}

template <int MODE, bool CLUSTER_SCOPE>
static float run(const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& half, int sms,
                 int blocks) {
  auto kernel = stream<MODE, CLUSTER_SCOPE>;
  const int bytes = sizeof(Ring);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster[1];
  cluster[0].id = cudaLaunchAttributeClusterDimension;
  cluster[0].val.clusterDim.x = MODE == ONE_CTA ? 1 : 2;
  cluster[0].val.clusterDim.y = cluster[0].val.clusterDim.z = 1;
  config.gridDim = dim3(sms / 2 * 2);
  config.blockDim = dim3(64);
  config.dynamicSmemBytes = bytes;
  config.attrs = cluster;
  config.numAttrs = 1;
  cudaEvent_t start, stop;
  CK(cudaEventCreate(&start));
  CK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int r = 0; r < 6; ++r) {
    CK(cudaEventRecord(start));
    CK(cudaLaunchKernelEx(&config, kernel, a, b, half, blocks));
    CK(cudaEventRecord(stop));
    CK(cudaEventSynchronize(stop));
    float ms;
    CK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) best = std::min(best, ms);
  }
  CK(cudaGetLastError());
  return best;
}

// Every mode with the barriers at one scope, printed one line each.
template <bool CLUSTER_SCOPE>
static void report(const CUtensorMap& a, const CUtensorMap& b, const CUtensorMap& half, int sms,
                   int blocks) {
  const char* names[] = {"own", "cta0", "halves", "one_cta", "own_met"};
  const float ms[] = {run<OWN, CLUSTER_SCOPE>(a, b, half, sms, blocks),
                      run<CTA0, CLUSTER_SCOPE>(a, b, half, sms, blocks),
                      run<HALVES, CLUSTER_SCOPE>(a, b, half, sms, blocks),
                      run<ONE_CTA, CLUSTER_SCOPE>(a, b, half, sms, blocks),
                      run<OWN_MET, CLUSTER_SCOPE>(a, b, half, sms, blocks)};
  const double landed = double(sms / 2 * 2) * blocks * (A_BYTES + B_BYTES);
  for (int m = 0; m < 5; ++m)
    printf("%-8s %-7s %8.3f ms  %6.3f us per K block  %6.2f TB/s landed in shared memory\n",
           names[m], CLUSTER_SCOPE ? "cluster" : "cta", ms[m], 1e3 * ms[m] / blocks,
           landed / (ms[m] * 1e-3) / 1e12);
}

int main(int argc, char** argv) {
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000,
                                      cudaEnableDefault, &q));
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (argc > 1) sms = std::min(sms, atoi(argv[1]));  // CTAs to launch (default: one per SM)
  void *a_base, *b_base;
  CK(cudaMalloc(&a_base, size_t(A_TOTAL_ROWS) * K * 2));
  CK(cudaMalloc(&b_base, size_t(N_ROWS) * K * 2));
  CK(cudaMemset(a_base, 1, size_t(A_TOTAL_ROWS) * K * 2));
  CK(cudaMemset(b_base, 1, size_t(N_ROWS) * K * 2));
  const CUtensorMap a = map_of(a_base, A_TOTAL_ROWS, A_ROWS);
  const CUtensorMap b = map_of(b_base, N_ROWS, B_ROWS);
  const CUtensorMap half = map_of(b_base, N_ROWS, B_ROWS / 2);
  const int blocks = 4096;
  printf("%d CTAs, %d K blocks per CTA, ring of %d x (%d + %d) bytes\n", sms, blocks, STAGES,
         A_BYTES, B_BYTES);
  for (int round = 0; round < (argc > 1 ? 1 : 2); ++round) {
    report<true>(a, b, half, sms, blocks);
    report<false>(a, b, half, sms, blocks);
  }
  return 0;
}
