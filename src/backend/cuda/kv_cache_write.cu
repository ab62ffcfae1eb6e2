// Scatter of new K/V rows into the paged cache; see kv_cache_write.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_cache_write.h"
#include "kv/kv_cache_dtype.h"

namespace origami::cuda {
namespace {

// One thread per 16-byte piece of a (token, head) row: consecutive threads write consecutive
// pieces of one cache row, so stores coalesce whatever the slot order.
__global__ void write_kv_cache_kernel(const KVWriteArgs a) {
  const int chunks_per_row = a.head_dim / 8;
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long total = static_cast<long long>(a.num_tokens) * a.num_kv_heads * chunks_per_row;
  if (idx >= total) return;
  const int chunk = static_cast<int>(idx % chunks_per_row);
  const long long row = idx / chunks_per_row;  // token * num_kv_heads + head
  const int head = static_cast<int>(row % a.num_kv_heads);
  const long long token = row / a.num_kv_heads;
  const bool ragged = a.head_table != nullptr;
  const int slot = a.slot_mapping[ragged ? a.head_table[head] * static_cast<long long>(a.num_tokens) + token : token];
  if (slot < 0) return;
  const long long block = slot / a.block_size;
  const int offset = slot % a.block_size;
  const long long dst =
      ragged ? block * a.page_stride + (static_cast<long long>(a.head_slot[head]) * a.block_size + offset) * a.head_dim +
                   chunk * 8
             : ((block * a.num_kv_heads + head) * a.block_size + offset) * a.head_dim + chunk * 8;
  const long long src = row * a.head_dim + chunk * 8;
  *reinterpret_cast<uint4*>(a.k_cache + dst) = *reinterpret_cast<const uint4*>(a.k + src);
  *reinterpret_cast<uint4*>(a.v_cache + dst) = *reinterpret_cast<const uint4*>(a.v + src);
}

// One warp per (token, head) row, K and V: each lane holds head_dim / 32 elements (at most 8),
// the row's amax comes from a butterfly of shuffles, then every lane quantizes and stores its
// codes. The scale math is kv/kv_cache_dtype.h's, shared with the CPU emulation.
__global__ void write_kv_cache_fp8_kernel(const KVWriteArgs a, const KVWriteFp8Out out) {
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<long long>(a.num_tokens) * a.num_kv_heads) return;
  const int head = static_cast<int>(row % a.num_kv_heads);
  const long long token = row / a.num_kv_heads;
  const bool ragged = a.head_table != nullptr;
  const int slot = a.slot_mapping[ragged ? a.head_table[head] * static_cast<long long>(a.num_tokens) + token : token];
  if (slot < 0) return;  // uniform over the warp
  const long long block = slot / a.block_size;
  const int offset = slot % a.block_size;
  const long long dst =
      ragged ? block * a.page_stride + (static_cast<long long>(a.head_slot[head]) * a.block_size + offset) * a.head_dim
             : ((block * a.num_kv_heads + head) * a.block_size + offset) * a.head_dim;
  const int per_lane = a.head_dim / 32;
  for (int kv = 0; kv < 2; ++kv) {
    const __nv_bfloat16* src = (kv == 0 ? a.k : a.v) + row * a.head_dim;
    float x[8];
    float amax = 0.0f;
    for (int i = 0; i < per_lane; ++i) {
      x[i] = __bfloat162float(src[i * 32 + lane]);
      amax = fmaxf(amax, fabsf(x[i]));
    }
    for (int m = 16; m > 0; m >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float scale = kv_fp8_scale(amax);
    uint8_t* codes = (kv == 0 ? out.k_codes : out.v_codes) + dst;
    for (int i = 0; i < per_lane; ++i) codes[i * 32 + lane] = kv_fp8_quantize(x[i], scale);
    if (lane == 0) (kv == 0 ? out.k_scales : out.v_scales)[dst / a.head_dim] = scale;
  }
}

}  // namespace

cudaError_t write_kv_cache_fp8(const KVWriteArgs& args, const KVWriteFp8Out& out, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.num_kv_heads <= 0 || args.block_size <= 0 || args.head_dim < 32 ||
      args.head_dim > 256 || args.head_dim % 32 != 0 || !out.k_codes || !out.v_codes || !out.k_scales ||
      !out.v_scales ||
      (args.head_table != nullptr && (args.head_slot == nullptr || args.page_stride <= 0 ||
                                      args.page_stride % args.head_dim != 0)))
    return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  const long long threads = static_cast<long long>(args.num_tokens) * args.num_kv_heads * 32;
  constexpr int kThreads = 256;
  write_kv_cache_fp8_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(args,
                                                                                                                 out);
  return cudaGetLastError();
}

cudaError_t write_kv_cache(const KVWriteArgs& args, cudaStream_t stream) {
  if (args.num_tokens < 0 || args.num_kv_heads <= 0 || args.block_size <= 0 || args.head_dim <= 0 ||
      args.head_dim % 8 != 0 || (args.head_table != nullptr && (args.head_slot == nullptr || args.page_stride <= 0)))
    return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  const long long total = static_cast<long long>(args.num_tokens) * args.num_kv_heads * (args.head_dim / 8);
  constexpr int kThreads = 256;
  write_kv_cache_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace origami::cuda
