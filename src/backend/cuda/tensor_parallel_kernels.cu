#include "backend/cuda/tensor_parallel_kernels.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/row_argmax.cuh"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

__global__ void embedding_gather_shard_kernel(const __nv_bfloat16* __restrict__ table, const int32_t* __restrict__ ids,
                                              int hidden, int vocab_begin, int vocab_shard,
                                              float* __restrict__ residual, __nv_bfloat16* __restrict__ rows) {
  const int t = blockIdx.x;
  const int local = ids[t] - vocab_begin;
  const bool mine = local >= 0 && local < vocab_shard;
  const __nv_bfloat16* row = table + static_cast<size_t>(mine ? local : 0) * hidden;
  float* dst = residual + static_cast<size_t>(t) * hidden;
  if (rows != nullptr) {
    __nv_bfloat16* out = rows + static_cast<size_t>(t) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
      out[i] = mine ? row[i] : __float2bfloat16(0.0f);
      dst[i] = 0.0f;
    }
    return;
  }
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = mine ? __bfloat162float(row[i]) : 0.0f;
}

__global__ void unshard_logits_kernel(const float* __restrict__ gathered, int ranks, int rows, int shard,
                                      float* __restrict__ out) {
  const int r = blockIdx.y;
  const size_t width = static_cast<size_t>(ranks) * shard;
  for (size_t c = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; c < width;
       c += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t k = c / shard, j = c % shard;
    out[r * width + c] = gathered[(k * rows + r) * shard + j];
  }
}

constexpr int kArgmaxThreads = 1024;

__global__ void __launch_bounds__(kArgmaxThreads) shard_argmax_kernel(const float* __restrict__ logits, int shard,
                                                                      int valid, int vocab_begin,
                                                                      ShardArgmax* __restrict__ out) {
  __shared__ float red_val[kArgmaxThreads / 32];
  __shared__ int red_idx[kArgmaxThreads / 32];
  float best;
  int best_id;
  block_row_argmax(logits + static_cast<size_t>(blockIdx.x) * shard, valid, red_val, red_idx, &best, &best_id);
  // A shard without a candidate (every entry NaN / -inf) offers -inf at its first id.
  if (threadIdx.x == 0) out[blockIdx.x] = ShardArgmax{best, vocab_begin + (best_id == 0x7fffffff ? 0 : best_id)};
}

__global__ void merge_shard_argmax_kernel(const ShardArgmax* __restrict__ gathered, int ranks, int rows,
                                          int32_t* __restrict__ tokens) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  ShardArgmax best = gathered[r];
  for (int k = 1; k < ranks; ++k) {
    const ShardArgmax c = gathered[static_cast<size_t>(k) * rows + r];
    if (argmax_beats(c.logit, c.id, best.logit, best.id)) best = c;
  }
  tokens[r] = isfinite(best.logit) ? best.id : kNonFiniteLogits;
}

}  // namespace

void launch_shard_argmax(const float* logits, int rows, int shard, int valid, int vocab_begin, ShardArgmax* out,
                         cudaStream_t stream) {
  if (rows <= 0) return;
  shard_argmax_kernel<<<rows, kArgmaxThreads, 0, stream>>>(logits, shard, valid, vocab_begin, out);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_merge_shard_argmax(const ShardArgmax* gathered, int ranks, int rows, int32_t* tokens, cudaStream_t stream) {
  if (rows <= 0) return;
  merge_shard_argmax_kernel<<<(rows + 255) / 256, 256, 0, stream>>>(gathered, ranks, rows, tokens);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_embedding_gather_shard(const __nv_bfloat16* table, const int32_t* ids, int n, int hidden,
                                   int vocab_begin, int vocab_shard, float* residual, cudaStream_t stream,
                                   __nv_bfloat16* rows) {
  if (n <= 0) return;
  embedding_gather_shard_kernel<<<n, 256, 0, stream>>>(table, ids, hidden, vocab_begin, vocab_shard, residual, rows);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_unshard_logits(const float* gathered, int ranks, int rows, int shard, float* out, cudaStream_t stream) {
  if (rows <= 0) return;
  const size_t width = static_cast<size_t>(ranks) * shard;
  const int blocks_x = static_cast<int>(std::min<size_t>((width + 255) / 256, 1024));
  unshard_logits_kernel<<<dim3(blocks_x, rows), 256, 0, stream>>>(gathered, ranks, rows, shard, out);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
