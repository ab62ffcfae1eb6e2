#pragma once
// Division by an integer fixed before a kernel runs (a page size), as a multiply-high, an add and
// a shift: Granlund and Montgomery, "Division by invariant integers using multiplication" (1994),
// with shift = ceil(log2 d) and mul = floor(2^32 (2^shift - d) / d) + 1. Exact for every
// numerator below 2^31 (the sum below then stays within 32 bits), which entry indices are.
// Header-only and usable on the host and in CUDA device code, so a CPU test can check it against
// plain division. The streamed FP8 decode attention divides four entries a thread a tile by the
// page size; a branch between a shift (powers of two) and a division (any other size) cost it 5-6
// instructions a row and a branch-resolve stall (docs/kernels.md, "A branch-free load path").
#include <cstdint>

#if defined(__CUDACC__)
#define ORIGAMI_INVARIANT_DIVIDER_HD __host__ __device__
#else
#define ORIGAMI_INVARIANT_DIVIDER_HD
#endif

namespace origami {

struct InvariantDivider {
  uint32_t mul = 1, shift = 0, divisor = 1;

  // d >= 1; anything smaller is taken as 1.
  static InvariantDivider make(int d) {
    InvariantDivider v;
    v.divisor = static_cast<uint32_t>(d < 1 ? 1 : d);
    while ((uint64_t{1} << v.shift) < v.divisor) ++v.shift;
    v.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << v.shift) - v.divisor)) / v.divisor + 1);
    return v;
  }

  // n / divisor for 0 <= n < 2^31.
  ORIGAMI_INVARIANT_DIVIDER_HD int divide(int n) const {
    const uint32_t u = static_cast<uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(u, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(u) * mul) >> 32);
#endif
    return static_cast<int>((hi + u) >> shift);
  }
};

}  // namespace origami
