#pragma once
// FP8 products of a few rows on the tensor cores: y[m, n] = (x[m, k] . w[n, k]^T) * x_scale[i] *
// w_scale[j] for 1 <= m <= kFp8SmallGemmMaxRows, the product and scales of Fp8Gemm::linear (E4M3
// codes, K-major, per token and per channel fp32 scales, bf16 y).
//
// Why: decode batches of 3-16 sequences only stream the weights, and neither path serves them at
// the memory's speed. The GEMV (fp8_gemv.h) multiplies every row again on the CUDA cores, slower
// than cuBLASLt from 3 rows; cuBLASLt's FP8 kernels (the heuristic's `nvjet` tiles, the only ones
// it runs for FP8 on the H100: docs/kernels.md) use 128-wide output tiles, so the o and down
// projections of an 8B model get 32 CTAs for 132 SMs and reach ~72% of the copy bandwidth. Here
// a CTA owns 16 output channels and its eight warps split K four ways (n / 16 CTAs: 256 for a
// 4096-wide projection), each warp streaming 64-byte chunks of its 8 channels' rows (16 bytes a
// lane, two chunks' loads in flight) into mma.sync m16n8k32 E4M3 instructions whose 16 A rows hold
// the m rows of x (the rest zero). The head dimension order inside a chunk is permuted the same
// way for A and B (a dot product does not care), so that each lane's 16 contiguous bytes are its
// fragments of two MMAs.
//
// Measured on the H100 it is correct and slower: a Llama-3.1-8B layer's projections 0.81-0.83x of
// cuBLASLt's time at 1-16 rows (down at 46% of its bytes' floor: too few bytes in flight per SM),
// so BackendOptions::fp8_small_gemm_rows keeps it off (docs/kernels.md).
//
// Accumulation: each MMA starts from zero and its result is added to fp32 registers (the sum of 32
// products is the tensor core's; every sum of those is fp32), the way cuBLASLt's default
// ("promoted") FP8 path bounds the tensor cores' short accumulator, here every 32 codes instead of
// every few hundred. The four K slices are summed in a fixed order through shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

constexpr int kFp8SmallGemmMaxRows = 16;  // one MMA's A rows

// Whether launch_fp8_small_gemm serves this product: 1 <= m <= kFp8SmallGemmMaxRows, k a
// multiple of 64 (the chunk four lanes read), x and w 16-byte aligned.
bool fp8_small_gemm_supported(int m, int k, const void* x, const void* w);

void launch_fp8_small_gemm(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w,
                           const float* w_scales, int n, __nv_bfloat16* y, cudaStream_t stream);

}  // namespace origami::cuda
