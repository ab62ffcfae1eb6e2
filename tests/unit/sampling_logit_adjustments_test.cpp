// LogitAdjustments (penalties, logit_bias, min_tokens) against a brute force written from vLLM's
// definitions: a full-vocabulary loop over random logits and random prompt / output histories,
// bit for bit, then greedy and seeded draws through the existing sampler.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "sampling/logit_adjustments.h"
#include "unit/logit_adjustments_reference.h"
#include "sampling/sampler.h"

namespace origami {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
using testing::reference_adjusted;

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0 || (a == 0.0f && b == 0.0f); }

TEST(LogitAdjustments, MatchesVllmDefinitionsOnRandomHistories) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int greedy_changed = 0, sampled_changed = 0, checks = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int vocab = 64 + static_cast<int>(rng() % 1500);
    // Small vocabularies repeat tokens a lot; large ones exercise sparse entries.
    const int token_range = trial % 3 == 0 ? std::min(vocab, 40) : vocab;
    auto token = [&] { return static_cast<int32_t>(rng() % token_range); };
    SamplingParams p;
    p.repetition_penalty = trial % 4 == 0 ? 1.0f : 0.3f + 1.7f * unit(rng);
    p.frequency_penalty = trial % 5 == 1 ? 0.0f : -2.0f + 4.0f * unit(rng);
    p.presence_penalty = trial % 5 == 2 ? 0.0f : -2.0f + 4.0f * unit(rng);
    p.max_tokens = 64;
    p.min_tokens = static_cast<int>(rng() % 12);
    p.ignore_eos = trial % 2 == 0;
    for (int i = 0; i < 3; ++i) {
      const int32_t t = token();
      if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), t) == p.stop_token_ids.end())
        p.stop_token_ids.push_back(t);
    }
    const int num_bias = static_cast<int>(rng() % 8);
    for (int i = 0; i < num_bias; ++i) {
      const int32_t t = token();
      bool seen = false;
      for (const auto& e : p.logit_bias) seen = seen || e.first == t;
      if (!seen) p.logit_bias.emplace_back(t, i == 0 ? 100.0f * (unit(rng) < 0.5f ? 1.0f : -1.0f) : -5.0f + 10.0f * unit(rng));
    }
    p.temperature = trial % 2 == 0 ? 0.0f : 0.7f + unit(rng);
    p.top_k = trial % 3 == 1 ? 20 : 0;
    p.top_p = trial % 3 == 2 ? 0.9f : 1.0f;
    ASSERT_TRUE(p.validate().is_ok()) << p.validate().to_string();
    const std::vector<int32_t> eos = {token(), token()};
    std::vector<int32_t> prompt(5 + rng() % 60);
    for (int32_t& t : prompt) t = token();

    LogitAdjustments adj(p, prompt, eos, vocab);
    std::vector<int32_t> output;
    const int steps = 1 + static_cast<int>(rng() % 30);
    for (int step = 0; step < steps; ++step) {
      std::vector<float> raw(static_cast<size_t>(vocab));
      for (float& x : raw) x = normal(rng);
      const std::vector<float> want = reference_adjusted(raw, p, prompt, output, eos);
      std::vector<float> got = raw;
      adj.apply(got.data());
      for (int t = 0; t < vocab; ++t)
        ASSERT_TRUE(same_bits(got[t], want[t]))
            << "trial " << trial << " step " << step << " token " << t << ": " << got[t] << " vs " << want[t];
      // The sampler on the adjusted row draws what it draws on the reference row.
      const uint64_t seed = rng();
      const int32_t from_adjusted = sample_token(got.data(), vocab, p, seed, static_cast<uint64_t>(step));
      ASSERT_EQ(from_adjusted, sample_token(want.data(), vocab, p, seed, static_cast<uint64_t>(step)));
      ASSERT_EQ(greedy_token(got.data(), vocab), greedy_token(want.data(), vocab));
      const int32_t from_raw = sample_token(raw.data(), vocab, p, seed, static_cast<uint64_t>(step));
      (p.is_greedy() ? greedy_changed : sampled_changed) += from_raw != from_adjusted;
      ++checks;
      const int32_t next = token();
      output.push_back(next);
      adj.add_output_token(next);
    }
  }
  // The adjustments are not vacuous: they change many greedy and sampled tokens.
  EXPECT_GT(greedy_changed, 10) << checks;
  EXPECT_GT(sampled_changed, 10) << checks;
}

TEST(LogitAdjustments, DefaultsHaveNoEntries) {
  SamplingParams p;
  const std::vector<int32_t> prompt = {1, 2, 3}, eos = {0};
  LogitAdjustments adj(p, prompt, eos, 10);
  EXPECT_TRUE(adj.empty());
  adj.add_output_token(4);
  EXPECT_TRUE(adj.empty());
  // A repetition penalty of exactly 1 needs no prompt entries either.
  p.frequency_penalty = 0.5f;
  LogitAdjustments freq(p, prompt, eos, 10);
  EXPECT_TRUE(freq.empty());
  freq.add_output_token(4);
  ASSERT_EQ(freq.entries().size(), 1u);
  EXPECT_EQ(freq.entries()[0].token, 4);
  EXPECT_EQ(freq.entries()[0].flags, 0u);
}

TEST(LogitAdjustments, MinTokensMasksStopsUntilReachedThenLeavesNoEntries) {
  SamplingParams p;
  p.min_tokens = 2;
  p.stop_token_ids = {5, 99};  // 99 is outside the vocabulary: never sampled, not masked
  const std::vector<int32_t> prompt = {1}, eos = {0};
  LogitAdjustments adj(p, prompt, eos, 10);
  std::vector<float> logits(10, 1.0f);
  adj.apply(logits.data());
  EXPECT_EQ(logits[0], -kInf);
  EXPECT_EQ(logits[5], -kInf);
  EXPECT_EQ(logits[1], 1.0f);
  adj.add_output_token(3);
  logits.assign(10, 1.0f);
  adj.apply(logits.data());
  EXPECT_EQ(logits[0], -kInf);
  adj.add_output_token(3);
  EXPECT_TRUE(adj.empty());  // the mask lifted with the second token
  p.ignore_eos = true;  // EOS is no stop then; stop_token_ids still are
  LogitAdjustments no_eos(p, prompt, eos, 10);
  logits.assign(10, 1.0f);
  no_eos.apply(logits.data());
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[5], -kInf);
}

TEST(LogitAdjustments, PenaltiesFollowTheirDefinitions) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.25f;
  p.presence_penalty = 1.0f;
  p.logit_bias = {{7, 100.0f}};
  const std::vector<int32_t> prompt = {1, 2}, eos = {};
  LogitAdjustments adj(p, prompt, eos, 10);
  adj.add_output_token(3);
  adj.add_output_token(3);
  adj.add_output_token(2);
  std::vector<float> l = {0.0f, 4.0f, -4.0f, 4.0f, 4.0f, 0.0f, 0.0f, -3.0f, 0.0f, 0.0f};
  adj.apply(l.data());
  EXPECT_EQ(l[1], 2.0f);                  // prompt only: repetition (positive: divided)
  EXPECT_EQ(l[2], -8.0f - 0.25f - 1.0f);  // prompt and output once: negative times r, then f, p
  EXPECT_EQ(l[3], 2.0f - 0.5f - 1.0f);    // output twice
  EXPECT_EQ(l[4], 4.0f);                  // untouched
  EXPECT_EQ(l[7], 97.0f);                 // bias
  EXPECT_EQ(greedy_token(l.data(), 10), 7);
}

TEST(SamplingParamsValidate, PenaltyBoundsAndLogitBias) {
  auto error = [](auto edit) {
    SamplingParams p;
    edit(p);
    const Status st = p.validate();
    return st.is_ok() ? std::string() : st.message();
  };
  EXPECT_EQ(error([](SamplingParams& p) { p.presence_penalty = 2.0f; p.frequency_penalty = -2.0f; }), "");
  EXPECT_NE(error([](SamplingParams& p) { p.presence_penalty = 2.5f; }).find("presence_penalty"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.frequency_penalty = NAN; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.repetition_penalty = 0.0f; }).find("repetition_penalty"), std::string::npos);
  EXPECT_EQ(error([](SamplingParams& p) { p.repetition_penalty = 3.0f; }), "");  // vLLM: any r > 0
  EXPECT_NE(error([](SamplingParams& p) { p.min_tokens = -1; }).find("min_tokens"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.min_tokens = 17; }).find("max_tokens"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.logit_bias = {{3, 100.5f}}; }).find("logit_bias[3]"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) { p.logit_bias = {{3, 1.0f}, {3, 2.0f}}; }).find("repeat"), std::string::npos);
  EXPECT_NE(error([](SamplingParams& p) {
              for (int i = 0; i < 301; ++i) p.logit_bias.emplace_back(i, 1.0f);
            }).find("300"),
            std::string::npos);
}

}  // namespace
}  // namespace origami
