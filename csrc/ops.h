// The three operations the Python layer calls.  Each takes raw device pointers,
// sizes and strides (already validated by gg_runtime), picks a variant, packs
// that family's arguments and launches on the caller's stream.  Each returns
// the key of the variant it ran (empty when there was nothing to launch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_abi.h"
#include "registry.h"

namespace gg {

struct Target {
  int device;
  cu::Stream stream;
  DType dtype;
  bool allow_tma;         // false forces the `basic` flavour (tests, debugging)
  std::string variant;    // non-empty: run exactly this variant key (tests)
};

// C_g = A_g @ B_g for independent groups (the tutorial's problem).
struct ListProblem {
  enum Field : size_t { kA, kB, kM, kN, kK, kLda, kLdb, kFields };  // per group; kA, kB: pointers
  bool b_t;
  std::vector<int64_t> groups;  // kFields per group
  // The C_g lie back to back from c_base, each contiguous (ldc = N) and starting
  // at a multiple of c_align elements (gg_runtime/raw.py _list_outputs).
  uint64_t c_base;
  int64_t c_align;

  size_t group_count() const { return groups.size() / kFields; }
  const int64_t* group(size_t g) const { return groups.data() + g * kFields; }
};
std::string run_list(const Target& target, const ListProblem& p);

// out[T, N]: rows of group g times b[g] ([K, N], or [N, K] stored when b_t).
struct RaggedMProblem {
  bool b_t;
  uint64_t a, b, out, offs;
  int64_t rows, n, k, groups;
  int64_t lda, b_group_stride, ldb, ldc;
};
std::string run_ragged_m(const Target& target, const RaggedMProblem& p);

// out[G, M, N]: out[g] = a[:, rows of g] @ b[rows of g]; a is [M, T] ([T, M] stored when a_t).
struct RaggedKProblem {
  bool a_t;
  uint64_t a, b, out, offs;
  int64_t m, n, rows, groups;
  int64_t lda, ldb;
};
std::string run_ragged_k(const Target& target, const RaggedKProblem& p);

}  // namespace gg
