// What the fp8 operators (scaled_grouped_mm, quantize_fp8) share: the element
// type, the scale block, and the one rule for where their kernels exist.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "op_support.h"

namespace gg::ops {

inline constexpr ScalarType kFp8 = ScalarType::Float8_e4m3fn;
// Elements along each side of a scale block: the kernels' (aot/kernels/quantize.py).
inline constexpr int64_t kBlock = family::QuantizeFp8::kBlock;
// Bytes (= fp8 elements): TMA's rule for bases and strides, which torch also keeps for fp8.
inline constexpr int64_t kAlign = 16;

// x packed and 16-byte aligned (a copy where it is not), for kernels that
// copy its rows 16 bytes at a time.
inline Tensor packed_aligned(const Tensor& x) {
  const Tensor packed = dense(x);
  return address(packed) % kAlign == 0 ? packed : fresh_copy(packed);
}

// Scale blocks covering `size` (>= 0) elements.
inline int64_t blocks(int64_t size) { return (size + kBlock - 1) / kBlock; }

// Runs `launch`; where it finds no fp8 kernel for this GPU, the error says why.
// Only UnsupportedDeviceError (run()'s tagged runtime_error) is rewritten.
template <typename Launch>
void sm90_only(Launch&& launch) {
  try {
    launch();
  } catch (const std::runtime_error& error) {
    const std::string what = error.what();
    if (what.rfind(kUnsupportedDeviceTag, 0) != 0) throw;
    throw std::runtime_error(
        what + " (fp8 kernels are built for compute capability 9.0, H100 and H200, only)");
  }
}

}  // namespace gg::ops
