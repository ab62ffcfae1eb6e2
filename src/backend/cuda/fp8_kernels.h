#pragma once
// FP8 E4M3 conversion kernels (core/fp8.h gives the host twins, bit for bit).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

// Per row of x [rows, cols] (bf16): scale = fp8_row_scale(amax(|row|)), or *static_scale for
// every row when it is not null; codes = E4M3(x / scale), rounded to nearest even, saturating.
// Activations (a row per token, before each FP8 GEMM) and, at load, weights (a row per output
// channel). cols must be a multiple of 8.
void launch_quantize_rows_fp8(const __nv_bfloat16* x, int rows, int cols, const float* static_scale, uint8_t* codes,
                              float* scales, cudaStream_t stream);

// y[i, j] = acc[i, j] * row_scale[i] * col_scale[j] as bf16: the per-token and per-channel
// scaling of an FP8 GEMM whose library lacks outer-vector scales (acc: its fp32 result).
void launch_scale_fp8_product(const float* acc, int rows, int cols, const float* row_scale, const float* col_scale,
                              __nv_bfloat16* y, cudaStream_t stream);

// The same for a product split along K into `splits` fp32 partials, acc [splits, rows, cols]:
// y[i, j] = (acc[0, i, j] + ... + acc[splits - 1, i, j]) * row_scale[i] * col_scale[j], the partials
// added in split order (the result does not depend on the launch). Fp8Gemm's split-K path.
void launch_sum_scale_fp8_partials(const float* acc, int splits, int rows, int cols, const float* row_scale,
                                   const float* col_scale, __nv_bfloat16* y, cudaStream_t stream);

}  // namespace origami::cuda
