#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "core/check.h"

namespace origami {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Keeps engine-drawn seeds apart from small user seeds that happen to equal the counter.
constexpr uint64_t kEngineSeedSalt = 0xD1B54A32D192ED03ull;

// A token still in the running: `weight` is exp((logit - max) / T) once computed, so the top
// token weighs 1 and the renormalisation constant is just the sum of weights.
struct Candidate {
  float weight;
  int32_t id;
};

// The deterministic order of the draw: descending weight, ties by ascending id.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

// NaN -> -inf, +inf -> FLT_MAX (so max-subtraction never forms inf - inf). Written as selects
// so that loops using it vectorize.
inline float sanitize(float x) {
  x = x == x ? x : -std::numeric_limits<float>::infinity();
  return x < FLT_MAX ? x : FLT_MAX;
}

// Largest logit with NaN ignored (-inf if all are NaN / -inf). Eight independent lanes, each
// `x > m ? x : m` (a NaN x leaves m), so the loop compiles to packed max instructions.
float max_logit_of(const float* logits, int vocab_size) {
  constexpr int kLanes = 8;
  float lane[kLanes];
  for (float& m : lane) m = -std::numeric_limits<float>::infinity();
  int i = 0;
  for (; i + kLanes <= vocab_size; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
  for (; i < vocab_size; ++i) lane[0] = logits[i] > lane[0] ? logits[i] : lane[0];
  float m = lane[0];
  for (int l = 1; l < kLanes; ++l) m = lane[l] > m ? lane[l] : m;
  return m;
}

// exp(x) for x <= 0 (and -inf), relative error ~2 ulp: Cody-Waite reduction x = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for e^r, and 2^n through the exponent bits. Own code
// rather than std::exp so the weight loop vectorizes and gives the same weights on every libm.
// Results below FLT_MIN (x < -87.34) are flushed to 0: such tokens carry < 1e-38 of the top
// token's probability.
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kMinArg = -87.3365447f;  // ln(FLT_MIN)
  const float xc = std::max(x, -88.0f);
  // Round to nearest by adding 1.5 * 2^23 (no floor call: that would not vectorize under the
  // default trapping-math rules); the integer then sits in the low mantissa bits.
  constexpr float kRoundMagic = 12582912.0f;
  const float shifted = xc * kLog2e + kRoundMagic;
  const float n = shifted - kRoundMagic;
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRoundMagic);
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // The flush to 0 is folded into the scale (as a 0/1 factor) so that nothing above is
  // conditional, which would keep the compiler from vectorizing callers' loops.
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  const float keep = static_cast<float>(x >= kMinArg);
  return p * (scale * keep);
}

// Candidate sets up to this size are simply sorted; larger ones go through weight buckets.
constexpr size_t kSortAllLimit = 4096;
// Top-k up to this size is selected with a bounded heap (one comparison per token for most
// tokens); larger k with nth_element.
constexpr int kHeapTopKLimit = 1024;
// Positive floats order like their bit patterns, so the top bits of a weight in (0, 1] bucket it
// by magnitude: 8 exponent + 5 mantissa bits, i.e. 32 buckets per octave.
constexpr int kBucketShift = 18;
constexpr size_t kNumBuckets = (0x3F800000u >> kBucketShift) + 1;

inline uint32_t bucket_of(float weight) { return std::bit_cast<uint32_t>(weight) >> kBucketShift; }

// The draw over a sorted candidate list: top-p cut, then inverse CDF at u.
int32_t draw_from_sorted(const std::vector<Candidate>& sorted, float top_p, float u) {
  double total = 0.0;
  for (const Candidate& c : sorted) total += c.weight;
  size_t num_kept = sorted.size();
  double kept_mass = total;
  if (top_p < 1.0f) {
    const double cut = static_cast<double>(top_p) * total;
    double mass_before = 0.0;
    size_t j = 0;
    // A token stays while the mass ranked before it is < top_p; the top token always stays.
    for (; j < sorted.size() && mass_before < cut; ++j) mass_before += sorted[j].weight;
    num_kept = j;
    kept_mass = mass_before;
  }
  const double target = static_cast<double>(u) * kept_mass;
  double cumulative = 0.0;
  for (size_t j = 0; j < num_kept; ++j) {
    cumulative += sorted[j].weight;
    if (cumulative > target) return sorted[j].id;
  }
  // Reached only when rounding leaves the walked mass a hair short of the total.
  return sorted[num_kept - 1].id;
}

// The same draw for large candidate sets without sorting them: a histogram of weight buckets
// (descending bucket = descending weight) locates the bucket holding the top-p cut and the bucket
// holding the draw, and only those buckets are gathered and sorted. Cost O(n + bucket sizes).
int32_t draw_from_buckets(const std::vector<Candidate>& candidates, float top_p, float u) {
  thread_local std::vector<double> mass;
  thread_local std::vector<uint32_t> count;
  thread_local std::vector<Candidate> group;
  mass.assign(kNumBuckets, 0.0);
  count.assign(kNumBuckets, 0);
  for (const Candidate& c : candidates) {
    const uint32_t b = bucket_of(c.weight);
    mass[b] += c.weight;
    ++count[b];
  }
  double total = 0.0;
  int lowest = -1;
  for (int b = static_cast<int>(kNumBuckets) - 1; b >= 0; --b) {
    if (count[b] == 0) continue;
    total += mass[b];
    lowest = b;
  }
  ORIGAMI_CHECK(lowest >= 0);

  int group_bucket = -1;  // which bucket `group` holds, sorted
  auto gather = [&](int b) {
    if (group_bucket == b) return;
    group.clear();
    for (const Candidate& c : candidates)
      if (bucket_of(c.weight) == static_cast<uint32_t>(b)) group.push_back(c);
    std::sort(group.begin(), group.end(), ranks_before);
    group_bucket = b;
  };

  // Tokens in buckets above `boundary` are all kept; in `boundary`, its first num_kept_in_boundary.
  int boundary = lowest;
  size_t num_kept_in_boundary = count[lowest];
  double kept_mass = total;
  if (top_p < 1.0f) {
    const double cut = static_cast<double>(top_p) * total;
    double mass_before = 0.0;
    for (int b = static_cast<int>(kNumBuckets) - 1; b >= lowest; --b) {
      if (count[b] == 0) continue;
      if (mass_before + mass[b] >= cut || b == lowest) {
        boundary = b;
        break;
      }
      mass_before += mass[b];
    }
    gather(boundary);
    size_t j = 0;
    for (; j < group.size() && mass_before < cut; ++j) mass_before += group[j].weight;
    num_kept_in_boundary = j;
    kept_mass = mass_before;
  }

  const double target = static_cast<double>(u) * kept_mass;
  double cumulative = 0.0;
  for (int b = static_cast<int>(kNumBuckets) - 1; b > boundary; --b) {
    if (count[b] == 0) continue;
    if (cumulative + mass[b] > target) {
      gather(b);
      for (const Candidate& c : group) {
        cumulative += c.weight;
        if (cumulative > target) return c.id;
      }
      return group.back().id;  // the bucket's mass, summed in id order, rounded up
    }
    cumulative += mass[b];
  }
  gather(boundary);
  for (size_t j = 0; j < num_kept_in_boundary; ++j) {
    cumulative += group[j].weight;
    if (cumulative > target) return group[j].id;
  }
  return group[num_kept_in_boundary - 1].id;
}

// The k highest sanitized logits as {logit, id} (ties to the lower id), unordered.
void select_top_k(const float* logits, int vocab_size, int k, std::vector<Candidate>* out) {
  out->clear();
  if (k <= kHeapTopKLimit) {
    // A heap whose front is the worst kept candidate. Ids arrive in ascending order, so a later
    // token displaces the front only with a strictly larger logit.
    float worst = -std::numeric_limits<float>::infinity();  // front's logit once the heap is full
    for (int i = 0; i < vocab_size; ++i) {
      const float x = sanitize(logits[i]);
      if (!(x > worst)) continue;  // the common case: one compare against a register
      if (out->size() < static_cast<size_t>(k)) {
        out->push_back({x, i});
        std::push_heap(out->begin(), out->end(), ranks_before);
        if (out->size() == static_cast<size_t>(k)) worst = out->front().weight;
      } else {
        std::pop_heap(out->begin(), out->end(), ranks_before);
        out->back() = {x, i};
        std::push_heap(out->begin(), out->end(), ranks_before);
        worst = out->front().weight;
      }
    }
    return;
  }
  for (int i = 0; i < vocab_size; ++i) {
    const float x = sanitize(logits[i]);
    if (x > -std::numeric_limits<float>::infinity()) out->push_back({x, i});
  }
  if (out->size() > static_cast<size_t>(k)) {
    std::nth_element(out->begin(), out->begin() + k, out->end(), ranks_before);
    out->resize(static_cast<size_t>(k));
  }
}

}  // namespace

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float sampling_uniform(uint64_t seed, uint64_t index) {
  const uint64_t key = mix64(seed + kGolden);
  const uint64_t bits = mix64(key + (index + 1) * kGolden);
  return static_cast<float>(bits >> 40) * 0x1.0p-24f;
}

uint64_t resolve_seed(const SamplingParams& params, uint64_t engine_seed, uint64_t request_counter) {
  if (params.seed.has_value()) return *params.seed;
  return mix64(mix64(engine_seed ^ kEngineSeedSalt) + (request_counter + 1) * kGolden);
}

int32_t greedy_token(const float* logits, int vocab_size) {
  // One pass in blocks: a vectorized block max, and only for a block that beats the best so far
  // a rescan of that block (in L1) for its first maximal index. Strict '>' between blocks and
  // the first match within one keep ties at the lowest id; NaN never compares greater.
  constexpr int kBlock = 64;
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (int start = 0; start < vocab_size; start += kBlock) {
    const int len = std::min(kBlock, vocab_size - start);
    const float block_max = max_logit_of(logits + start, len);
    if (block_max > best_value) {
      best_value = block_max;
      for (int i = start; i < start + len; ++i) {
        if (logits[i] == block_max) {
          best = i;
          break;
        }
      }
    }
  }
  return std::isfinite(best_value) ? best : kNonFiniteLogits;
}

int32_t sample_token(const float* logits, int vocab_size, const SamplingParams& params, uint64_t seed,
                     uint64_t sample_index) {
  ORIGAMI_CHECK(vocab_size > 0);
  if (params.is_greedy()) return greedy_token(logits, vocab_size);

  float max_logit = max_logit_of(logits, vocab_size);
  if (!std::isfinite(max_logit)) return kNonFiniteLogits;

  const float inv_temperature = 1.0f / params.temperature;
  const float min_p = params.min_p;
  thread_local std::vector<Candidate> candidates;
  if (params.top_k > 0 && params.top_k < vocab_size) {
    // Top-k needs only the k largest logits, and min-p is relative to the top token, so the
    // other tokens' exponentials are never computed.
    select_top_k(logits, vocab_size, params.top_k, &candidates);
    size_t kept = 0;
    for (const Candidate& c : candidates) {
      const float w = exp_nonpositive((c.weight - max_logit) * inv_temperature);
      if (w > 0.0f && w >= min_p) candidates[kept++] = {w, c.id};
    }
    candidates.resize(kept);
  } else {
    thread_local std::vector<float> weights;  // [vocab_size]
    weights.resize(static_cast<size_t>(vocab_size));
    float* __restrict w_out = weights.data();
    for (int i = 0; i < vocab_size; ++i)
      w_out[i] = exp_nonpositive((sanitize(logits[i]) - max_logit) * inv_temperature);
    candidates.clear();
    candidates.reserve(static_cast<size_t>(vocab_size));
    for (int i = 0; i < vocab_size; ++i) {
      // p >= min_p * p_max is w >= min_p since the top token weighs 1; zero weights can never
      // be drawn, so they are dropped here.
      const float w = weights[i];
      if (w > 0.0f && w >= min_p) candidates.push_back({w, i});
    }
  }
  // The top token has weight 1 and survives every filter.
  ORIGAMI_CHECK(!candidates.empty());

  const float u = sampling_uniform(seed, sample_index);
  if (candidates.size() <= kSortAllLimit) {
    std::sort(candidates.begin(), candidates.end(), ranks_before);
    return draw_from_sorted(candidates, params.top_p, u);
  }
  return draw_from_buckets(candidates, params.top_p, u);
}

}  // namespace origami
