// KVzip's reconstruction scores (eval/kvzip_scorer.h, CpuBackend::kvzip_reconstruction) against
// a brute force on the real tiny models. Chunk [b, e) of the context is rebuilt independently: a
// fresh backend computes the 4 sink tokens themselves at positions b - 4 .. b - 1 (right before
// the chunk), takes the chunk's K/V from a prefill of the whole context, and runs the
// reconstruction input at positions e, e + 1, ... with every query captured into a query slot;
// each (layer, KV head, token) score is then recomputed from that cache's keys and the captured
// queries with an explicit softmax in double (sinks + chunk + the reconstruction so far), max over
// the GQA group's query heads and the reconstruction's tokens. With one chunk this is the model's
// exact attention after the whole context.
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

// The scores of chunk [begin, end) recomputed from a fresh backend; `full` holds the context's
// prefill.
void brute_force_chunk(const std::string& model_dir, const ModelConfig& config, const KVzipScorer& scorer,
                       eval::SingleSequenceBackend& full, const std::vector<int32_t>& context, int begin, int end,
                       eval::HeadScores* out) {
  const std::vector<int32_t> repeat = scorer.reconstruction_tokens(context, begin, end);
  const int r = static_cast<int>(repeat.size()), len = end - begin;
  const int sinks = std::min(scorer.options().num_sinks, begin);
  const int num_ctx = sinks + len;
  auto runner = eval::SingleSequenceBackend::create(model_dir, config, num_ctx + r, 1);
  ASSERT_TRUE(runner.has_value()) << runner.status().message();
  CompressionConfig cc;
  cc.num_query_slots = 1;
  cc.max_window = end + r;
  ASSERT_TRUE((*runner)->backend().configure_compression(cc).is_ok());
  // The sinks, computed by the model at the positions right before the chunk.
  if (sinks > 0) {
    ASSERT_TRUE((*runner)->run({context.begin(), context.begin() + sinks}, 0, -1, 0, begin - sinks).is_ok());
  }
  // The chunk's K/V as the context's prefill has them.
  cpu::CpuKVCache& kv = (*runner)->backend().kv_cache();
  cpu::CpuKVCache& src = full.backend().kv_cache();
  const std::vector<BlockId>& table = (*runner)->block_table();
  const std::vector<BlockId>& src_table = full.block_table();
  const int bs = (*runner)->block_size(), d = config.head_dim, group = config.num_heads / config.num_kv_heads;
  for (int l = 0; l < config.num_layers; ++l)
    for (int h = 0; h < config.num_kv_heads; ++h)
      for (int i = sinks; i < num_ctx; ++i) {
        const int e = begin + i - sinks;
        std::memcpy(kv.key_at(l, table[i / bs], h, i % bs), src.key_at(l, src_table[e / bs], h, e % bs),
                    d * sizeof(float));
        std::memcpy(kv.value_at(l, table[i / bs], h, i % bs), src.value_at(l, src_table[e / bs], h, e % bs),
                    d * sizeof(float));
      }
  // The reconstruction right after the chunk.
  ASSERT_TRUE((*runner)->run(repeat, num_ctx, 0, num_ctx, end).is_ok());
  for (int l = 0; l < config.num_layers; ++l)
    for (int h = 0; h < config.num_kv_heads; ++h)
      for (int j = 0; j < group; ++j)
        for (int t = 0; t < r; ++t) {
          const float* q = kv.query_row(l, 0, (end + t) % cc.max_window) + static_cast<size_t>(h * group + j) * d;
          std::vector<double> logits;
          for (int i = 0; i <= num_ctx + t; ++i) {
            const float* k = kv.key_at(l, table[i / bs], h, i % bs);
            double dot = 0.0;
            for (int x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
            logits.push_back(dot / std::sqrt(static_cast<double>(d)));
          }
          const double m = *std::max_element(logits.begin(), logits.end());
          double sum = 0.0;
          for (double x : logits) sum += std::exp(x - m);
          for (int i = sinks; i < num_ctx; ++i) {
            float& best = (*out)[l][h][begin + i - sinks];
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
  auto full = eval::SingleSequenceBackend::create(c.model_dir, *config, n, 1);
  ASSERT_TRUE(full.has_value());
  ASSERT_TRUE((*full)->run(context, 0).is_ok());
  // ceil(n / chunk) chunks of equal length (within one token).
  const int chunks = (n + c.chunk_size - 1) / c.chunk_size;
  for (int k = 0; k < chunks; ++k)
    brute_force_chunk(c.model_dir, *config, **scorer, **full, context, k * n / chunks, (k + 1) * n / chunks,
                      &expected);
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
