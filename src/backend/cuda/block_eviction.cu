// Block eviction kernels of the CUDA backend; see block_eviction.h.
#include "backend/cuda/block_eviction.h"

#include <cmath>

#include "backend/cuda/compression_device.cuh"

namespace origami::cuda {
namespace {

using namespace compression_device;

constexpr int kSumThreads = 256;

// Grid (block of the table, job): thread t sums the terms t, t + 256, ... of the block's
// rows x block_size scores; then a fixed tree over the threads.
__global__ void __launch_bounds__(kSumThreads) block_score_sums_kernel(const GroupArgs a, const int32_t* sum0,
                                                                      float* sums) {
  const int job = blockIdx.y, p = blockIdx.x;
  const CompressionJobDesc jd = a.jobs[job];
  const int bs = a.block_size;
  if (p >= jd.n / bs) return;
  const int rows = a.num_group_layers * a.num_kv_heads;
  float acc = 0.0f;
  for (int i = threadIdx.x; i < rows * bs; i += kSumThreads) {
    const int row = i / bs, o = i % bs;
    acc += a.scores[row_offset(jd, row) + static_cast<size_t>(p) * bs + o];
  }
  __shared__ float part[kSumThreads];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kSumThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) sums[sum0[job] + p] += part[0];
}

__global__ void pick_evicted_blocks_kernel(const CompressionJobDesc* jobs, int num_jobs, const int32_t* sum0,
                                           const float* sums, int block_size, float inv_count, int32_t* evicted) {
  const int job = blockIdx.x * blockDim.x + threadIdx.x;
  if (job >= num_jobs) return;
  const int num_blocks = jobs[job].n / block_size;
  const float* s = sums + sum0[job];
  int best = 1;
  for (int p = 2; p <= num_blocks - 2; ++p) {
    const float a = s[p] * inv_count, b = s[best] * inv_count;
    if (isnan(b)) break;  // nothing is lower than NaN; the lower index keeps it
    if (isnan(a) || a < b) best = p;
  }
  evicted[job] = best;
}

}  // namespace

cudaError_t launch_block_score_sums(const GroupArgs& a, const int32_t* sum0, float* sums, int max_blocks,
                                    cudaStream_t stream) {
  if (a.num_jobs == 0 || max_blocks <= 0) return cudaSuccess;
  // The grid covers the largest table; grid blocks past a job's own table return at once.
  block_score_sums_kernel<<<dim3(max_blocks, a.num_jobs), kSumThreads, 0, stream>>>(a, sum0, sums);
  return cudaGetLastError();
}

cudaError_t launch_pick_evicted_blocks(const CompressionJobDesc* jobs, int num_jobs, const int32_t* sum0,
                                       const float* sums, int block_size, float inv_count, int32_t* evicted,
                                       cudaStream_t stream) {
  if (num_jobs == 0) return cudaSuccess;
  pick_evicted_blocks_kernel<<<(num_jobs + 127) / 128, 128, 0, stream>>>(jobs, num_jobs, sum0, sums, block_size,
                                                                         inv_count, evicted);
  return cudaGetLastError();
}

}  // namespace origami::cuda
