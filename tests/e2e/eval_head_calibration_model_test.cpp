// Head-budget calibration on origami-tiny-qwen3 (eval/head_calibration.h), on a text made here
// (never a dev set that is reported):
//   - the scores are the CPU compression's own: running the CPU backend's compressor on the same
//     prefilled cache keeps, for every (layer, KV head), exactly the top-K of the calibration's
//     scores (bit-exact copies of those entries), and the SnapKV window is protected;
//   - the non-uniform per-layer top-k on one sample agrees with a brute-force selection (the
//     k-th largest score as a threshold: each head keeps everything above it, part of the ties,
//     never an entry below it), every head keeps its window, and k = max(ceil(rho H N), H w);
//   - a calibration over a few samples (snapkv and knorm) gives a valid file with ratios in
//     (0, 1], B >= mean, per-layer mean fractions summing to the top-k share, that saves and
//     loads back for this model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/compression_ops.h"
#include "engine/head_budget_loader.h"
#include "engine_test_util.h"
#include "eval/head_calibration.h"

namespace origami::testing {
namespace {

using eval::HeadScores;
using eval::PrefillScorer;

// Sentences from fixed word lists with a fixed seed: a text of our own, varied enough that
// attention is not uniform.
std::string made_up_text(uint32_t seed, int sentences) {
  const char* subjects[] = {"The old miller", "A young sailor", "The city council", "Her brother", "The river",
                            "A quiet student", "The northern army", "Our neighbour"};
  const char* verbs[] = {"crossed", "described", "remembered", "built", "followed", "painted", "counted", "lost"};
  const char* objects[] = {"the stone bridge", "a long letter", "the harbour lights", "seven red boxes",
                           "the winter market", "an empty house", "the eastern road", "a broken clock"};
  const char* tails[] = {"before the storm.", "in the morning.", "for the last time.", "with great care.",
                         "near the station.", "after the war.", "while it rained.", "without a word."};
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < sentences; ++i) {
    text += std::string(subjects[rng() % 8]) + " " + verbs[rng() % 8] + " " + objects[rng() % 8] + " " +
            tails[rng() % 8] + " ";
  }
  return text;
}

class CalibrationModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Expected<ModelConfig> c = load_model_config(tiny_qwen3_dir());
    ASSERT_TRUE(c.has_value()) << c.status().message();
    config_ = new ModelConfig(*c);
    Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::load(tiny_qwen3_dir());
    ASSERT_TRUE(t.has_value());
    builder_ = new PromptBuilder(*t);
  }
  static void TearDownTestSuite() {
    delete config_;
    delete builder_;
  }
  static std::vector<int32_t> tokens(uint32_t seed, int max_tokens) {
    Expected<std::vector<int32_t>> ids = builder_->from_text(made_up_text(seed, 40));
    EXPECT_TRUE(ids.has_value());
    std::vector<int32_t> out = *ids;
    if (static_cast<int>(out.size()) > max_tokens) out.resize(max_tokens);
    return out;
  }
  static std::unique_ptr<PrefillScorer> scorer(const std::string& name, int max_tokens) {
    Expected<ScoreRecipe> recipe = eval::calibration_recipe(name);
    EXPECT_TRUE(recipe.has_value());
    Expected<std::unique_ptr<PrefillScorer>> s =
        PrefillScorer::create(tiny_qwen3_dir(), *config_, *recipe, max_tokens, /*num_threads=*/2);
    EXPECT_TRUE(s.has_value()) << s.status().message();
    return s ? std::move(*s) : nullptr;
  }

  static ModelConfig* config_;
  static PromptBuilder* builder_;
};
ModelConfig* CalibrationModel::config_ = nullptr;
PromptBuilder* CalibrationModel::builder_ = nullptr;

TEST_F(CalibrationModel, ScoresAreTheCpuCompressionsAndTheLayerTopKMatchesBruteForce) {
  std::unique_ptr<PrefillScorer> s = scorer("snapkv", 256);
  ASSERT_NE(s, nullptr);
  const std::vector<int32_t> ids = tokens(1, 200);
  const int n = static_cast<int>(ids.size());
  ASSERT_GE(n, 150);
  Expected<HeadScores> scores = s->score(ids);
  ASSERT_TRUE(scores.has_value()) << scores.status().message();
  const int layers = config_->num_layers, heads = config_->num_kv_heads, d = config_->head_dim;
  const int window = s->recipe().window;
  ASSERT_EQ(window, 32);
  ASSERT_EQ(static_cast<int>(scores->size()), layers);

  // The window is protected; the rest are pooled attention means, in [0, 1].
  for (int l = 0; l < layers; ++l) {
    ASSERT_EQ(static_cast<int>((*scores)[l].size()), heads);
    for (int h = 0; h < heads; ++h) {
      const std::vector<float>& sc = (*scores)[l][h];
      ASSERT_EQ(static_cast<int>(sc.size()), n);
      for (int e = 0; e < n; ++e) {
        if (e >= n - window) {
          EXPECT_TRUE(std::isinf(sc[e]) && sc[e] > 0) << l << "," << h << "," << e;
        } else {
          EXPECT_TRUE(sc[e] >= 0.0f && sc[e] <= 1.0f) << sc[e];
        }
      }
    }
  }

  // The non-uniform top-k of every layer against the brute-force threshold.
  const double rho = 0.25;
  eval::SampleRetention retention = eval::measure_retention(*scores, rho);
  for (int l = 0; l < layers; ++l) {
    const auto& layer = (*scores)[l];
    const int k = eval::layer_topk_size(layer, rho);
    EXPECT_EQ(k, std::max(static_cast<int>(std::ceil(rho * heads * n - 1e-9)), heads * window));
    const std::vector<int> counts = eval::layer_topk_kept_counts(layer, k);
    std::vector<float> all;
    for (const auto& head : layer) all.insert(all.end(), head.begin(), head.end());
    std::sort(all.begin(), all.end(), std::greater<float>());
    const float threshold = all[k - 1];
    int total = 0;
    for (int h = 0; h < heads; ++h) {
      int above = 0, equal = 0;
      for (float v : layer[h]) {
        above += v > threshold;
        equal += v == threshold;
      }
      EXPECT_GE(counts[h], above) << "layer " << l << " head " << h;
      EXPECT_LE(counts[h], above + equal) << "layer " << l << " head " << h;
      EXPECT_GE(counts[h], window);
      EXPECT_DOUBLE_EQ(retention.kept_fraction[l][h], static_cast<double>(counts[h]) / n);
      total += counts[h];
    }
    EXPECT_EQ(total, k);
  }

  // The CPU backend's own compression of this cache keeps each head's top-K of these scores.
  const int bs = s->block_size(), keep = 64;
  const std::vector<BlockId> src(s->block_table().begin(), s->block_table().begin() + (n + bs - 1) / bs);
  const std::vector<BlockId> dst(src.begin(), src.begin() + (keep + bs - 1) / bs);
  cpu::CpuKVCache& kv = s->backend().kv_cache();
  std::vector<std::vector<float>> before(static_cast<size_t>(layers) * heads);
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h)
      for (int e = 0; e < n; ++e) {
        const float* k = kv.key_at(l, src[e / bs], h, e % bs);
        before[l * heads + h].insert(before[l * heads + h].end(), k, k + d);
      }
  CompressionJob job;
  job.request_id = 1;
  job.src_blocks = &src;
  job.dst_blocks = &dst;
  job.num_entries = n;
  job.num_keep = keep;
  job.query_slot = 0;
  job.num_positions = n;
  job.first_compression = true;
  job.recipe = &s->recipe();
  ASSERT_TRUE(s->backend().compressor()->begin({job}).is_ok());
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < heads; ++h) {
      std::vector<int32_t> expected(keep);
      cpu::select_keep((*scores)[l][h].data(), n, keep, expected.data());
      for (int i = 0; i < keep; ++i) {
        const float* got = kv.key_at(l, dst[i / bs], h, i % bs);
        int source = -1;
        for (int e = 0; e < n && source < 0; ++e)
          if (std::memcmp(got, &before[l * heads + h][static_cast<size_t>(e) * d], d * sizeof(float)) == 0) source = e;
        ASSERT_EQ(source, expected[i]) << "layer " << l << " head " << h << " kept entry " << i;
      }
    }
}

TEST_F(CalibrationModel, CalibrationGivesAValidFileThatLoadsBack) {
  for (const char* name : {"snapkv", "knorm"}) {
    std::unique_ptr<PrefillScorer> s = scorer(name, 192);
    ASSERT_NE(s, nullptr);
    std::vector<eval::SampleRetention> samples;
    const double rho = 0.3;
    for (uint32_t seed : {11u, 12u, 13u}) {
      const std::vector<int32_t> ids = tokens(seed, 192 - static_cast<int>(seed));
      Expected<HeadScores> scores = s->score(ids);
      ASSERT_TRUE(scores.has_value()) << scores.status().message();
      samples.push_back(eval::measure_retention(*scores, rho));
    }
    eval::CalibrationOptions options;
    options.scorer = name;
    options.rho = rho;
    options.alpha = 2.0;
    const HeadBudgets b = eval::summarize_retention(samples, options, model_identity(*config_));
    ASSERT_TRUE(validate_head_budgets(b).is_ok()) << validate_head_budgets(b).message();
    ASSERT_EQ(b.num_layers(), config_->num_layers);
    ASSERT_EQ(b.num_kv_heads(), config_->num_kv_heads);
    for (int l = 0; l < b.num_layers(); ++l) {
      double mean_sum = 0.0, expected_sum = 0.0;
      for (int h = 0; h < b.num_kv_heads(); ++h) {
        EXPECT_GT(b.ratios[l][h], 0.0);
        EXPECT_LE(b.ratios[l][h], 1.0);
        EXPECT_GE(b.ratios[l][h], std::min(1.0, b.mean[l][h]));
        mean_sum += b.mean[l][h];
      }
      // Each sample keeps exactly k entries in the layer: the heads' fractions sum to k / N.
      for (const auto& sample : samples) {
        const int n = sample.num_tokens, heads = b.num_kv_heads();
        const int window = std::min(n, eval::calibration_recipe(name)->window);
        expected_sum += std::max(std::ceil(rho * heads * n - 1e-9), static_cast<double>(heads * window)) / n;
      }
      EXPECT_NEAR(mean_sum, expected_sum / samples.size(), 1e-9) << name << " layer " << l;
    }
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("origami_calibration_" + std::string(name) + std::to_string(getpid()) + ".json"))
                                 .string();
    ASSERT_TRUE(save_head_budgets(b, path).is_ok());
    Expected<HeadBudgets> back = load_head_budgets_for_model(path, *config_);
    ASSERT_TRUE(back.has_value()) << back.status().message();
    EXPECT_EQ(back->ratios, b.ratios);
    EXPECT_EQ(back->scorer, name);
    ModelConfig other = *config_;
    other.num_kv_heads = 8;
    EXPECT_FALSE(load_head_budgets_for_model(path, other).has_value());
    std::filesystem::remove(path);
  }
}

}  // namespace
}  // namespace origami::testing
