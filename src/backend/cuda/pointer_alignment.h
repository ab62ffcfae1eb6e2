#pragma once
// Whether a device pointer is aligned to `bytes` (a power of two): the launchers pick their
// vectorized kernels (16-byte loads, 8-byte stores) by it and fall back to scalar ones otherwise.
#include <cstdint>

namespace origami::cuda {

inline bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

}  // namespace origami::cuda
