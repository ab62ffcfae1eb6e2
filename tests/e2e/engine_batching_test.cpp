// Batching must not change results: a prompt's greedy output is the same alone, in a batch of 32
// mixed-length requests, under chunked prefill of several sizes, with prefix caching, and with a
// KV pool so small that requests are preempted and recomputed.
#include <random>

#include "engine_test_util.h"

namespace origami::testing {
namespace {

constexpr int kMaxTokens = 24;

// 32 prompts of mixed lengths (5..300 tokens); several share long prefixes.
std::vector<BatchItem> mixed_batch() {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(3, 8000);
  std::vector<int32_t> shared_prefix(96);
  for (auto& t : shared_prefix) t = tok(rng);
  std::vector<BatchItem> items;
  for (int i = 0; i < 32; ++i) {
    BatchItem item;
    const int len = 5 + (i * 37) % 296;
    if (i % 4 == 0) item.prompt_token_ids = shared_prefix;  // shares 96 tokens (6 full blocks)
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(kMaxTokens - (i % 3) * 4);
    items.push_back(item);
  }
  return items;
}

std::vector<std::vector<int32_t>> run(const EngineConfig& config, const std::vector<BatchItem>& items,
                                      EngineMetrics* metrics = nullptr) {
  auto engine = make_engine(config);
  if (!engine) return {};
  std::vector<BatchResult> results = run_batch(*engine, items);
  std::vector<std::vector<int32_t>> outputs;
  for (const auto& r : results) {
    EXPECT_TRUE(r.ok) << r.error;
    outputs.push_back(r.output_token_ids);
  }
  if (metrics) *metrics = engine->metrics();
  return outputs;
}

class EngineBatching : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    items_ = new std::vector<BatchItem>(mixed_batch());
    // Reference: every prompt alone, one engine each run, whole prompt in one step.
    reference_ = new std::vector<std::vector<int32_t>>();
    EngineConfig alone = cpu_config(tiny_qwen3_dir());
    alone.max_num_seqs = 1;
    *reference_ = run(alone, *items_);
  }
  static void TearDownTestSuite() {
    delete items_;
    delete reference_;
  }
  static std::vector<BatchItem>* items_;
  static std::vector<std::vector<int32_t>>* reference_;
};
std::vector<BatchItem>* EngineBatching::items_ = nullptr;
std::vector<std::vector<int32_t>>* EngineBatching::reference_ = nullptr;

TEST_F(EngineBatching, ReferenceRunsToMaxTokens) {
  ASSERT_EQ(reference_->size(), 32u);
  for (size_t i = 0; i < reference_->size(); ++i)
    EXPECT_EQ(static_cast<int>((*reference_)[i].size()), (*items_)[i].sampling.max_tokens);
}

TEST_F(EngineBatching, BatchOf32EqualsAlone) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_num_seqs = 32;
  c.max_num_batched_tokens = 8192;
  EngineMetrics m;
  EXPECT_EQ(run(c, *items_, &m), *reference_);
  EXPECT_GT(m.peak_running, 16);
}

TEST_F(EngineBatching, ChunkedPrefillAtSeveralSizesEqualsAlone) {
  for (int budget : {7, 33, 64, 512}) {
    EngineConfig c = cpu_config(tiny_qwen3_dir());
    c.max_num_batched_tokens = budget;
    c.max_num_seqs = 32;
    EXPECT_EQ(run(c, *items_), *reference_) << "max_num_batched_tokens=" << budget;
  }
}

TEST_F(EngineBatching, PrefixCachingEqualsAloneAndHits) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.enable_prefix_caching = true;
  c.max_num_seqs = 4;  // later requests find the shared prefix already cached
  EngineMetrics m;
  EXPECT_EQ(run(c, *items_, &m), *reference_);
  int64_t prompt_tokens = 0;
  for (const auto& it : *items_) prompt_tokens += static_cast<int64_t>(it.prompt_token_ids.size());
  EXPECT_LT(m.num_prompt_tokens_computed, prompt_tokens) << "the shared prefix was never served from the cache";
  // Every prompt token is either served by the prefix cache or computed (once, without preemption).
  EXPECT_GT(m.num_prefix_cached_tokens, 0);
  if (m.num_preemptions == 0) EXPECT_EQ(m.num_prefix_cached_tokens + m.num_prompt_tokens_computed, prompt_tokens);
  else EXPECT_GE(m.num_prefix_cached_tokens + m.num_prompt_tokens_computed, prompt_tokens);
}

TEST_F(EngineBatching, TinyPoolPreemptsAndRecomputesToTheSameOutput) {
  for (bool prefix_caching : {false, true}) {
    EngineConfig c = cpu_config(tiny_qwen3_dir());
    c.num_kv_blocks = 24;  // 384 slots: a few requests at a time, the longest alone
    c.max_num_seqs = 32;
    c.enable_prefix_caching = prefix_caching;
    EngineMetrics m;
    EXPECT_EQ(run(c, *items_, &m), *reference_) << "prefix caching " << prefix_caching;
    EXPECT_GT(m.num_preemptions, 0) << "the pool was meant to be too small to hold every request";
  }
}

TEST_F(EngineBatching, SeededSamplingIsBatchIndependent) {
  std::vector<BatchItem> sampled = *items_;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].sampling.temperature = 0.8f;
    sampled[i].sampling.top_p = 0.9f;
    sampled[i].sampling.seed = 100 + i;
  }
  EngineConfig alone = cpu_config(tiny_qwen3_dir());
  alone.max_num_seqs = 1;
  EngineConfig batched = cpu_config(tiny_qwen3_dir());
  batched.max_num_seqs = 32;
  batched.max_num_batched_tokens = 100;
  EXPECT_EQ(run(alone, sampled), run(batched, sampled));
}

}  // namespace
}  // namespace origami::testing
