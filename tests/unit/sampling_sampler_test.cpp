// sample_token() against an independent brute-force model of the filtered distribution (full
// sort, double precision), plus greedy, NaN handling, determinism and the RNG's uniformity.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "sampling/sampler.h"

namespace origami {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The distribution sample_token must draw from: softmax(logits / T), min-p on those
// probabilities, top-k by rank, top-p over the renormalised survivors, renormalised.
// `margin` reports how close the min-p / top-p decisions came to flipping (the test logits must
// keep clear of them, or float and double could legitimately disagree).
std::vector<double> brute_force_distribution(const std::vector<float>& logits, const SamplingParams& p,
                                             double* margin = nullptr) {
  const size_t n = logits.size();
  double mx = -INFINITY;
  for (float x : logits) if (!std::isnan(x)) mx = std::max(mx, static_cast<double>(x));
  std::vector<double> prob(n, 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    prob[i] = std::isnan(logits[i]) ? 0.0 : std::exp((logits[i] - mx) / p.temperature);
    sum += prob[i];
  }
  for (double& v : prob) v /= sum;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
  const double p_max = prob[order[0]];
  double closest = INFINITY;
  std::vector<int> kept;
  for (size_t r = 0; r < n; ++r) {
    const int id = order[r];
    if (prob[id] == 0.0) continue;
    if (p.min_p > 0) closest = std::min(closest, std::abs(prob[id] - p.min_p * p_max));
    if (prob[id] < p.min_p * p_max) continue;
    if (p.top_k > 0 && static_cast<int>(r) >= p.top_k) continue;
    kept.push_back(id);
  }
  double kept_sum = 0.0;
  for (int id : kept) kept_sum += prob[id];
  if (p.top_p < 1.0f) {
    double before = 0.0;
    size_t keep = 0;
    for (; keep < kept.size(); ++keep) {
      closest = std::min(closest, std::abs(before / kept_sum - p.top_p));
      if (before / kept_sum >= p.top_p) break;
      before += prob[kept[keep]];
    }
    kept.resize(keep);
  }
  std::vector<double> dist(n, 0.0);
  double total = 0.0;
  for (int id : kept) total += prob[id];
  for (int id : kept) dist[id] = prob[id] / total;
  if (margin) *margin = closest;
  return dist;
}

std::vector<double> empirical(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed, int draws) {
  std::vector<double> freq(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    const int32_t t = sample_token(logits.data(), static_cast<int>(logits.size()), p, seed, static_cast<uint64_t>(i));
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(logits.size()));
    freq[t] += 1.0;
  }
  for (double& f : freq) f /= draws;
  return freq;
}

SamplingParams make(float temperature, int top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  return p;
}

const std::vector<float> kLogits = {1.3f, 2.0f, -0.4f, 1.55f, 0.2f, -1.7f, 0.9f, -3.0f, 0.55f, 1.1f};

void check_against_brute_force(const SamplingParams& p, uint64_t seed) {
  double margin = 0.0;
  const std::vector<double> expected = brute_force_distribution(kLogits, p, &margin);
  ASSERT_GT(margin, 1e-3) << "test logits sit too close to a filter boundary";
  const int kDraws = 20000;
  const std::vector<double> got = empirical(kLogits, p, seed, kDraws);
  double chi2 = 0.0;
  int dof = -1;
  for (size_t i = 0; i < kLogits.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(got[i], 0.0) << "token " << i << " is outside the filtered set but was drawn";
      continue;
    }
    EXPECT_NEAR(got[i], expected[i], 0.015) << "token " << i;
    chi2 += kDraws * (got[i] - expected[i]) * (got[i] - expected[i]) / expected[i];
    ++dof;
  }
  // 99.9th percentile of chi-square with <= 9 degrees of freedom is <= 27.9.
  EXPECT_LT(chi2, 27.9) << "dof " << dof;
}

TEST(SamplingSampler, TemperatureMatchesBruteForce) { check_against_brute_force(make(0.7f, 0, 1.0f, 0.0f), 11); }
TEST(SamplingSampler, PlainSoftmaxMatchesBruteForce) { check_against_brute_force(make(1.0f, -1, 1.0f, 0.0f), 12); }
TEST(SamplingSampler, TopKMatchesBruteForce) { check_against_brute_force(make(1.0f, 3, 1.0f, 0.0f), 13); }
TEST(SamplingSampler, TopPMatchesBruteForce) { check_against_brute_force(make(1.0f, 0, 0.8f, 0.0f), 14); }
TEST(SamplingSampler, MinPMatchesBruteForce) { check_against_brute_force(make(1.0f, 0, 1.0f, 0.2f), 15); }
TEST(SamplingSampler, CombinedMatchesBruteForce) { check_against_brute_force(make(0.8f, 6, 0.7f, 0.1f), 16); }
TEST(SamplingSampler, HotCombinedMatchesBruteForce) { check_against_brute_force(make(1.6f, 8, 0.9f, 0.05f), 17); }

// top-p applied after min-p and top-k renormalise: with top_k = 4, top_p = 0.6 keeps a different
// set than top-p over the whole softmax would.
TEST(SamplingSampler, TopPIsTakenOverTopKSurvivors) {
  const SamplingParams p = make(1.0f, 4, 0.6f, 0.0f);
  const std::vector<double> dist = brute_force_distribution(kLogits, p);
  const std::vector<double> top_p_only = brute_force_distribution(kLogits, make(1.0f, 0, 0.6f, 0.0f));
  int kept = 0, kept_p_only = 0;
  for (size_t i = 0; i < dist.size(); ++i) { kept += dist[i] > 0; kept_p_only += top_p_only[i] > 0; }
  ASSERT_NE(kept, kept_p_only);  // the scenario really distinguishes the two orders
  check_against_brute_force(p, 21);
}

// Many tokens and a flat distribution: the top-p cut lies thousands of ranks deep, so the sorted
// prefix grows over several selection rounds. Draws must stay inside the brute-force set and
// follow its mass rank by rank (in 10 buckets of the brute-force order).
TEST(SamplingSampler, LargeVocabTopPFollowsBruteForceByRankBuckets) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.6f);
  std::vector<float> logits(6000);
  for (float& x : logits) x = normal(rng);
  logits[17] = kNaN;
  const SamplingParams p = make(1.0f, 0, 0.9f, 0.0f);
  const std::vector<double> dist = brute_force_distribution(logits, p);
  std::vector<int> order;
  for (size_t i = 0; i < logits.size(); ++i) if (dist[i] > 0) order.push_back(static_cast<int>(i));
  ASSERT_GT(order.size(), 2000u);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return dist[a] > dist[b] || (dist[a] == dist[b] && a < b); });
  std::vector<int> bucket_of(logits.size(), -1);
  std::vector<double> expected(10, 0.0), got(10, 0.0);
  for (size_t r = 0; r < order.size(); ++r) {
    const int b = static_cast<int>(r * 10 / order.size());
    bucket_of[order[r]] = b;
    expected[b] += dist[order[r]];
  }
  const int kDraws = 20000;
  for (int i = 0; i < kDraws; ++i) {
    const int32_t t = sample_token(logits.data(), static_cast<int>(logits.size()), p, 99, i);
    ASSERT_GE(bucket_of[t], 0) << "token " << t << " is outside the top-p set";
    got[bucket_of[t]] += 1.0 / kDraws;
  }
  for (int b = 0; b < 10; ++b) EXPECT_NEAR(got[b], expected[b], 0.015) << "bucket " << b;
}

// The exact draw: with u = sampling_uniform(seed, index), the token is where u * (kept mass)
// falls in the brute-force CDF walked in descending probability, ties by id. Only a draw landing
// within float rounding of a CDF step may differ. Covers the sorted path (small sets), the
// bucketed path (large sets), and the heap and nth_element top-k selections.
// The brute-force CDF: token ids in descending probability (ties by id) and cumulative mass.
struct BruteForceCdf {
  std::vector<int> order;
  std::vector<double> cumulative;
  explicit BruteForceCdf(const std::vector<double>& dist) {
    for (size_t i = 0; i < dist.size(); ++i) if (dist[i] > 0) order.push_back(static_cast<int>(i));
    std::sort(order.begin(), order.end(), [&](int a, int b) { return dist[a] > dist[b] || (dist[a] == dist[b] && a < b); });
    double c = 0.0;
    for (int id : order) cumulative.push_back(c += dist[id]);
  }
  int32_t draw(float u) const {
    const size_t j = std::upper_bound(cumulative.begin(), cumulative.end(), static_cast<double>(u)) - cumulative.begin();
    return order[std::min(j, order.size() - 1)];
  }
};

TEST(SamplingSampler, DrawIsTheInverseCdfOfTheSortedFilteredDistribution) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.5f);
  std::vector<float> big(20000);
  for (float& x : big) x = normal(rng);
  struct Case { const std::vector<float>* logits; SamplingParams p; };
  const Case cases[] = {
      {&kLogits, make(1.0f, 0, 1.0f, 0.0f)},   {&kLogits, make(0.7f, 4, 0.8f, 0.05f)},
      {&big, make(1.0f, 0, 1.0f, 0.0f)},       {&big, make(0.8f, 0, 0.9f, 0.0f)},
      {&big, make(1.0f, 0, 1.0f, 0.01f)},      {&big, make(1.2f, 40, 0.95f, 0.0f)},
      {&big, make(1.0f, 3000, 0.9f, 0.0f)},    {&big, make(1.0f, 9000, 1.0f, 0.001f)},
  };
  for (const Case& c : cases) {
    const BruteForceCdf cdf(brute_force_distribution(*c.logits, c.p));
    const int kDraws = 2000;
    int mismatches = 0;
    for (int i = 0; i < kDraws; ++i) {
      const float u = sampling_uniform(31, i);
      const int32_t t = sample_token(c.logits->data(), static_cast<int>(c.logits->size()), c.p, 31, i);
      mismatches += t != cdf.draw(u);
    }
    EXPECT_LE(mismatches, 2) << "vocab " << c.logits->size() << " T " << c.p.temperature << " top_k " << c.p.top_k
                             << " top_p " << c.p.top_p << " min_p " << c.p.min_p;
  }
}

TEST(SamplingSampler, TiesAtTheTopKBoundaryKeepLowestIds) {
  const std::vector<float> flat(8, 0.5f);
  const SamplingParams p = make(1.0f, 3, 1.0f, 0.0f);
  const std::vector<double> freq = empirical(flat, p, 5, 6000);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(freq[i], 1.0 / 3.0, 0.03);
  for (int i = 3; i < 8; ++i) EXPECT_EQ(freq[i], 0.0);
}

TEST(SamplingSampler, GreedyIsArgmaxWithTiesToLowestId) {
  const std::vector<float> logits = {0.1f, 3.0f, -2.0f, 3.0f, 2.9f};
  SamplingParams p = make(0.0f, 0, 1.0f, 0.0f);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(sample_token(logits.data(), 5, p, 1234, i), 1);
  p = make(0.9f, 1, 1.0f, 0.0f);  // top_k = 1 is greedy too
  EXPECT_EQ(sample_token(logits.data(), 5, p, 1, 0), 1);
  p = make(1e-7f, 0, 0.5f, 0.0f);  // below the greedy temperature
  EXPECT_EQ(sample_token(logits.data(), 5, p, 1, 0), 1);
}

TEST(SamplingSampler, GreedyTreatsNaNAsMinusInfinity) {
  const std::vector<float> logits = {kNaN, -1.0f, kNaN, 4.0f, kNaN, 4.0f};
  EXPECT_EQ(greedy_token(logits.data(), 6), 3);
  const std::vector<float> nan_first = {kNaN, kNaN, -5.0f};
  EXPECT_EQ(greedy_token(nan_first.data(), 3), 2);
}

// A row without a finite maximum (all NaN, as all-NaN weights give, or NaN / -inf, or a +inf)
// has no meaningful token: the sampler says so instead of returning token 0 (which decoded
// forever with exit 0), greedy or not.
TEST(SamplingSampler, NonFiniteMaximumIsReportedNotToken0) {
  const std::vector<float> all_nan(1000, kNaN);
  const std::vector<float> all_bad = {-kInf, kNaN, -kInf, kNaN};
  const std::vector<float> pos_inf = {1.0f, kInf, 2.0f, kNaN};
  for (const auto* row : {&all_nan, &all_bad, &pos_inf}) {
    const int n = static_cast<int>(row->size());
    EXPECT_EQ(greedy_token(row->data(), n), kNonFiniteLogits);
    EXPECT_EQ(sample_token(row->data(), n, SamplingParams{}, 3, 0), kNonFiniteLogits);
    EXPECT_EQ(sample_token(row->data(), n, make(0.0f, 0, 1.0f, 0.0f), 3, 0), kNonFiniteLogits);
    EXPECT_EQ(sample_token(row->data(), n, make(0.8f, 5, 0.9f, 0.05f), 3, 0), kNonFiniteLogits);
  }
  // Some NaN among finite logits keeps the documented meaning (NaN = -inf).
  const std::vector<float> some_nan = {kNaN, 0.5f, kNaN};
  EXPECT_EQ(greedy_token(some_nan.data(), 3), 1);
  EXPECT_EQ(sample_token(some_nan.data(), 3, make(1.0f, 0, 1.0f, 0.0f), 3, 0), 1);
}

// Large rows (several internal blocks), NaNs sprinkled in, ties placed across blocks: greedy
// equals a plain scalar argmax.
TEST(SamplingSampler, GreedyMatchesScalarArgmaxOnLargeRows) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> uni(-10.0f, 10.0f);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 20000);
    std::vector<float> logits(n);
    for (float& x : logits) x = uni(rng);
    for (int j = 0; j < n / 50; ++j) logits[rng() % n] = kNaN;
    const int num_ties = static_cast<int>(rng() % 3);
    for (int j = 0; j < num_ties; ++j) logits[rng() % n] = 11.0f;
    int32_t expected = 0;
    float best = -kInf;
    for (int i = 0; i < n; ++i) if (logits[i] > best) { best = logits[i]; expected = i; }
    EXPECT_EQ(greedy_token(logits.data(), n), expected) << "n " << n;
    EXPECT_EQ(sample_token(logits.data(), n, make(0.0f, 0, 1.0f, 0.0f), 1, 0), expected);
  }
}

TEST(SamplingSampler, RandomSamplingNeverDrawsNaNOrMinusInfinity) {
  std::vector<float> logits = {kNaN, 0.0f, -kInf, 0.0f, kNaN, 0.0f};
  for (const SamplingParams& p : {make(1.0f, 0, 1.0f, 0.0f), make(2.0f, 5, 1.0f, 0.0f), make(1.0f, 0, 0.95f, 0.0f)}) {
    std::set<int> seen;
    for (uint64_t i = 0; i < 3000; ++i) seen.insert(sample_token(logits.data(), 6, p, 8, i));
    EXPECT_EQ(seen, (std::set<int>{1, 3, 5}));
  }
  // A +inf logit is an overflow, not a certainty: NonFiniteMaximumIsReportedNotToken0.
  const std::vector<float> one_inf = {0.0f, kInf, 1.0f};
  for (uint64_t i = 0; i < 100; ++i) EXPECT_EQ(sample_token(one_inf.data(), 3, SamplingParams{}, 2, i), kNonFiniteLogits);
}

TEST(SamplingSampler, SameSeedAndIndexGiveSameToken) {
  const SamplingParams p = make(1.5f, 0, 1.0f, 0.0f);
  std::vector<int32_t> first;
  for (uint64_t i = 0; i < 200; ++i) first.push_back(sample_token(kLogits.data(), 10, p, 42, i));
  // Interleave other requests' draws (other seeds, settings and vocab sizes): nothing carries over.
  std::vector<float> big(5000, 0.0f);
  for (uint64_t i = 0; i < 200; ++i) {
    (void)sample_token(big.data(), 5000, make(1.0f, 0, 0.5f, 0.0f), 7, i);
    EXPECT_EQ(sample_token(kLogits.data(), 10, p, 42, i), first[i]) << "index " << i;
  }
  // Different indices give different draws: not all equal, and several distinct tokens.
  const std::set<int32_t> distinct(first.begin(), first.end());
  EXPECT_GE(distinct.size(), 5u);
  // A different seed gives a different sequence.
  int same = 0;
  for (uint64_t i = 0; i < 200; ++i) same += sample_token(kLogits.data(), 10, p, 43, i) == first[i];
  EXPECT_LT(same, 100);
}

TEST(SamplingUniform, InUnitIntervalAndRoughlyUniform) {
  const int kBins = 20, kN = 400000;
  std::vector<int> hist(kBins, 0);
  double sum = 0.0;
  for (int i = 0; i < kN; ++i) {
    const float u = sampling_uniform(12345, static_cast<uint64_t>(i));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
    ++hist[static_cast<int>(u * kBins)];
  }
  EXPECT_NEAR(sum / kN, 0.5, 0.005);
  double chi2 = 0.0;
  const double e = static_cast<double>(kN) / kBins;
  for (int h : hist) chi2 += (h - e) * (h - e) / e;
  EXPECT_LT(chi2, 43.8);  // 99.9th percentile, 19 degrees of freedom
  // Successive indices are not correlated (lag-1 correlation near 0).
  double c = 0.0;
  for (int i = 0; i < kN - 1; ++i) c += (sampling_uniform(12345, i) - 0.5) * (sampling_uniform(12345, i + 1) - 0.5);
  EXPECT_NEAR(c / (kN - 1) * 12.0, 0.0, 0.02);
}

TEST(SamplingUniform, DependsOnSeedAndIndexOnly) {
  EXPECT_EQ(sampling_uniform(1, 2), sampling_uniform(1, 2));
  int equal_across_seeds = 0, equal_across_indices = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    equal_across_seeds += sampling_uniform(1, i) == sampling_uniform(2, i);
    equal_across_indices += sampling_uniform(1, i) == sampling_uniform(1, i + 1);
  }
  EXPECT_LE(equal_across_seeds, 2);
  EXPECT_LE(equal_across_indices, 2);
  // The documented formula (what the CUDA kernel must reproduce), spelled out independently.
  const uint64_t golden = 0x9E3779B97F4A7C15ull;
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (uint64_t seed : {0ull, 1ull, 0xFFFFFFFFFFFFFFFFull}) {
    for (uint64_t i : {0ull, 1ull, 77ull, 1ull << 40}) {
      const uint64_t bits = mix(mix(seed + golden) + (i + 1) * golden);
      EXPECT_EQ(sampling_uniform(seed, i), static_cast<float>(bits >> 40) / 16777216.0f);
    }
  }
}

TEST(SamplingSeed, ResolveSeed) {
  SamplingParams p;
  p.seed = 77;
  EXPECT_EQ(resolve_seed(p, 5, 0), 77u);
  EXPECT_EQ(resolve_seed(p, 9, 3), 77u);
  p.seed.reset();
  // Reproducible for the same engine seed and counter, fresh across counters and engine seeds.
  EXPECT_EQ(resolve_seed(p, 5, 0), resolve_seed(p, 5, 0));
  std::set<uint64_t> seen;
  for (uint64_t c = 0; c < 1000; ++c) seen.insert(resolve_seed(p, 5, c));
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_NE(resolve_seed(p, 5, 0), resolve_seed(p, 6, 0));
}

// Not a test: timings for the report. Run with --gtest_also_run_disabled_tests.
TEST(SamplingSampler, DISABLED_MicroBenchmark) {
  const int vocab = 151936;
  std::mt19937 rng(3);
  // Roughly LLM-shaped logits: a broad bulk and a few strong candidates.
  std::normal_distribution<float> normal(0.0f, 2.5f);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  for (int i = 0; i < 20; ++i) logits[rng() % vocab] += 12.0f;
  struct Case { const char* name; SamplingParams p; };
  const Case cases[] = {{"greedy", make(0.0f, 0, 1.0f, 0.0f)},
                        {"temperature 1.0", make(1.0f, 0, 1.0f, 0.0f)},
                        {"top_p 0.9", make(1.0f, 0, 0.9f, 0.0f)},
                        {"top_k 50", make(1.0f, 50, 1.0f, 0.0f)},
                        {"top_k 50 + top_p 0.9", make(0.7f, 50, 0.9f, 0.0f)},
                        {"min_p 0.05", make(1.0f, 0, 1.0f, 0.05f)}};
  for (const Case& c : cases) {
    const int iters = 300;
    int64_t checksum = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) checksum += sample_token(logits.data(), vocab, c.p, 1, i);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
    std::printf("sample_token vocab %d %-22s %8.1f us/token (checksum %lld)\n", vocab, c.name, us,
                static_cast<long long>(checksum));
  }
  // A flat distribution: the top-p prefix runs deep into the vocabulary.
  std::vector<float> flat(vocab);
  std::normal_distribution<float> narrow(0.0f, 0.3f);
  for (float& x : flat) x = narrow(rng);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 50; ++i) (void)sample_token(flat.data(), vocab, make(1.0f, 0, 0.9f, 0.0f), 1, i);
  std::printf("sample_token vocab %d top_p 0.9 flat logits %8.1f us/token\n", vocab,
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 50);
}

}  // namespace
}  // namespace origami
