#pragma once
// The arithmetic of the element-wise kernels that feed projections: the residual add + RMSNorm of
// one row per block (launch_add_rmsnorm) and the SiLU-and-multiply of one element
// (launch_silu_and_mul), shared with their FP8-quantizing twins (fp8_fused_kernels.cu) so that
// both produce the same bf16 values bit for bit (same operations, order and reduction tree).
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/block_reduce.cuh"

namespace origami::cuda {

// Threads of every add_rmsnorm block: the sum of squares' reduction tree, and so the rounding of
// the row's inv_rms, depends on it.
constexpr int kNormThreads = 256;

// Which add_rmsnorm kernel a row of `hidden` takes: the register-resident one with this many
// 8-element chunks per thread (1, 2 or 4), or 0 for the scalar one. `aligned`: every row pointer
// is 16-byte aligned. The two sum the squares in different orders, so a twin must pick the same.
inline int add_rmsnorm_vec_chunks(int hidden, bool aligned) {
  if (hidden % 8 != 0 || !aligned) return 0;
  const int chunks = hidden / 8;
  return chunks <= kNormThreads ? 1 : chunks <= 2 * kNormThreads ? 2 : chunks <= 4 * kNormThreads ? 4 : 0;
}

// The normalised element: x * inv_rms * weight, in this order, in fp32. (The add_rmsnorm and
// silu_and_mul kernels spell this and silu_times inline, marked with the helper's name: calling
// the helper moves a multiply in their PTX, and their code is kept as it was.)
__device__ __forceinline__ float rmsnorm_scaled(float x, float inv_rms, float weight) { return x * inv_rms * weight; }

// Scalar form (any hidden): residual[base + i] += delta[base + i] (delta not null, written back),
// then the row's 1 / rms. The normalised element i is then
// rmsnorm_scaled(residual[base + i], inv_rms, weight[i]). Every thread of the block calls it.
__device__ __forceinline__ float add_rmsnorm_row(float* __restrict__ residual, const __nv_bfloat16* __restrict__ delta,
                                                 float eps, int hidden, size_t base, float* scratch) {
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    float r = residual[base + i];
    if (delta != nullptr) {
      r += __bfloat162float(delta[base + i]);
      residual[base + i] = r;
    }
    sum_sq += r * r;
  }
  return rsqrtf(block_sum(sum_sq, scratch) / hidden + eps);
}

// Register-resident form (hidden % 8 == 0, 16-byte aligned rows, kNormThreads threads): each
// thread loads its 8-element chunks c = threadIdx.x + j * kNormThreads (16-byte loads, all issued
// before the first use) once; x[j] holds chunk j's residual after the add (written back when
// delta is not null) and w[j] its 8 bf16 weights. Returns the row's 1 / rms.
template <int kChunks>
__device__ __forceinline__ float add_rmsnorm_row_vec(float* __restrict__ residual, const __nv_bfloat16* __restrict__ delta,
                                                     const __nv_bfloat16* __restrict__ weight, float eps, int hidden,
                                                     size_t base, float (&x)[kChunks][8], uint4 (&w)[kChunks],
                                                     float* scratch) {
  const int num_chunks = hidden / 8;
  uint4 d[kChunks];
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kNormThreads;
    if (c >= num_chunks) continue;
    const float4* r = reinterpret_cast<const float4*>(residual + base) + 2 * c;
    const float4 r0 = r[0], r1 = r[1];
    x[j][0] = r0.x; x[j][1] = r0.y; x[j][2] = r0.z; x[j][3] = r0.w;
    x[j][4] = r1.x; x[j][5] = r1.y; x[j][6] = r1.z; x[j][7] = r1.w;
    if (delta != nullptr) d[j] = reinterpret_cast<const uint4*>(delta + base)[c];
    w[j] = reinterpret_cast<const uint4*>(weight)[c];
  }
  float sum_sq = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kNormThreads;
    if (c >= num_chunks) continue;
    if (delta != nullptr) {
      const __nv_bfloat16* dv = reinterpret_cast<const __nv_bfloat16*>(&d[j]);
#pragma unroll
      for (int k = 0; k < 8; ++k) x[j][k] += __bfloat162float(dv[k]);
      float4* r = reinterpret_cast<float4*>(residual + base) + 2 * c;
      r[0] = make_float4(x[j][0], x[j][1], x[j][2], x[j][3]);
      r[1] = make_float4(x[j][4], x[j][5], x[j][6], x[j][7]);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) sum_sq += x[j][k] * x[j][k];
  }
  return rsqrtf(block_sum(sum_sq, scratch) / hidden + eps);
}

// silu(g) * u in fp32 (the caller rounds it to bf16).
__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.0f + __expf(-g)) * u; }

}  // namespace origami::cuda
