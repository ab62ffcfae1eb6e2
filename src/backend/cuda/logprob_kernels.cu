// log softmax(logits) per row: max-shifted, the exponentials summed in double (as the CPU twin
// does) with a fixed reduction tree, so a row's result does not depend on the batch; then the
// row token's value and, for rows that ask, the top k by k block-wide argmax passes, each
// taking the best entry after the previous one in (logit desc, id asc) order.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/logprob_kernels.h"
#include "backend/cuda/programmatic_launch.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float clean(float x) { return isnan(x) ? -INFINITY : x; }

// (v, i) comes before (w, j): larger logit, ties to the lower id.
__device__ __forceinline__ bool precedes(float v, int i, float w, int j) { return v > w || (v == w && i < j); }

__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(const float* __restrict__ logits_all, int vocab,
                                                                int row_stride, const RowSamplingParams* params,
                                                                const int32_t* sampled, float* logprobs,
                                                                TopLogprob* top_all) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float red_max[kWarps];
  __shared__ double red_sum[kWarps];
  __shared__ float red_v[kWarps];
  __shared__ int red_i[kWarps];
  __shared__ float pick_v;
  __shared__ int pick_i;
  const int row = blockIdx.x;
  const int forced = params[row].logprob_token;
  const int num_top = min(params[row].num_top_logprobs, kMaxTopLogprobs);
  if (forced < 0 && num_top < 0) {  // nothing asked
    if (threadIdx.x == 0) logprobs[row] = NAN;
    return;
  }
  const int token = forced >= 0 ? forced : sampled[row];
  const float* logits = logits_all + static_cast<size_t>(row) * row_stride;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) m = fmaxf(m, clean(logits[i]));
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) red_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red_max[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red_max[w]);
  double log_total = 0.0;
  if (m != -INFINITY) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < vocab; i += kThreads) sum += exp(static_cast<double>(clean(logits[i])) - m);
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if ((threadIdx.x & 31) == 0) red_sum[threadIdx.x >> 5] = sum;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += red_sum[w];
    log_total = log(total);
  }
  auto logprob_of = [&](float logit) -> float {
    if (m == -INFINITY) return -INFINITY;
    return static_cast<float>(static_cast<double>(clean(logit)) - m - log_total);
  };
  if (threadIdx.x == 0)
    logprobs[row] = token >= 0 && token < vocab ? logprob_of(logits[token]) : NAN;  // < 0: no token sampled

  TopLogprob* top = top_all + static_cast<size_t>(row) * kMaxTopLogprobs;
  float prev_v = INFINITY;
  int prev_i = -1;  // (+inf, -1) precedes every entry
  for (int k = 0; k < min(num_top, vocab); ++k) {
    float best_v = -INFINITY;
    int best_i = -1;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      const float v = clean(logits[i]);
      if (precedes(prev_v, prev_i, v, i) && (best_i < 0 || precedes(v, i, best_v, best_i))) {
        best_v = v;
        best_i = i;
      }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best_v, off);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
      if (oi >= 0 && (best_i < 0 || precedes(ov, oi, best_v, best_i))) {
        best_v = ov;
        best_i = oi;
      }
    }
    if ((threadIdx.x & 31) == 0) {
      red_v[threadIdx.x >> 5] = best_v;
      red_i[threadIdx.x >> 5] = best_i;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 0; w < kWarps; ++w) {
        if (red_i[w] >= 0 && (best_i < 0 || precedes(red_v[w], red_i[w], best_v, best_i))) {
          best_v = red_v[w];
          best_i = red_i[w];
        }
      }
      pick_v = best_v;
      pick_i = best_i;
      top[k].token = best_i;
      top[k].logprob = logprob_of(best_v);
    }
    __syncthreads();
    prev_v = pick_v;
    prev_i = pick_i;
  }
}

}  // namespace

void launch_row_logprobs(const float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                         const int32_t* sampled, float* logprobs, TopLogprob* top, cudaStream_t stream) {
  if (num_rows == 0) return;
  ORIGAMI_CUDA_CHECK(launch_programmatic(row_logprobs_kernel, num_rows, kThreads, 0, stream, logits, vocab, row_stride,
                                         params, sampled, logprobs, top));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
