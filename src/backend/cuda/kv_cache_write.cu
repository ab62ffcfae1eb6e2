// Scatter of new K/V rows into the paged cache; see kv_cache_write.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kv_cache_write.h"

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

}  // namespace

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
