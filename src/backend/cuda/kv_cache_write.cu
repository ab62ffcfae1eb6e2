// Scatter of new K/V rows into the paged cache; see kv_cache_write.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_cache_write.cuh"

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
  const long long row_offset = kv_cache_row_offset(a, row / a.num_kv_heads, static_cast<int>(row % a.num_kv_heads));
  if (row_offset < 0) return;
  const long long dst = row_offset + chunk * 8;
  const long long src = row * a.head_dim + chunk * 8;
  *reinterpret_cast<uint4*>(a.k_cache + dst) = *reinterpret_cast<const uint4*>(a.k + src);
  *reinterpret_cast<uint4*>(a.v_cache + dst) = *reinterpret_cast<const uint4*>(a.v + src);
}

// One warp per (token, head) row, K and V: each lane holds head_dim / 32 elements (at most 8)
// and kv_fp8_store_row_warp rounds and stores the row (the scale math is kv/kv_cache_dtype.h's,
// shared with the CPU emulation).
__global__ void write_kv_cache_fp8_kernel(const KVWriteArgs a, const KVWriteFp8Out out) {
  const long long row = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= static_cast<long long>(a.num_tokens) * a.num_kv_heads) return;
  const long long dst = kv_cache_row_offset(a, row / a.num_kv_heads, static_cast<int>(row % a.num_kv_heads));
  if (dst < 0) return;  // uniform over the warp
  const int per_lane = a.head_dim / 32;
  for (int kv = 0; kv < 2; ++kv) {
    const __nv_bfloat16* src = (kv == 0 ? a.k : a.v) + row * a.head_dim;
    float x[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = i < per_lane ? __bfloat162float(src[i * 32 + lane]) : 0.0f;
    kv_fp8_store_row_warp(x, per_lane, lane, (kv == 0 ? out.k_codes : out.v_codes) + dst,
                          (kv == 0 ? out.k_scales : out.v_scales) + dst / a.head_dim);
  }
}

}  // namespace

bool kv_write_args_valid(const KVWriteArgs& args, const KVWriteFp8Out* fp8) {
  if (args.num_tokens < 0 || args.num_kv_heads <= 0 || args.block_size <= 0 || args.head_dim <= 0 ||
      args.head_dim % 8 != 0 || (args.head_table != nullptr && (args.head_slot == nullptr || args.page_stride <= 0)))
    return false;
  if (fp8 == nullptr) return true;
  return args.head_dim >= 32 && args.head_dim <= 256 && args.head_dim % 32 == 0 && fp8->k_codes != nullptr &&
         fp8->v_codes != nullptr && fp8->k_scales != nullptr && fp8->v_scales != nullptr &&
         (args.head_table == nullptr || args.page_stride % args.head_dim == 0);
}

cudaError_t write_kv_cache_fp8(const KVWriteArgs& args, const KVWriteFp8Out& out, cudaStream_t stream) {
  if (!kv_write_args_valid(args, &out)) return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  const long long threads = static_cast<long long>(args.num_tokens) * args.num_kv_heads * 32;
  constexpr int kThreads = 256;
  write_kv_cache_fp8_kernel<<<static_cast<unsigned>((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(args,
                                                                                                                 out);
  return cudaGetLastError();
}

cudaError_t write_kv_cache(const KVWriteArgs& args, cudaStream_t stream) {
  if (!kv_write_args_valid(args, nullptr)) return cudaErrorInvalidValue;
  if (args.num_tokens == 0) return cudaSuccess;
  const long long total = static_cast<long long>(args.num_tokens) * args.num_kv_heads * (args.head_dim / 8);
  constexpr int kThreads = 256;
  write_kv_cache_kernel<<<static_cast<unsigned>((total + kThreads - 1) / kThreads), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace origami::cuda
