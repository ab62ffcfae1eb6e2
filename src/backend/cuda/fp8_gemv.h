#pragma once
// FP8 GEMV for decode's few rows: y[m, n] = (x[m, k] . w[n, k]^T) * x_scale[i] * w_scale[j] for
// m <= kFp8GemvMaxRows, the same product and scales as Fp8Gemm::linear (E4M3 codes, K-major, per
// token and per channel fp32 scales, bf16 y). At batch 1-4 the FP8 GEMMs only stream the weights:
// cuBLASLt's tensor-core tiles reach 56-65% of the copy bandwidth there (the batch-1 decode step at
// 57% of its floor, docs/kernels.md), while a warp per two output channels reading 16-byte chunks
// of their rows keeps the memory system busy with nothing to wait on but the loads. Products of
// two E4M3 values are exact in fp32 and are summed in fp32 (per lane, then a warp's shuffle tree):
// closer to the CPU's emulation (fp32 sums of the dequantized products) than either cuBLASLt
// accumulation.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

constexpr int kFp8GemvMaxRows = 4;
// The rows up to which the GEMV runs by default (BackendOptions::fp8_gemv_rows): on the H100 it is
// faster than cuBLASLt's FP8 GEMM at 1 and 2 rows (a Llama-3.1-8B layer's projections 1.14x and
// 1.05x), not at 3 and 4 (0.98x, 0.82x: each row reads the weights' chunk again from L1, and the
// tensor cores' tiles amortise it; docs/kernels.md).
constexpr int kFp8GemvFasterRows = 2;

// Whether launch_fp8_gemv serves this product: 1 <= m <= kFp8GemvMaxRows, k a multiple of 16, x
// and w 16-byte aligned (their rows are read 16 codes at a time).
bool fp8_gemv_supported(int m, int k, const void* x, const void* w);

void launch_fp8_gemv(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w, const float* w_scales,
                     int n, __nv_bfloat16* y, cudaStream_t stream);

}  // namespace origami::cuda
