// Host time of four kernel launches against a four-node CUDA graph whose nodes are
// updated and launched (csrc/launch_group.h's way): nvcc -O2 -arch=sm_90 -o /tmp/lc
// lab/launch_cost.cu -lcuda && /tmp/lc.  Each row: 100 calls queued behind a GPU
// sleep, median (and least) of nine.
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
struct P {
  unsigned long long v[24];
};
__global__ void ka(P p) {
  if (p.v[0] == 12345 && threadIdx.x == 9999) ((int*)p.v[1])[0] = 1;
}
__global__ void kb(P p) {
  if (p.v[0] == 12346 && threadIdx.x == 9999) ((int*)p.v[1])[0] = 2;
}
__global__ void spin(long long cycles) {
  long long t = clock64();
  while (clock64() - t < cycles) {
  }
}
#define CK(x)                          \
  do {                                 \
    CUresult r = (x);                  \
    if (r) {                           \
      printf("err %d at %s\n", r, #x); \
      exit(1);                         \
    }                                  \
  } while (0)
int main() {
  cudaFree(0);
  CUfunction fa, fb;
  cudaGetFuncBySymbol((cudaFunction_t*)&fa, (void*)ka);
  cudaGetFuncBySymbol((cudaFunction_t*)&fb, (void*)kb);
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  P p{};
  void* params[] = {&p};
  auto direct = [&](int n) {
    for (int i = 0; i < n; ++i) {
      p.v[2] = i;
      CK(cuLaunchKernel(i % 2 ? fb : fa, 132, 1, 1, 256, 1, 1, 0, s, params, nullptr));
    }
  };
  // graph of 4 nodes in a chain
  CUgraph g;
  CK(cuGraphCreate(&g, 0));
  std::vector<CUgraphNode> nodes(4);
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = fa;
  kp.gridDimX = 132;
  kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 256;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = params;
  for (int i = 0; i < 4; ++i)
    CK(cuGraphAddKernelNode(&nodes[i], g, i ? &nodes[i - 1] : nullptr, i ? 1 : 0, &kp));
  CUgraphExec ge;
  CK(cuGraphInstantiate(&ge, g, 0));
  CK(cuGraphUpload(ge, s));
  auto graph = [&](bool set, bool swap) {
    if (set)
      for (int i = 0; i < 4; ++i) {
        p.v[2] = i;
        kp.func = swap && i % 2 ? fb : fa;
        kp.gridDimX = 100 + i;
        CK(cuGraphExecKernelNodeSetParams(ge, nodes[i], &kp));
      }
    CK(cuGraphLaunch(ge, s));
  };
  auto setonly = [&]() {
    for (int i = 0; i < 4; ++i) {
      p.v[2] = i;
      kp.func = i % 2 ? fb : fa;
      CK(cuGraphExecKernelNodeSetParams(ge, nodes[i], &kp));
    }
  };
  auto timed = [&](const char* name, auto fn) {
    for (int w = 0; w < 200; ++w) fn();
    cuStreamSynchronize(s);
    std::vector<double> t;
    for (int rep = 0; rep < 9; ++rep) {
      spin<<<1, 1, 0, (cudaStream_t)s>>>(40000000);
      auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < 100; ++it) fn();
      auto t1 = std::chrono::steady_clock::now();
      t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / 100);
      cuStreamSynchronize(s);
    }
    std::sort(t.begin(), t.end());
    printf("%-40s %.2f us (min %.2f)\n", name, t[4], t[0]);
  };
  for (int round = 0; round < 2; ++round) {
    timed("1 cuLaunchKernel", [&] { direct(1); });
    timed("4 cuLaunchKernel", [&] { direct(4); });
    timed("graph launch only", [&] { graph(false, false); });
    timed("4 SetParams (same func) + launch", [&] { graph(true, false); });
    timed("4 SetParams (func swap) + launch", [&] { graph(true, true); });
    timed("4 SetParams only", [&] { setonly(); });
  }
  return 0;
}
