// KVzip's reconstruction scores (eval/kvzip_scorer.h) against a brute force on the real tiny
// models: the context and its reconstruction input are prefilled in one step with every
// reconstruction query captured into a query slot, and each (layer, KV head, token) score is
// recomputed from the cache's keys and the captured queries with an explicit softmax in double,
// max over the GQA group's query heads and the reconstruction's tokens. With one chunk the key
// set is the whole causal prefix (the model's exact attention); with several, the sinks, the
// chunk and the reconstruction (the reference's subsampled softmax).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine_test_util.h"
#include "eval/kvzip_scorer.h"
#include "tokenizer/tokenizer.h"

namespace origami::testing {
namespace {

using eval::KVzipScorer;

struct BruteForceCase {
  std::string model_dir;
  int context_tokens;
  int chunk_size;
};

class KVzipScorerBruteForce : public ::testing::TestWithParam<BruteForceCase> {};

// The scores of chunk [begin, end) recomputed from a fresh backend.
void brute_force_chunk(const std::string& model_dir, const ModelConfig& config, const KVzipScorer& scorer,
                       const std::vector<int32_t>& context, int begin, int end, eval::HeadScores* out) {
  const int n = static_cast<int>(context.size());
  std::vector<int32_t> tokens = context;
  const std::vector<int32_t> repeat = scorer.reconstruction_tokens(context, begin, end);
  tokens.insert(tokens.end(), repeat.begin(), repeat.end());
  const int r = static_cast<int>(repeat.size());
  auto runner = eval::SingleSequenceBackend::create(model_dir, config, n + r, 1);
  ASSERT_TRUE(runner.has_value()) << runner.status().message();
  CompressionConfig cc;
  cc.num_query_slots = 1;
  cc.max_window = n + r;
  ASSERT_TRUE((*runner)->backend().configure_compression(cc).is_ok());
  ASSERT_TRUE((*runner)->run(tokens, 0, 0, n).is_ok());
  cpu::CpuKVCache& kv = (*runner)->backend().kv_cache();
  const std::vector<BlockId>& table = (*runner)->block_table();
  const int bs = (*runner)->block_size(), d = config.head_dim, group = config.num_heads / config.num_kv_heads;
  const int sinks = std::min(scorer.options().num_sinks, begin);
  for (int l = 0; l < config.num_layers; ++l)
    for (int h = 0; h < config.num_kv_heads; ++h)
      for (int j = 0; j < group; ++j)
        for (int t = 0; t < r; ++t) {
          const float* q = kv.query_row(l, 0, (n + t) % cc.max_window) + static_cast<size_t>(h * group + j) * d;
          std::vector<int> key_entries;
          for (int e = 0; e < sinks; ++e) key_entries.push_back(e);
          for (int e = begin; e < end; ++e) key_entries.push_back(e);
          for (int e = n; e <= n + t; ++e) key_entries.push_back(e);
          std::vector<double> logits;
          for (int e : key_entries) {
            const float* k = kv.key_at(l, table[e / bs], h, e % bs);
            double dot = 0.0;
            for (int i = 0; i < d; ++i) dot += static_cast<double>(q[i]) * k[i];
            logits.push_back(dot / std::sqrt(static_cast<double>(d)));
          }
          const double m = *std::max_element(logits.begin(), logits.end());
          double sum = 0.0;
          for (double x : logits) sum += std::exp(x - m);
          for (size_t i = 0; i < key_entries.size(); ++i) {
            const int e = key_entries[i];
            if (e < begin || e >= end) continue;
            float& best = (*out)[l][h][e];
            best = std::max(best, static_cast<float>(std::exp(logits[i] - m) / sum));
          }
        }
}

TEST_P(KVzipScorerBruteForce, MatchesExplicitSoftmaxOverCapturedQueries) {
  const BruteForceCase& c = GetParam();
  Expected<ModelConfig> config = load_model_config(c.model_dir);
  ASSERT_TRUE(config.has_value());
  Expected<std::shared_ptr<Tokenizer>> tok = Tokenizer::load(c.model_dir);
  ASSERT_TRUE(tok.has_value());
  eval::KVzipOptions options;
  options.prompts = eval::kvzip_prompts(**tok);
  options.chunk_size = c.chunk_size;
  std::vector<int32_t> context = (*tok)->encode(
      "Once upon a time there was a little fox who lived near a river. Every morning the fox walked to the water "
      "and counted the fish. One day a big bird came and asked the fox why he counted the fish. The fox said that "
      "his mother told him to do it, and that the number of fish was seven. The bird laughed and flew away over "
      "the hills, and the fox went home to tell his mother about the bird and the seven fish in the river.",
      false);
  context.resize(std::min<size_t>(context.size(), c.context_tokens));
  ASSERT_EQ(static_cast<int>(context.size()), c.context_tokens);
  auto scorer = KVzipScorer::create(c.model_dir, *config, options, c.context_tokens, 1);
  ASSERT_TRUE(scorer.has_value()) << scorer.status().message();
  Expected<eval::KVzipResult> got = (*scorer)->score(context, /*keep_hidden=*/true);
  ASSERT_TRUE(got.has_value()) << got.status().message();

  const int n = c.context_tokens;
  eval::HeadScores expected(config->num_layers,
                            std::vector<std::vector<float>>(config->num_kv_heads, std::vector<float>(n, 0.0f)));
  int chunks = 0;
  for (int begin = 0; begin < n; begin += c.chunk_size, ++chunks)
    brute_force_chunk(c.model_dir, *config, **scorer, context, begin, std::min(n, begin + c.chunk_size), &expected);
  EXPECT_EQ(chunks, (n + c.chunk_size - 1) / c.chunk_size);
  double max_err = 0.0;
  for (int l = 0; l < config->num_layers; ++l)
    for (int h = 0; h < config->num_kv_heads; ++h)
      for (int e = 0; e < n; ++e) {
        const float s = got->scores[l][h][e];
        ASSERT_GE(s, 0.0f);
        ASSERT_LE(s, 1.0f);
        if (e < options.num_sinks) {
          EXPECT_EQ(s, 1.0f);
          continue;
        }
        max_err = std::max(max_err, std::abs(static_cast<double>(s) - expected[l][h][e]));
      }
  EXPECT_LT(max_err, 2e-5);
  // The gates' inputs: one row of `hidden` floats per context token and layer, not all zero.
  ASSERT_EQ(got->hidden.size(), static_cast<size_t>(config->num_layers));
  for (const auto& rows : got->hidden) {
    ASSERT_EQ(rows.size(), static_cast<size_t>(n) * config->hidden_size);
    EXPECT_GT(*std::max_element(rows.begin(), rows.end()), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, KVzipScorerBruteForce,
                         ::testing::Values(BruteForceCase{tiny_qwen3_dir(), 60, 2048},
                                           BruteForceCase{tiny_qwen3_dir(), 70, 25},
                                           BruteForceCase{stories_dir(), 80, 2048},
                                           BruteForceCase{stories_dir(), 80, 30}));

TEST(KVzipScorer, RefusesContextsOutsideItsSize) {
  Expected<ModelConfig> config = load_model_config(stories_dir());
  ASSERT_TRUE(config.has_value());
  Expected<std::shared_ptr<Tokenizer>> tok = Tokenizer::load(stories_dir());
  ASSERT_TRUE(tok.has_value());
  eval::KVzipOptions options;
  options.prompts = eval::kvzip_prompts(**tok);
  auto scorer = KVzipScorer::create(stories_dir(), *config, options, 16, 1);
  ASSERT_TRUE(scorer.has_value());
  Expected<eval::KVzipResult> r = (*scorer)->score(std::vector<int32_t>(17, 5), false);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("17 tokens"), std::string::npos) << r.status().message();
  EXPECT_FALSE((*scorer)->score({}, false).has_value());
}

}  // namespace
}  // namespace origami::testing
