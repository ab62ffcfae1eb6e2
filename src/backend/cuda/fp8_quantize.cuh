#pragma once
// The per-token FP8 E4M3 activation quantization's arithmetic (core/fp8.h gives the host twins),
// shared by quantize_rows_kernel (fp8_kernels.cu) and the producers that quantize their own output
// (fp8_fused_kernels.cu), so that both round every value identically.
#include <cuda_fp8.h>

#include <cstdint>

namespace origami::cuda {

// A row's scale from the largest |value| of its bf16 elements.
__device__ __forceinline__ float fp8_row_scale(float amax) {
  const float s = amax / 448.0f;  // IEEE division, as the host's fp8_row_scale
  return s > 1.17549435e-38f ? s : 1.17549435e-38f;
}

// The E4M3 code of v under scale s: v / s rounded to nearest even, saturating.
__device__ __forceinline__ uint8_t fp8_code(float v, float s) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v / s, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace origami::cuda
