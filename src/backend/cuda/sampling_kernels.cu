// GPU sampling. Every filter of the sampler keeps a prefix of the order (logit desc, id asc),
// so the kernel never sorts: it finds each cut (k-th element, top-p crossing, the draw) by a
// radix select over a 56-bit key (32 bits of orderable logit, 24 bits of inverted id), 8 bits
// a pass, with histograms in shared memory. Probability mass is summed in 2^-40 fixed point
// with integer atomics, so results do not depend on thread scheduling.
//
// Speed (docs/benchmarks.md, "Sampling on the GPU"): a sampled row once took 1.7 ms (temperature
// alone) to 3.4 ms (min-p) on one SM, a third of a batch-1 decode step, where greedy took 35 us.
// What it costs now, and why: the 64-bit shared-memory atomics ran as compare-and-swap loops on
// the few hot buckets of the first passes (add_amount: two 32-bit words); one atomic a token
// (BinCache: a thread's last two buckets summed in registers); seven passes over the row where
// the bucket soon fits in shared memory (kStagedCap); a pass for the total mass the first
// histogram already holds (radix_select's fraction); and a 256-step serial scan a pass
// (choose_digit: one warp).
#include <cooperative_groups.h>

#include <cmath>

#include "backend/cuda/cluster_rows.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/programmatic_launch.h"
#include "backend/cuda/row_argmax.cuh"
#include "backend/cuda/row_loads.cuh"
#include "backend/cuda/sampling_kernels.h"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

namespace cg = cooperative_groups;

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

// A row is shared out over the CTAs of a thread-block cluster (launch_sample_rows picks 1-8 CTAs a
// row, cluster_rows.h: small batches would leave all but a few SMs idle); each CTA reads entries [begin, end).
// The kernels below take `kSplit`: false where one CTA has the whole row (launched without a
// cluster). Why two instances: the split one's cluster barriers, distributed-shared-memory reads
// and offsets cost a 256-row launch 7% (430 -> 460 us, H200), spilling more registers, even with
// one CTA a row.
struct RowShare {
  const float* logits;  // the whole row
  int vocab;
  int begin, end;
};

// Visits this CTA's entries of the row (global ids).
template <bool kSplit, typename F>
__device__ __forceinline__ void for_each_share_value(const RowShare& r, F&& f) {
  if constexpr (kSplit) {
    const int begin = r.begin;
    for_each_row_value(r.logits + begin, r.end - begin, [&](float x, int i) { f(x, begin + i); });
  } else {
    for_each_row_value(r.logits, r.vocab, f);
  }
}

struct RowContext {
  RowShare share;
  float inv_t;    // 1 / temperature
  float m_over_t; // max logit / temperature
};

__device__ __forceinline__ float row_prob(const RowContext& c, float logit) {
  // Unnormalised probability exp(l/T - max/T), as softmax(logits / T) computes it.
  return expf(logit * c.inv_t - c.m_over_t);
}

__device__ __forceinline__ unsigned long long to_fixed(float e) { return __float2ull_rn(e * kMassScale); }

// The (logit, id) pairs a radix select keeps in shared memory once the tokens left in its bucket
// fit: its later passes read them there instead of the whole row (32 KB of 8-byte pairs).
constexpr int kStagedCap = 4096;

// Shared state of one block.
struct SelectSmem {
  // Amount (count or fixed-point mass) per digit, as two 32-bit words: add_amount says why.
  unsigned int hist_lo[1 << kDigitBits];
  unsigned int hist_hi[1 << kDigitBits];
  unsigned int count[1 << kDigitBits];       // tokens per digit: whether the next bucket fits the stage
  unsigned long long above;
  unsigned long long total;     // the amount of every token (pass 0's histogram), for a fraction target
  unsigned long long at_least;  // the amount of tokens whose key is >= the selected key
  uint64_t prefix;
  int num_staged;  // pairs in staged_*: the tokens matching `prefix` so far; -1 = none (read the row)
  int stage_next;  // the next pass copies its bucket's tokens into staged_*
  unsigned long long reduce[kThreads / 32];
  unsigned long long cluster_value;  // this CTA's part of a cluster-wide sum, read by the others
  unsigned long long cluster_total;  // the cluster-wide sum, from warp 0 to the CTA
  // A split row's histogram summed over the cluster's CTAs, per digit (merge_cluster_histograms).
  unsigned long long merged_amount[1 << kDigitBits];
  unsigned int merged_count[1 << kDigitBits];
  float arg_logit;                   // this CTA's argmax, read by the others
  int arg_id;
  float staged_logit[kStagedCap];
  int staged_id[kStagedCap];
};

// hist[d] += a. Shared memory has no 64-bit atomic add (it runs as a compare-and-swap loop, which
// contended bins turn into retries), so the sum is kept as two 32-bit words: the low word's
// atomic returns its old value, a wrap carries one into the high word. Exact while a row's sum
// stays below 2^64, as the 64-bit sums needed too: at most 2^40 a token, below 2^58 for 152K.
__device__ __forceinline__ void add_amount(SelectSmem& s, int d, unsigned long long a) {
  const unsigned int lo = static_cast<unsigned int>(a), hi = static_cast<unsigned int>(a >> 32);
  const unsigned int old = atomicAdd(&s.hist_lo[d], lo);
  const unsigned int carried = hi + (old + lo < old ? 1u : 0u);
  if (carried != 0) atomicAdd(&s.hist_hi[d], carried);
}
__device__ __forceinline__ unsigned long long hist_amount(const SelectSmem& s, int d) {
  return (static_cast<unsigned long long>(s.hist_hi[d]) << 32) | s.hist_lo[d];
}
// Every thread of the row's CTAs has arrived.
template <bool kSplit>
__device__ __forceinline__ void row_barrier() {
  if constexpr (kSplit)
    cg::this_cluster().sync();
  else
    __syncthreads();
}

// Cluster-wide histograms, for a split row: every CTA's histogram summed per digit into its own
// shared memory, thread d reading digit d of every CTA over distributed shared memory (between the
// cluster barriers that end a pass's counting and its choice). Why all threads, not the choosing
// warp: its lanes would chain 8 digits x 8 CTAs of remote loads one after the other (~35 us of a
// 120 us row at 8 CTAs, H200).
constexpr int kMaxClusterCtas = 8;
__device__ __forceinline__ void merge_cluster_histograms(SelectSmem& s) {
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned int ctas = cluster.num_blocks();
  for (int d = threadIdx.x; d < (1 << kDigitBits); d += kThreads) {
    unsigned long long amount = 0;
    unsigned int count = 0;
#pragma unroll
    for (unsigned int r = 0; r < kMaxClusterCtas; ++r) {
      if (r < ctas) {
        const SelectSmem& other = *cluster.map_shared_rank(&s, r);
        amount += hist_amount(other, d);
        count += other.count[d];
      }
    }
    s.merged_amount[d] = amount;
    s.merged_count[d] = count;
  }
}
template <bool kSplit>
__device__ __forceinline__ unsigned long long cluster_hist_amount(const SelectSmem& s, int d) {
  if constexpr (kSplit)
    return s.merged_amount[d];
  else
    return hist_amount(s, d);
}
template <bool kSplit>
__device__ __forceinline__ unsigned int cluster_hist_count(const SelectSmem& s, int d) {
  if constexpr (kSplit)
    return s.merged_count[d];
  else
    return s.count[d];
}

// A thread's last kSlots histogram bins, summed in registers and added to the shared histogram
// when a bin is evicted or the pass ends. Why: a row's keys fall in a few bins of the first
// passes (a digit is the sign and top exponent bits of the logit), and shared-memory atomics on
// one address serialize. The sums are integers, so when they reach shared memory does not change
// the histogram. Measured on a temperature-1 row of 128K (H200): two slots 191 us, four 315 us
// (their compares cost more than the atomics they save), a warp's lanes summing by bucket before
// one atomic each (labeled partition and reduce) 251 us.
struct BinCache {
  static constexpr int kSlots = 2;
  int digit[kSlots];
  unsigned long long amount[kSlots];
  unsigned int count[kSlots];
  int next = 0;  // the slot a miss evicts (round robin)

  __device__ __forceinline__ BinCache() {
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      digit[k] = -1;
      amount[k] = 0;
      count[k] = 0;
    }
  }

  // Slot k's sums into the shared histogram (an empty slot adds nothing).
  __device__ __forceinline__ void spill(int k, SelectSmem& s) const {
    if (digit[k] >= 0) {
      add_amount(s, digit[k], amount[k]);
      atomicAdd(&s.count[digit[k]], count[k]);
    }
  }

  __device__ __forceinline__ void add(int d, unsigned long long a, SelectSmem& s) {
    bool hit = false;
#pragma unroll
    for (int k = 0; k < kSlots; ++k)
      if (digit[k] == d) {
        amount[k] += a;
        ++count[k];
        hit = true;
      }
    if (hit) return;
#pragma unroll
    for (int k = 0; k < kSlots; ++k)
      if (k == next) {  // unrolled compares keep the slots in registers
        spill(k, s);
        digit[k] = d;
        amount[k] = a;
        count[k] = 1;
      }
    next = (next + 1) % kSlots;
  }
  __device__ __forceinline__ void flush(SelectSmem& s) {
#pragma unroll
    for (int k = 0; k < kSlots; ++k) spill(k, s);
  }
};

// The sum of v over every thread of the row's CTAs (with kSplit, each CTA's sum in its shared
// memory, read by all over distributed shared memory), returned to every thread.
template <bool kSplit>
__device__ unsigned long long cluster_sum_u64(unsigned long long v, SelectSmem& s) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) s.reduce[threadIdx.x >> 5] = v;
  __syncthreads();
  if constexpr (!kSplit) {
    unsigned long long total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += s.reduce[w];
    return total;
  }
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) {
    unsigned long long mine = 0;
    for (int w = 0; w < kThreads / 32; ++w) mine += s.reduce[w];
    s.cluster_value = mine;
  }
  cluster.sync();
  if (threadIdx.x < 32) {  // lane r reads CTA r's sum
    const unsigned int lane = threadIdx.x;
    unsigned long long total = lane < cluster.num_blocks() ? *cluster.map_shared_rank(&s.cluster_value, lane) : 0ull;
    for (int off = 16; off > 0; off >>= 1) total += __shfl_xor_sync(0xffffffffu, total, off);
    if (lane == 0) s.cluster_total = total;
  }
  cluster.sync();  // every CTA has read the others' values before any writes its next one
  return s.cluster_total;
}

// Mass (by_mass) or count of tokens whose key is >= `threshold`. Not inlined (nor radix_select):
// one copy serves every call site of select_token; inlined into each, the 1,024-thread kernel
// (64 registers a thread) spilled ~2 KB a thread (-Xptxas -v), none as calls.
template <bool kSplit>
__device__ __noinline__ unsigned long long amount_at_least(const RowContext& c, uint64_t threshold, bool by_mass, SelectSmem& s) {
  unsigned long long local = 0;
  for_each_share_value<kSplit>(c.share, [&](float x, int i) {
    const float l = clean_logit(x);
    if (make_key(l, i) >= threshold) local += by_mass ? to_fixed(row_prob(c, l)) : 1ull;
  });
  return cluster_sum_u64<kSplit>(local, s);
}

// The digit a radix pass chooses, by the first warp: the highest digit d whose bucket is not empty
// and whose amount, added to what lies above it, reaches the target (> with `strict`, else >=);
// when none does (rounding), digit 0 with everything above it. The same choice as scanning the
// 256 buckets from the top one by one, without a serial chain of 256 shared-memory reads: lane L
// holds digits 255 - 8L .. 248 - 8L, a warp scan gives each lane what lies above its digits, and
// the first lane whose digits cross finds the digit among its eight. With fraction >= 0 (pass 0)
// the target is fraction x the total first. Updates s.above, s.prefix, s.stage_next (and
// s.total, s.at_least); `target` is updated in every lane.
template <bool kSplit>
__device__ __forceinline__ void choose_digit(SelectSmem& s, int pass, uint64_t prefix, int shift, bool strict,
                                             double fraction, unsigned long long& target) {
  constexpr int kPerLane = (1 << kDigitBits) / 32;
  const int lane = threadIdx.x & 31;
  unsigned long long amount[kPerLane];
  unsigned long long mine = 0;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    amount[j] = cluster_hist_amount<kSplit>(s, (1 << kDigitBits) - 1 - kPerLane * lane - j);
    mine += amount[j];
  }
  unsigned long long inclusive = mine;  // this lane's digits and every higher one
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  if (pass == 0 && fraction >= 0.0) {
    const unsigned long long total = __shfl_sync(0xffffffffu, inclusive, 31);
    target = static_cast<unsigned long long>(fraction * static_cast<double>(total));
    if (lane == 0) s.total = total;
  }
  unsigned long long running = s.above + (inclusive - mine);
  int found = -1;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (found >= 0) continue;
    const unsigned long long next = running + amount[j];
    if (amount[j] != 0 && (strict ? next > target : next >= target)) {
      found = j;
    } else {
      running = next;
    }
  }
  const unsigned int crossing = __ballot_sync(0xffffffffu, found >= 0);
  // The first crossing lane holds the highest crossing digit; with none, lane 31 holds digit 0
  // and `running` is everything.
  const int owner = crossing != 0 ? __ffs(crossing) - 1 : 31;
  if (lane == owner) {
    const int chosen = (1 << kDigitBits) - 1 - kPerLane * lane - (found >= 0 ? found : kPerLane - 1);
    // `running` is the amount strictly above the chosen bucket.
    s.above = running;
    s.prefix = prefix | (static_cast<uint64_t>(chosen) << shift);
    // Stage the chosen bucket in the next pass if it fits and is not staged yet.
    s.stage_next = s.num_staged < 0 && cluster_hist_count<kSplit>(s, chosen) <= kStagedCap;
    // After the last pass the bucket is one key: what lies above it, plus its own amount.
    if (pass == kNumPasses - 1) s.at_least = running + cluster_hist_amount<kSplit>(s, chosen);
  }
}

// A radix select's result: the key, and amounts the caller would otherwise take another pass for.
struct Selected {
  uint64_t key;
  unsigned long long at_least;  // amount of tokens with key >= `key` (amount_at_least(c, key, ...))
  unsigned long long total;     // amount of every token: valid when the target was a fraction
};

// The key of the first token, in descending key order, at which the running amount (count, or
// fixed-point mass) reaches the target: running >= target, or running > target when `strict`.
// The target is `target`, or with fraction >= 0 (fraction x total) for the total amount of the row,
// which the first pass's histogram gives (it covers every token), as one more pass would.
// Each pass histograms the next 8 bits of the keys that match the digits chosen so far; once the
// chosen bucket holds at most kStagedCap tokens, the next pass also copies them into shared
// memory and the passes after it read only those (a 152K row is read ~3 times, not 7). The
// histograms are integer sums, so the result does not depend on which tokens are staged where.
//
// `floor`: a key the answer is known to be at or above (an earlier cut: the target is below the
// amount of the keys >= floor, so the running amount crosses it there). Keys below it are skipped
// before their mass is computed: they would only add to buckets at or below the crossing one,
// which the choice never reads past, and to its count (staging it sooner).
template <bool kSplit>
__device__ __noinline__ Selected radix_select(const RowContext& c, unsigned long long target, bool by_mass,
                                              bool strict, SelectSmem& s, double fraction = -1.0,
                                              uint64_t floor = 0) {
  __syncthreads();  // every thread has read the previous select's result out of `s`
  if (threadIdx.x == 0) {
    s.above = 0;
    s.prefix = 0;
    s.num_staged = -1;
    s.stage_next = c.share.vocab <= kStagedCap;
  }
  for (int pass = 0; pass < kNumPasses; ++pass) {
    const int shift = kKeyBits - (pass + 1) * kDigitBits;
    for (int b = threadIdx.x; b < (1 << kDigitBits); b += kThreads) {
      s.hist_lo[b] = 0;
      s.hist_hi[b] = 0;
      s.count[b] = 0;
    }
    __syncthreads();
    const uint64_t prefix = s.prefix;
    const int prefix_shift = shift + kDigitBits;
    const int num_staged = s.num_staged;
    const bool stage = s.stage_next != 0;
    __syncthreads();  // every thread has read num_staged before the stage refills it
    if (stage && threadIdx.x == 0) s.num_staged = 0;
    __syncthreads();
    BinCache bins;
    auto visit = [&](float l, int i) {
      const uint64_t key = make_key(l, i);
      if (key < floor) return;
      if (prefix_shift < kKeyBits && (key >> prefix_shift) != (prefix >> prefix_shift)) return;
      const int digit = static_cast<int>((key >> shift) & ((1u << kDigitBits) - 1u));
      const unsigned long long a = by_mass ? to_fixed(row_prob(c, l)) : 1ull;
      bins.add(digit, a, s);
      if (stage) {
        // One slot reservation a warp: the lanes staging now share one atomic.
        const cg::coalesced_group g = cg::coalesced_threads();
        int slot = 0;
        if (g.thread_rank() == 0) slot = atomicAdd(&s.num_staged, static_cast<int>(g.size()));
        slot = g.shfl(slot, 0) + static_cast<int>(g.thread_rank());
        s.staged_logit[slot] = l;
        s.staged_id[slot] = i;
      }
    };
    if (num_staged >= 0 && !stage) {
      for (int j = threadIdx.x; j < num_staged; j += kThreads) visit(s.staged_logit[j], s.staged_id[j]);
    } else {
      for_each_share_value<kSplit>(c.share, [&](float x, int i) { visit(clean_logit(x), i); });
    }
    bins.flush(s);
    row_barrier<kSplit>();  // every CTA's histogram of this pass is complete
    if constexpr (kSplit) {
      merge_cluster_histograms(s);
      __syncthreads();
    }
    if (threadIdx.x < 32) choose_digit<kSplit>(s, pass, prefix, shift, strict, fraction, target);
    row_barrier<kSplit>();  // every CTA has read the others' histograms before they are reset
  }
  const Selected out{s.prefix, s.at_least, s.total};
  return out;
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
template <bool kSplit>
__device__ int select_token(const RowShare& share, const RowSamplingParams& p, SelectSmem& s, float* red_val,
                            int* red_idx) {
  cg::cluster_group cluster = cg::this_cluster();
  // Argmax: the largest logit, ties to the lowest id; NaN counts as -inf. Each CTA's over its
  // share, then the best of the cluster's (argmax_beats is a total order, so the same token).
  float best;
  int best_id;
  block_row_argmax(share.logits + share.begin, share.end - share.begin, red_val, red_idx, &best, &best_id);
  const unsigned int ctas = kSplit ? cluster.num_blocks() : 1u;
  if (kSplit) {
    if (threadIdx.x == 0) {
      s.arg_logit = best;
      s.arg_id = best_id == 0x7fffffff ? best_id : best_id + share.begin;  // 0x7fffffff: an empty share
    }
    cluster.sync();
  }
  if (kSplit && threadIdx.x < 32) {  // lane r reads CTA r's argmax; the warp keeps the best
    best = -INFINITY;
    best_id = 0x7fffffff;
    if (threadIdx.x < ctas) {
      const SelectSmem& other = *cluster.map_shared_rank(&s, threadIdx.x);
      best = other.arg_logit;
      best_id = other.arg_id;
    }
    warp_argmax(best, best_id);
  }
  if (threadIdx.x == 0) {
    red_val[0] = best;
    // No finite maximum (all NaN / -inf, or a +inf): the row is unusable; the engine fails the
    // request on kNonFiniteLogits (sampling/sampler.h) instead of decoding token 0.
    red_idx[0] = isfinite(best) ? best_id : kNonFiniteLogits;
  }
  __syncthreads();
  const float max_logit = red_val[0];
  if (p.greedy || !isfinite(max_logit)) return red_idx[0];
  const int vocab = share.vocab;

  RowContext c{share, 1.0f / p.temperature, max_logit / p.temperature};
  // The cut of every filter is a key threshold: tokens with key >= keep are kept.
  uint64_t keep = 0;
  int num_kept = vocab;
  if (p.min_p > 0.0f) {
    // p >= min_p * p_max  <=>  e >= min_p with e = p / p_max = exp(l/T - max/T).
    unsigned long long local = 0;
    for_each_share_value<kSplit>(share, [&](float x, int) {
      if (row_prob(c, clean_logit(x)) >= p.min_p) ++local;
    });
    num_kept = static_cast<int>(cluster_sum_u64<kSplit>(local, s));
  }
  const int k = p.top_k > 0 && p.top_k < num_kept ? p.top_k : num_kept;
  if (k < vocab) keep = radix_select<kSplit>(c, static_cast<unsigned long long>(k), false, false, s).key;
  // The mass the draw runs over (tokens with key >= keep), where already known; without a top-k or
  // min-p cut it is the whole row's, which the next select's first pass sums.
  bool kept_known = false;
  unsigned long long kept_mass = 0;
  if (p.top_p < 1.0f) {
    Selected cut;
    unsigned long long survivors;
    if (keep == 0) {
      cut = radix_select<kSplit>(c, 0, true, false, s, static_cast<double>(p.top_p));
      survivors = cut.total;
    } else {
      survivors = amount_at_least<kSplit>(c, keep, true, s);
      const unsigned long long target =
          static_cast<unsigned long long>(static_cast<double>(p.top_p) * static_cast<double>(survivors));
      cut = radix_select<kSplit>(c, target, true, false, s, -1.0, keep);
    }
    kept_known = true;
    if (cut.key > keep) {
      keep = cut.key;
      kept_mass = cut.at_least;
    } else {
      kept_mass = survivors;
    }
  } else if (keep != 0) {
    kept_known = true;
    kept_mass = amount_at_least<kSplit>(c, keep, true, s);
  }
  const Selected drawn =
      kept_known
          ? radix_select<kSplit>(c, static_cast<unsigned long long>(static_cast<double>(p.u) * static_cast<double>(kept_mass)),
                         true, true, s, -1.0, keep)
          : radix_select<kSplit>(c, 0, true, true, s, static_cast<double>(p.u));
  return key_id(drawn.key);
}

template <bool kSplit>
__global__ void __launch_bounds__(kThreads) sample_rows_kernel(float* __restrict__ logits_all, int vocab,
                                                               int row_stride, const RowSamplingParams* params,
                                                               int32_t* tokens, const LogitAdjustment* adjustments,
                                                               float* saved_logits) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ SelectSmem s;
  __shared__ float red_val[kThreads / 32];
  __shared__ int red_idx[kThreads / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const int ranks = kSplit ? static_cast<int>(cluster.num_blocks()) : 1;
  const int row = static_cast<int>(blockIdx.x) / ranks;
  float* logits = logits_all + static_cast<size_t>(row) * row_stride;
  // This CTA's share: whole 16-byte vectors where the row is aligned.
  const int chunk = ((vocab + ranks - 1) / ranks + 3) & ~3;
  const int begin = kSplit ? min(vocab, static_cast<int>(cluster.block_rank()) * chunk) : 0;
  const RowShare share{logits, vocab, begin, min(vocab, begin + chunk)};
  const RowSamplingParams p = params[row];
  // Each CTA adjusts the tokens of its own share (the only ones it reads), so no CTA reads another's
  // writes to the row. Tokens within a row's slice are distinct, so each logit has one writer.
  const bool adjusted = p.adjust_count > 0 && adjustments != nullptr;
  auto mine = [&](int token) { return token >= share.begin && token < share.end; };
  if (adjusted) {
    for (int j = threadIdx.x; j < p.adjust_count; j += kThreads) {
      const LogitAdjustment a = adjustments[p.adjust_begin + j];
      if (!mine(a.token)) continue;
      const float raw = logits[a.token];
      saved_logits[p.adjust_begin + j] = raw;
      logits[a.token] = adjusted_logit_rn(raw, a, p.repetition_penalty, p.presence_penalty);
    }
    __syncthreads();
  }
  const int token = select_token<kSplit>(share, p, s, red_val, red_idx);
  if (threadIdx.x == 0 && (!kSplit || cluster.block_rank() == 0)) tokens[row] = token;
  if (adjusted) {
    __syncthreads();  // every read of the adjusted share is done
    for (int j = threadIdx.x; j < p.adjust_count; j += kThreads) {
      const int t = adjustments[p.adjust_begin + j].token;
      if (mine(t)) logits[t] = saved_logits[p.adjust_begin + j];
    }
  }
  if constexpr (kSplit) cluster.sync();  // no CTA leaves while another may still read its shared memory
}

__global__ void gather_pending_tokens_kernel(const int2* __restrict__ pairs, int n, const int32_t* __restrict__ sampled,
                                             int32_t* __restrict__ tokens) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int2 p = pairs[i];
  tokens[p.x] = sampled[p.y];
}

}  // namespace

RowSamplingParams row_sampling_params(const SamplingParams* sp, float u) {
  RowSamplingParams rp;
  rp.greedy = sp == nullptr || sp->is_greedy() ? 1 : 0;
  if (sp != nullptr) {
    rp.temperature = sp->temperature;
    rp.top_k = sp->top_k;
    rp.top_p = sp->top_p;
    rp.min_p = sp->min_p;
  }
  rp.u = u;
  return rp;
}

void launch_sample_rows(float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                        int32_t* tokens, cudaStream_t stream, const LogitAdjustment* adjustments,
                        float* saved_logits) {
  if (num_rows == 0) return;
  const unsigned ctas = cluster_ctas_per_row(num_rows, current_device_sm_count());
  if (ctas == 1)
    ORIGAMI_CUDA_CHECK(launch_programmatic(sample_rows_kernel<false>, num_rows, kThreads, 0, stream, logits, vocab, row_stride,
                                           params, tokens, adjustments, saved_logits));
  else
    ORIGAMI_CUDA_CHECK(launch_programmatic_clusters(sample_rows_kernel<true>, num_rows * ctas, kThreads, 0, stream, ctas,
                                                    logits, vocab, row_stride, params, tokens, adjustments,
                                                    saved_logits));
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
