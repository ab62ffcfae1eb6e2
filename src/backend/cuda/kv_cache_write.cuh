#pragma once
// Device helpers of the paged KV write, shared by kv_cache_write.cu's kernels and the KV write
// fused into the QK-norm + RoPE kernel (elementwise_kernels.cu), so that both address the cache
// and round to FP8 the same way (bit-exact with the CPU emulation, kv/kv_cache_dtype.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_cache_write.h"
#include "kv/kv_cache_dtype.h"

namespace origami::cuda {

// Element offset, in the layer's K (or V) cache, of the row of (token, head): the token's slot
// (its head group's slot when ragged) through KVWriteArgs' layout. -1 when the slot is negative
// (a padding row: nothing is written). The FP8 scale of the row sits at this offset / head_dim.
__device__ __forceinline__ long long kv_cache_row_offset(const KVWriteArgs& a, long long token, int head) {
  const bool ragged = a.head_table != nullptr;
  const int slot = a.slot_mapping[ragged ? a.head_table[head] * static_cast<long long>(a.num_tokens) + token : token];
  if (slot < 0) return -1;
  const long long block = slot / a.block_size;
  const int offset = slot % a.block_size;
  return ragged ? block * a.page_stride + (static_cast<long long>(a.head_slot[head]) * a.block_size + offset) * a.head_dim
                : ((block * a.num_kv_heads + head) * a.block_size + offset) * a.head_dim;
}

// One warp stores one head row as FP8: lane `lane` holds elements lane + 32 i (i < per_lane <= N)
// in x. The row's amax comes from a butterfly of shuffles (max is exact in any order), then every
// lane quantizes and stores its codes and lane 0 the scale. All 32 lanes must call it.
template <int N>
__device__ __forceinline__ void kv_fp8_store_row_warp(const float (&x)[N], int per_lane, int lane, uint8_t* codes,
                                                      float* scale_out) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < per_lane) amax = fmaxf(amax, fabsf(x[i]));
  for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
  const float scale = kv_fp8_scale(amax);
#pragma unroll
  for (int i = 0; i < N; ++i)
    if (i < per_lane) codes[i * 32 + lane] = kv_fp8_quantize(x[i], scale);
  if (lane == 0) *scale_out = scale;
}

}  // namespace origami::cuda
