// GPU sampling. Every filter of the sampler keeps a prefix of the order (logit desc, id asc),
// so the kernel never sorts: it finds each cut (k-th element, top-p crossing, the draw) by a
// radix select over a 56-bit key (32 bits of orderable logit, 24 bits of inverted id), 8 bits
// a pass, with histograms in shared memory. Probability mass is summed in 2^-40 fixed point
// with integer atomics, so results do not depend on thread scheduling.
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/programmatic_launch.h"
#include "backend/cuda/row_argmax.cuh"
#include "backend/cuda/sampling_kernels.h"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kIdBits = 24;
constexpr int kKeyBits = 32 + kIdBits;
constexpr int kDigitBits = 8;
constexpr int kNumPasses = kKeyBits / kDigitBits;  // 7
constexpr float kMassScale = 1099511627776.0f;     // 2^40

__device__ __forceinline__ float clean_logit(float x) { return isnan(x) ? -INFINITY : x; }

__device__ __forceinline__ uint64_t make_key(float logit, int id) {
  uint32_t u = __float_as_uint(logit);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << kIdBits) | static_cast<uint64_t>((1u << kIdBits) - 1u - id);
}

__device__ __forceinline__ int key_id(uint64_t key) {
  return static_cast<int>((1u << kIdBits) - 1u - static_cast<uint32_t>(key & ((1u << kIdBits) - 1u)));
}

struct RowContext {
  const float* logits;
  int vocab;
  float inv_t;    // 1 / temperature
  float m_over_t; // max logit / temperature
};

__device__ __forceinline__ float row_prob(const RowContext& c, float logit) {
  // Unnormalised probability exp(l/T - max/T), as softmax(logits / T) computes it.
  return expf(logit * c.inv_t - c.m_over_t);
}

__device__ __forceinline__ unsigned long long to_fixed(float e) { return __float2ull_rn(e * kMassScale); }

// Shared state of one block.
struct SelectSmem {
  unsigned long long hist[1 << kDigitBits];
  unsigned long long above;
  uint64_t prefix;
  unsigned long long reduce[kThreads / 32];
};

__device__ unsigned long long block_sum_u64(unsigned long long v, SelectSmem& s) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.reduce[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += s.reduce[w];
  return total;
}

// Mass (by_mass) or count of tokens whose key is >= `threshold`.
__device__ unsigned long long amount_at_least(const RowContext& c, uint64_t threshold, bool by_mass, SelectSmem& s) {
  unsigned long long local = 0;
  for (int i = threadIdx.x; i < c.vocab; i += kThreads) {
    const float l = clean_logit(c.logits[i]);
    if (make_key(l, i) >= threshold) local += by_mass ? to_fixed(row_prob(c, l)) : 1ull;
  }
  return block_sum_u64(local, s);
}

// The key of the first token, in descending key order, at which the running amount (count, or
// fixed-point mass) reaches `target`: running >= target, or running > target when `strict`.
__device__ uint64_t radix_select(const RowContext& c, unsigned long long target, bool by_mass, bool strict,
                                 SelectSmem& s) {
  if (threadIdx.x == 0) {
    s.above = 0;
    s.prefix = 0;
  }
  for (int pass = 0; pass < kNumPasses; ++pass) {
    const int shift = kKeyBits - (pass + 1) * kDigitBits;
    for (int b = threadIdx.x; b < (1 << kDigitBits); b += kThreads) s.hist[b] = 0;
    __syncthreads();
    const uint64_t prefix = s.prefix;
    const int prefix_shift = shift + kDigitBits;
    for (int i = threadIdx.x; i < c.vocab; i += kThreads) {
      const float l = clean_logit(c.logits[i]);
      const uint64_t key = make_key(l, i);
      if (prefix_shift < kKeyBits && (key >> prefix_shift) != (prefix >> prefix_shift)) continue;
      const int digit = static_cast<int>((key >> shift) & ((1u << kDigitBits) - 1u));
      atomicAdd(&s.hist[digit], by_mass ? to_fixed(row_prob(c, l)) : 1ull);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long running = s.above;
      int chosen = 0;
      for (int d = (1 << kDigitBits) - 1; d >= 0; --d) {
        const unsigned long long next = running + s.hist[d];
        if (s.hist[d] != 0 && (strict ? next > target : next >= target)) {
          chosen = d;
          break;
        }
        running = next;
        chosen = d;  // falls to the lowest digit if the target is never reached (rounding)
      }
      // `running` is the amount strictly above the chosen bucket.
      s.above = running;
      s.prefix = prefix | (static_cast<uint64_t>(chosen) << shift);
    }
    __syncthreads();
  }
  return s.prefix;
}

// adjusted_logit() of sampling/logit_adjustments.cpp, each step one correctly rounded operation
// (the _rn intrinsics are never fused into multiply-adds), so that CPU and GPU agree bit for bit.
__device__ __forceinline__ float adjusted_logit_rn(float logit, const LogitAdjustment& a, float repetition_penalty,
                                                   float presence_penalty) {
  if (a.flags & LogitAdjustment::kMasked) return -INFINITY;
  float l = __fadd_rn(logit, a.bias);
  if (a.flags & LogitAdjustment::kPenalized)
    l = l > 0.0f ? __fdiv_rn(l, repetition_penalty) : __fmul_rn(l, repetition_penalty);
  l = __fsub_rn(l, a.frequency_term);
  if (a.output_count > 0) l = __fsub_rn(l, presence_penalty);
  return l;
}

// The row's token (valid in thread 0); every thread of the block calls it.
__device__ int select_token(const float* __restrict__ logits, int vocab, const RowSamplingParams& p, SelectSmem& s,
                            float* red_val, int* red_idx) {
  // Argmax: the largest logit, ties to the lowest id; NaN counts as -inf.
  float best;
  int best_id;
  block_row_argmax(logits, vocab, red_val, red_idx, &best, &best_id);
  if (threadIdx.x == 0) {
    red_val[0] = best;
    // No finite maximum (all NaN / -inf, or a +inf): the row is unusable; the engine fails the
    // request on kNonFiniteLogits (sampling/sampler.h) instead of decoding token 0.
    red_idx[0] = isfinite(best) ? best_id : kNonFiniteLogits;
  }
  __syncthreads();
  const float max_logit = red_val[0];
  if (p.greedy || !isfinite(max_logit)) return red_idx[0];

  RowContext c{logits, vocab, 1.0f / p.temperature, max_logit / p.temperature};
  // The cut of every filter is a key threshold: tokens with key >= keep are kept.
  uint64_t keep = 0;
  int num_kept = vocab;
  if (p.min_p > 0.0f) {
    // p >= min_p * p_max  <=>  e >= min_p with e = p / p_max = exp(l/T - max/T).
    unsigned long long local = 0;
    for (int i = threadIdx.x; i < vocab; i += kThreads)
      if (row_prob(c, clean_logit(logits[i])) >= p.min_p) ++local;
    num_kept = static_cast<int>(block_sum_u64(local, s));
  }
  const int k = p.top_k > 0 && p.top_k < num_kept ? p.top_k : num_kept;
  if (k < vocab) keep = radix_select(c, static_cast<unsigned long long>(k), false, false, s);
  if (p.top_p < 1.0f) {
    const unsigned long long survivors = amount_at_least(c, keep, true, s);
    const unsigned long long target =
        static_cast<unsigned long long>(static_cast<double>(p.top_p) * static_cast<double>(survivors));
    const uint64_t cut = radix_select(c, target, true, false, s);
    if (cut > keep) keep = cut;
  }
  const unsigned long long kept_mass = amount_at_least(c, keep, true, s);
  const unsigned long long target =
      static_cast<unsigned long long>(static_cast<double>(p.u) * static_cast<double>(kept_mass));
  const uint64_t drawn = radix_select(c, target, true, true, s);
  return key_id(drawn);
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(float* __restrict__ logits_all, int vocab,
                                                               int row_stride, const RowSamplingParams* params,
                                                               int32_t* tokens, const LogitAdjustment* adjustments,
                                                               float* saved_logits) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ SelectSmem s;
  __shared__ float red_val[kThreads / 32];
  __shared__ int red_idx[kThreads / 32];
  const int row = blockIdx.x;
  float* logits = logits_all + static_cast<size_t>(row) * row_stride;
  const RowSamplingParams p = params[row];
  // Tokens within a row's slice are distinct, so each logit has one writer.
  const bool adjusted = p.adjust_count > 0 && adjustments != nullptr;
  if (adjusted) {
    for (int j = threadIdx.x; j < p.adjust_count; j += kThreads) {
      const LogitAdjustment a = adjustments[p.adjust_begin + j];
      const float raw = logits[a.token];
      saved_logits[p.adjust_begin + j] = raw;
      logits[a.token] = adjusted_logit_rn(raw, a, p.repetition_penalty, p.presence_penalty);
    }
    __syncthreads();
  }
  const int token = select_token(logits, vocab, p, s, red_val, red_idx);
  if (threadIdx.x == 0) tokens[row] = token;
  if (adjusted) {
    __syncthreads();  // every read of the adjusted row is done
    for (int j = threadIdx.x; j < p.adjust_count; j += kThreads)
      logits[adjustments[p.adjust_begin + j].token] = saved_logits[p.adjust_begin + j];
  }
}

__global__ void gather_pending_tokens_kernel(const int2* __restrict__ pairs, int n, const int32_t* __restrict__ sampled,
                                             int32_t* __restrict__ tokens) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int2 p = pairs[i];
  tokens[p.x] = sampled[p.y];
}

}  // namespace

void launch_sample_rows(float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                        int32_t* tokens, cudaStream_t stream, const LogitAdjustment* adjustments,
                        float* saved_logits) {
  if (num_rows == 0) return;
  ORIGAMI_CUDA_CHECK(launch_programmatic(sample_rows_kernel, num_rows, kThreads, 0, stream, logits, vocab, row_stride,
                                         params, tokens, adjustments, saved_logits));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_gather_pending_tokens(const int2* pairs, int n, const int32_t* sampled, int32_t* tokens,
                                  cudaStream_t stream) {
  if (n == 0) return;
  constexpr int kBlock = 256;
  gather_pending_tokens_kernel<<<(n + kBlock - 1) / kBlock, kBlock, 0, stream>>>(pairs, n, sampled, tokens);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
