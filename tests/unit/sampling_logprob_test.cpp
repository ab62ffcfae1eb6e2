// token_logprobs (sampling/logprob.h) against a brute force: log_softmax of the whole row in
// long double and a full sort by (log-prob desc, id asc), on random rows with ties, NaN and
// -inf entries, and a row without any finite logit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "sampling/logprob.h"

namespace origami {
namespace {

std::vector<long double> brute_log_softmax(const std::vector<float>& row) {
  long double m = -INFINITY;
  for (float x : row)
    if (!std::isnan(x)) m = std::max<long double>(m, x);
  std::vector<long double> out(row.size(), -INFINITY);
  if (std::isinf(m) && m < 0) return out;
  long double sum = 0;
  for (float x : row)
    if (!std::isnan(x)) sum += std::exp(static_cast<long double>(x) - m);
  for (size_t i = 0; i < row.size(); ++i)
    if (!std::isnan(row[i])) out[i] = static_cast<long double>(row[i]) - m - std::log(sum);
  return out;
}

void expect_matches(const std::vector<float>& row, int32_t token, int k) {
  const int vocab = static_cast<int>(row.size());
  const std::vector<long double> want = brute_log_softmax(row);
  const TokenLogprobs got = token_logprobs(row.data(), vocab, token, k);
  auto near = [](float g, long double w) {
    return std::isinf(w) ? g == w : std::fabs(g - static_cast<double>(w)) <= 1e-5 * std::max(1.0, std::fabs(double(w)));
  };
  EXPECT_TRUE(near(got.logprob, want[token])) << got.logprob << " vs " << static_cast<double>(want[token]);
  EXPECT_EQ(got.logprob, log_softmax_at(row.data(), vocab, token));
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return want[a] > want[b]; });
  ASSERT_EQ(static_cast<int>(got.top.size()), std::min({k, vocab, kMaxTopLogprobs}));
  for (size_t j = 0; j < got.top.size(); ++j) {
    EXPECT_EQ(got.top[j].token, order[j]) << "rank " << j << " of vocab " << vocab;
    EXPECT_TRUE(near(got.top[j].logprob, want[order[j]])) << "rank " << j;
  }
}

TEST(SamplingLogprob, TokenAndTopKMatchBruteForce) {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int vocab : {1, 2, 7, 97, 1000, 5003}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> row(vocab);
      for (float& x : row) x = dist(rng);
      if (vocab > 10) {
        row[1] = -INFINITY;
        row[4] = NAN;
        row[vocab - 1] = row[6] = row[2] = 9.0f + trial;  // ties at the top go to the lower id
      }
      const int32_t token = static_cast<int32_t>(rng() % vocab);
      for (int k : {0, 1, 3, kMaxTopLogprobs}) expect_matches(row, token, k);
    }
  }
}

TEST(SamplingLogprob, RowWithoutFiniteLogitsIsMinusInfinity) {
  const std::vector<float> row = {NAN, -INFINITY, NAN, -INFINITY};
  const TokenLogprobs got = token_logprobs(row.data(), 4, 2, 3);
  EXPECT_EQ(got.logprob, -INFINITY);
  ASSERT_EQ(got.top.size(), 3u);
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(got.top[j].token, j);
    EXPECT_EQ(got.top[j].logprob, -INFINITY);
  }
}

TEST(SamplingLogprob, NoTokenIsNaNAndTopIsClamped) {
  const std::vector<float> row = {1.0f, 2.0f, 3.0f};
  const TokenLogprobs got = token_logprobs(row.data(), 3, -1, 50);
  EXPECT_TRUE(std::isnan(got.logprob));
  ASSERT_EQ(got.top.size(), 3u);
  EXPECT_EQ(got.top[0].token, 2);
  EXPECT_EQ(got.top[2].token, 0);
}

}  // namespace
}  // namespace origami
