#pragma once
// Sums (and maxima) across a warp and across a thread block, for the kernels that normalize a row
// per block (the RMS norms of elementwise_kernels.cu, the fused all-reduce of peer_all_reduce.cu)
// and those that quantize it (fp8_fused_kernels.cu).
#include <cuda_runtime.h>

namespace origami::cuda {

__device__ __forceinline__ float warp_sum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp. Safe to
// call repeatedly with the same scratch (it waits for the previous call's readers).
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < num_warps; ++w) total += scratch[w];
  return total;
}

// Maximum over the block; every thread gets the result. Same scratch contract as block_sum.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = (blockDim.x + 31) >> 5;
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < num_warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

}  // namespace origami::cuda
