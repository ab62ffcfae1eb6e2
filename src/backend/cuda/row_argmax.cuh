#pragma once
// The greedy choice over one row of logits by one thread block, as sampling/sampler.h defines it:
// the largest logit, NaN counting as -inf, ties to the lowest id. Shared by the sampling kernel
// (the whole vocabulary) and tensor parallelism's per-shard argmax (tensor_parallel_kernels.h).
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/row_loads.cuh"

namespace origami::cuda {

// (logit, id) beats (other logit, other id): larger logit, ties to the lower id.
__device__ __forceinline__ bool argmax_beats(float v, int id, float other_v, int other_id) {
  return v > other_v || (v == other_v && id < other_id);
}

// The best (best, id) of the warp's lanes by argmax_beats, in every lane (a total order, so every
// lane ends with the same pair).
__device__ __forceinline__ void warp_argmax(float& best, int& id) {
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, off);
    const int other = __shfl_xor_sync(0xffffffffu, id, off);
    if (argmax_beats(v, other, best, id)) {
      best = v;
      id = other;
    }
  }
}

// The best of row[0, n) by argmax_beats, valid in thread 0: *best_logit (NaN read as -inf) and
// *best_id (0x7fffffff when every entry is -inf or NaN). `red_val` / `red_idx` hold one entry per
// warp of the block.
__device__ __forceinline__ void block_row_argmax(const float* __restrict__ row, int n, float* red_val, int* red_idx,
                                                 float* best_logit, int* best_id) {
  float best = -INFINITY;
  int id = 0x7fffffff;
  // argmax_beats is a total order on (logit, id), so the visiting order does not change the result.
  for_each_row_value(row, n, [&](float x, int i) {
    const float l = isnan(x) ? -INFINITY : x;
    if (argmax_beats(l, i, best, id)) {
      best = l;
      id = i;
    }
  });
  warp_argmax(best, id);
  if ((threadIdx.x & 31) == 0) {
    red_val[threadIdx.x >> 5] = best;
    red_idx[threadIdx.x >> 5] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int warps = (blockDim.x + 31) >> 5;
    for (int w = 0; w < warps; ++w)
      if (argmax_beats(red_val[w], red_idx[w], best, id)) {
        best = red_val[w];
        id = red_idx[w];
      }
    *best_logit = best;
    *best_id = id;
  }
}

}  // namespace origami::cuda
