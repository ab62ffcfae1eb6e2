// log softmax(logits) per row: max-shifted, the exponentials summed in double (as the CPU twin
// does) with a fixed reduction tree, so a row's result does not depend on the batch; then the
// row token's value and, for rows that ask, the top k: the k-th largest (logit desc, id asc) by a
// block radix select (radix_select.cuh), the k tokens at or above it gathered and ordered.
//
// Why this shape (docs/kernels.md, "Sampling"): the kernel read each row with one 4-byte load a
// thread at a time and took the top k by k block-wide argmax passes, 22 passes over a 128K row for
// top_logprobs = 20, where the sampler beside it takes ~3. Now two 16-byte loads a thread
// (row_loads.cuh) and ~5-6 passes for any k.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/logprob_kernels.h"
#include "backend/cuda/programmatic_launch.h"
#include "backend/cuda/radix_select.cuh"
#include "backend/cuda/row_loads.cuh"

namespace origami::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float clean(float x) { return isnan(x) ? -INFINITY : x; }

// A key whose unsigned order is (logit desc, id asc) with NaN as -inf: radix_select's order key of
// the cleaned logit over the id inverted (its index part orders ties to the larger index).
__device__ __forceinline__ unsigned long long top_key(float x, int id) {
  return radix_select::order_key(clean(x), 0x7fffffff - id);
}

__global__ void __launch_bounds__(kThreads) row_logprobs_kernel(const float* __restrict__ logits_all, int vocab,
                                                                int row_stride, const RowSamplingParams* params,
                                                                const int32_t* sampled, float* logprobs,
                                                                TopLogprob* top_all) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float red_max[kWarps];
  __shared__ double red_sum[kWarps];
  __shared__ radix_select::RadixSmem radix;
  __shared__ unsigned long long found_key[kMaxTopLogprobs];
  __shared__ float found_logit[kMaxTopLogprobs];
  __shared__ int num_found;
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
  for_each_row_value(logits, vocab, [&](float x, int) { m = fmaxf(m, clean(x)); });
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  if ((threadIdx.x & 31) == 0) red_max[threadIdx.x >> 5] = m;
  __syncthreads();
  m = red_max[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red_max[w]);
  double log_total = 0.0;
  if (m != -INFINITY) {
    double sum = 0.0;
    for_each_row_value(logits, vocab, [&](float x, int) { sum += exp(static_cast<double>(clean(x)) - m); });
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

  const int k = min(num_top, vocab);
  if (k <= 0) return;
  // Keys are unique (the id is part of them), so exactly k tokens have a key >= the k-th largest.
  const radix_select::KthKey kth = radix_select::block_kth_key(
      k, [&](auto f) { for_each_row_value(logits, vocab, [&](float x, int i) { f(top_key(x, i)); }); }, radix);
  if (threadIdx.x == 0) num_found = 0;
  __syncthreads();
  for_each_row_value(logits, vocab, [&](float x, int i) {
    const unsigned long long key = top_key(x, i);
    if (key < kth.key) return;
    const int slot = atomicAdd(&num_found, 1);
    if (slot < kMaxTopLogprobs) {
      found_key[slot] = key;
      found_logit[slot] = clean(x);
    }
  });
  __syncthreads();
  if (threadIdx.x == 0) {
    // Insertion sort of at most kMaxTopLogprobs entries, largest key first.
    const int n = min(num_found, k);
    for (int a = 1; a < n; ++a)
      for (int b = a; b > 0 && found_key[b] > found_key[b - 1]; --b) {
        const unsigned long long tk = found_key[b];
        found_key[b] = found_key[b - 1];
        found_key[b - 1] = tk;
        const float tl = found_logit[b];
        found_logit[b] = found_logit[b - 1];
        found_logit[b - 1] = tl;
      }
    TopLogprob* top = top_all + static_cast<size_t>(row) * kMaxTopLogprobs;
    for (int j = 0; j < n; ++j) {
      top[j].token = 0x7fffffff - static_cast<int>(static_cast<uint32_t>(found_key[j]));
      top[j].logprob = logprob_of(found_logit[j]);
    }
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
