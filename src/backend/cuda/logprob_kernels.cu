// log softmax(logits)[token] per row: max-shifted, the exponentials summed in double (as the CPU
// twin does) with a fixed reduction tree, so a row's result does not depend on the batch.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/logprob_kernels.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float clean(float x) { return isnan(x) ? -INFINITY : x; }

__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(const float* __restrict__ logits_all, int vocab,
                                                                int row_stride, const RowSamplingParams* params,
                                                                float* logprobs) {
  __shared__ float red_max[kThreads / 32];
  __shared__ double red_sum[kThreads / 32];
  const int row = blockIdx.x;
  const int token = params[row].logprob_token;
  if (token < 0 || token >= vocab) {  // nothing asked (the host rejects out-of-range tokens)
    if (threadIdx.x == 0) logprobs[row] = NAN;
    return;
  }
  const float* logits = logits_all + static_cast<size_t>(row) * row_stride;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, clean(logits[i]));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) red_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red_max[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red_max[w]);
  if (m == -INFINITY) {
    if (threadIdx.x == 0) logprobs[row] = -INFINITY;
    return;
  }
  double sum = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(clean(logits[i])) - m);
  for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if ((threadIdx.x & 31) == 0) red_sum[threadIdx.x >> 5] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kThreads / 32; ++w) total += red_sum[w];
    logprobs[row] = static_cast<float>(static_cast<double>(clean(logits[token])) - m - log(total));
  }
}

}  // namespace

void launch_row_logprobs(const float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                         float* logprobs, cudaStream_t stream) {
  if (num_rows == 0) return;
  row_logprobs_kernel<<<num_rows, kThreads, 0, stream>>>(logits, vocab, row_stride, params, logprobs);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
