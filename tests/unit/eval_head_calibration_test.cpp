// The model-free parts of the head-budget calibration (eval/head_calibration.h): the per-layer
// non-uniform top-k against a brute force, its size, the mean + alpha * std summary, the
// scorers' recipes, and reading sample documents from text and JSONL files.
#include "eval/head_calibration.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <tuple>

#include "tokenizer/tokenizer.h"

namespace origami::eval {
namespace {

namespace fs = std::filesystem;
constexpr float kInf = std::numeric_limits<float>::infinity();

// The brute force: every (score, head, entry) ranked by score, then by head-major position
// (later wins ties, as the engine's select_keep), NaN lowest; the first k counted per head.
std::vector<int> brute_force_counts(const std::vector<std::vector<float>>& scores, int k) {
  std::vector<std::tuple<int, float, int, int>> all;  // (is_number, score, head, entry)
  for (int h = 0; h < static_cast<int>(scores.size()); ++h)
    for (int e = 0; e < static_cast<int>(scores[h].size()); ++e) {
      const float s = scores[h][e];
      all.emplace_back(std::isnan(s) ? 0 : 1, std::isnan(s) ? 0.0f : s, h, e);
    }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a > b; });
  std::vector<int> counts(scores.size(), 0);
  for (int i = 0; i < k; ++i) ++counts[std::get<2>(all[i])];
  return counts;
}

TEST(HeadCalibration, LayerTopKMatchesBruteForce) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int heads = 1 + static_cast<int>(rng() % 8), n = 1 + static_cast<int>(rng() % 60);
    std::vector<std::vector<float>> scores(heads, std::vector<float>(n));
    for (auto& head : scores)
      for (float& s : head) {
        const int kind = static_cast<int>(rng() % 10);
        s = kind == 0 ? 0.5f : kind == 1 ? kInf : kind == 2 ? std::nanf("") : u(rng);  // ties, protected, NaN
      }
    const int k = static_cast<int>(rng() % (heads * n + 1));
    const std::vector<int> counts = layer_topk_kept_counts(scores, k);
    ASSERT_EQ(counts, brute_force_counts(scores, k)) << "trial " << trial;
  }
}

TEST(HeadCalibration, TopKSizeKeepsEveryProtectedEntry) {
  // 2 heads x 10 entries, 3 protected in each: rho 0.25 -> ceil(5) = 5 < 6 protected -> 6.
  std::vector<std::vector<float>> scores(2, std::vector<float>(10, 0.1f));
  for (auto& head : scores)
    for (int e = 7; e < 10; ++e) head[e] = kInf;
  EXPECT_EQ(layer_topk_size(scores, 0.25), 6);
  EXPECT_EQ(layer_topk_size(scores, 0.5), 10);
  EXPECT_EQ(layer_topk_size(scores, 0.31), 7);  // ceil(6.2)
  EXPECT_EQ(layer_topk_size(scores, 1.0), 20);
  // 0.3 * 2 * 10 = 6.000000000000001 in doubles: still 6.
  EXPECT_EQ(layer_topk_size(scores, 0.3), 6);
  // Each head keeps its protected entries.
  for (int c : layer_topk_kept_counts(scores, 6)) EXPECT_EQ(c, 3);
}

TEST(HeadCalibration, MeasureAndSummarize) {
  // Layer 0: head 0 scores high everywhere, head 1 low: a top-k of 8 over 2 x 8 keeps all of
  // head 0's. Layer 1: the reverse.
  HeadScores scores(2, std::vector<std::vector<float>>(2, std::vector<float>(8)));
  for (int e = 0; e < 8; ++e) {
    scores[0][0][e] = 1.0f + e;
    scores[0][1][e] = 0.01f * e;
    scores[1][0][e] = 0.01f * e;
    scores[1][1][e] = 1.0f + e;
  }
  SampleRetention r = measure_retention(scores, 0.5);
  EXPECT_EQ(r.num_tokens, 8);
  EXPECT_EQ(r.kept_fraction, (std::vector<std::vector<double>>{{1.0, 0.0}, {0.0, 1.0}}));

  // Summary over three samples of head (0, 0): fractions 0.2, 0.3, 0.4 -> mean 0.3, std 0.1
  // (n - 1), B = 0.3 + 2 * 0.1 = 0.5. Head (0, 1) keeps nothing: B is one token of the longest
  // sample. Head (1, 0) at 0.9 +- 0.1: capped at 1.
  std::vector<SampleRetention> samples(3);
  const double f00[] = {0.2, 0.3, 0.4};
  for (int i = 0; i < 3; ++i) {
    samples[i].num_tokens = 100 + 100 * i;
    samples[i].kept_fraction = {{f00[i], 0.0}, {0.8 + 0.1 * i, 0.25}};
  }
  CalibrationOptions options;
  options.scorer = "snapkv";
  options.alpha = 2.0;
  options.rho = 0.4;
  ModelIdentity model{"qwen3", 2, 2, 4, 8, 32, 64};
  HeadBudgets b = summarize_retention(samples, options, model);
  ASSERT_TRUE(validate_head_budgets(b).is_ok()) << validate_head_budgets(b).message();
  EXPECT_NEAR(b.mean[0][0], 0.3, 1e-12);
  EXPECT_NEAR(b.stddev[0][0], 0.1, 1e-12);
  EXPECT_NEAR(b.ratios[0][0], 0.5, 1e-12);
  EXPECT_EQ(b.mean[0][1], 0.0);
  EXPECT_NEAR(b.ratios[0][1], 1.0 / 300, 1e-15);
  EXPECT_EQ(b.ratios[1][0], 1.0);
  EXPECT_NEAR(b.ratios[1][1], 0.25, 1e-12);  // no spread: B = mean
  EXPECT_EQ(b.sample_tokens, (std::vector<int>{100, 200, 300}));
  EXPECT_EQ(b.samples, 3);
  EXPECT_EQ(b.scorer, "snapkv");
  EXPECT_EQ(b.rho, 0.4);
  // One sample: no spread, B = its fractions.
  HeadBudgets one = summarize_retention({samples[0]}, options, model);
  EXPECT_EQ(one.stddev[0][0], 0.0);
  EXPECT_NEAR(one.ratios[0][0], 0.2, 1e-12);
}

TEST(HeadCalibration, ScorersAreTheRegisteredPoliciesRecipes) {
  Expected<ScoreRecipe> snap = calibration_recipe("snapkv");
  ASSERT_TRUE(snap.has_value());
  EXPECT_EQ(snap->scorer, Scorer::kAttention);
  EXPECT_EQ(snap->window, 32);
  EXPECT_EQ(snap->pool_kernel, 7);
  EXPECT_EQ(snap->pool_type, PoolType::kMax);
  EXPECT_EQ(calibration_recipe("keydiff")->scorer, Scorer::kKeyDiff);
  EXPECT_EQ(calibration_recipe("knorm")->scorer, Scorer::kKeyNorm);
  Expected<ScoreRecipe> bad = calibration_recipe("h2o");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("accepted: snapkv, keydiff, knorm"), std::string::npos);
}

class CalibrationSamples : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("origami_calib_samples_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
    ASSERT_TRUE(t.has_value()) << t.status().message();
    builder_ = std::make_unique<PromptBuilder>(*t);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  static std::string words(int count, const std::string& word) {
    std::string s;
    for (int i = 0; i < count; ++i) s += word + " ";
    return s;
  }

  fs::path dir_;
  std::unique_ptr<PromptBuilder> builder_;
};

TEST_F(CalibrationSamples, TextDocumentsAreCutAndTakenRoundRobin) {
  // Three documents separated by "\n\0\n": long, short (skipped), long.
  const std::string text = words(300, "river") + std::string("\n\0\n", 3) + "tiny" + std::string("\n\0\n", 3) +
                           words(300, "mountain");
  const std::string path = write("docs.txt", text);
  SampleReadOptions o;
  o.max_samples = 10;
  o.max_tokens = 100;
  o.min_tokens = 50;
  Expected<std::vector<CalibrationSample>> s = read_calibration_samples(path, *builder_, o);
  ASSERT_TRUE(s.has_value()) << s.status().message();
  ASSERT_GE(s->size(), 4u);
  // Round robin: document 0's first window, document 2's first window, then their second ones.
  EXPECT_NE((*s)[0].origin.find("document 0, tokens 0-99"), std::string::npos) << (*s)[0].origin;
  EXPECT_NE((*s)[1].origin.find("document 2, tokens 0-99"), std::string::npos) << (*s)[1].origin;
  EXPECT_NE((*s)[2].origin.find("document 0, tokens 100-199"), std::string::npos) << (*s)[2].origin;
  for (const CalibrationSample& c : *s) {
    EXPECT_GE(c.token_ids.size(), 50u);
    EXPECT_LE(c.token_ids.size(), 100u);
  }
  o.max_samples = 3;
  EXPECT_EQ(read_calibration_samples(path, *builder_, o)->size(), 3u);
  o.min_tokens = 100;
  o.max_tokens = 100;
  o.max_samples = 100;
  Expected<std::vector<CalibrationSample>> full = read_calibration_samples(path, *builder_, o);
  ASSERT_TRUE(full.has_value());
  for (const CalibrationSample& c : *full) EXPECT_EQ(c.token_ids.size(), 100u);
}

TEST_F(CalibrationSamples, JsonlPromptsAndErrors) {
  const std::string path = write("docs.jsonl", "{\"prompt\": \"" + words(80, "lake") + "\", \"answer\": \"1234\", \"id\": 7}\n\n" +
                                                   "{\"prompt\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]}\n");
  SampleReadOptions o;
  o.min_tokens = 10;
  Expected<std::vector<CalibrationSample>> s = read_calibration_samples(path, *builder_, o);
  ASSERT_TRUE(s.has_value()) << s.status().message();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].origin, path + ":1");
  EXPECT_EQ((*s)[1].origin, path + ":3");
  EXPECT_EQ((*s)[1].token_ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));

  const std::string bad = write("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": \n");
  Expected<std::vector<CalibrationSample>> e = read_calibration_samples(bad, *builder_, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.status().message().find(bad + ":2: invalid JSON"), std::string::npos) << e.status().message();
  const std::string nothing = write("none.jsonl", "{\"answer\": \"1\"}\n");
  e = read_calibration_samples(nothing, *builder_, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.status().message().find(nothing + ":1: "), std::string::npos) << e.status().message();

  o.min_tokens = 1000;
  o.max_tokens = 2000;
  e = read_calibration_samples(path, *builder_, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.status().message().find("no document of at least 1000 tokens"), std::string::npos);
  e = read_calibration_samples((dir_ / "missing.txt").string(), *builder_, o);
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.status().message().find("missing.txt"), std::string::npos);
}

}  // namespace
}  // namespace origami::eval
