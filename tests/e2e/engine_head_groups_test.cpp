// Ragged head-group paging end to end on the CPU backend (TANGRAM §4.2).
//
//  1. The invariant: with uniform budgets, --heads-per-group 1 and 2 (tiny-qwen3 has 4 KV heads:
//     24 and 12 groups over its 6 layers) give the same greedy tokens and bit-identical
//     log-probabilities (the CPU arithmetic per (query, head) is the same) as the one-group
//     layout, under full KV and compressing policies (snapkv, streaming, zipage with its global
//     score), with prefix caching, chunked prefill and preemption all happening in the run.
//  2. Non-uniform budgets: per-group ratios 0.25 and 1.0 (of each layer's two groups). Every
//     compression job keeps exactly ceil(ratio x num_keep) entries of its group, the tables say
//     so afterwards, fewer pages are used at the peak than with uniform ratios, and a brute force
//     (knorm: score -|k|, the window always kept, ties to the newer entry) checks that every
//     (layer, head) of every group keeps its own top k, bit-exact copies in order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "backend/cpu/cpu_kernels.h"
#include "cpu_backend_wrapper.h"
#include "engine/head_budget_loader.h"
#include "engine_test_util.h"
#include "head_budgets_test_util.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;

struct Case {
  std::string policy;
  int budget = 0;
  int num_kv_blocks = 0;
  bool reserve = true;  // false: bounded requests may be preempted too (so that they are)
};

// Four requests sharing a 48-token prefix (prefix hits), prompts of 100-150 tokens prefilled in
// chunks of 64, 48 tokens each; two of them submitted again later so they hit the cache.
std::vector<BatchItem> make_items(const Case& c) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(20, 900);
  std::vector<int32_t> prefix(48);
  for (int32_t& t : prefix) t = tok(rng);
  std::vector<BatchItem> items;
  for (int i = 0; i < 6; ++i) {
    BatchItem item;
    item.prompt_token_ids = prefix;
    const int n = 52 + 17 * (i % 4);
    for (int j = 0; j < n; ++j) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(48);
    item.options.logprobs = 2;
    item.options.kv_policy = c.policy;
    item.options.kv_budget = c.budget;
    items.push_back(std::move(item));
  }
  return items;
}

struct EngineRun {
  std::vector<BatchResult> results;
  EngineMetrics metrics;
};

EngineRun run_case(const Case& c, int heads_per_group, int stripes = 0) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.num_threads = 2;
  config.block_size = kBlock;
  config.num_kv_blocks = c.num_kv_blocks;
  config.enable_prefix_caching = true;
  config.max_num_batched_tokens = 64;
  config.heads_per_group = heads_per_group;
  config.head_group_stripes = stripes;
  config.reserve_bounded_kv = c.reserve;
  auto engine = make_engine(config);
  if (!engine) return {};
  EngineRun run;
  run.results = run_batch(*engine, make_items(c));
  run.metrics = engine->metrics();
  return run;
}

class HeadGroupsInvariant : public ::testing::TestWithParam<Case> {};

TEST_P(HeadGroupsInvariant, SameTokensAndLogprobsAsOneGroup) {
  const Case c = GetParam();
  const EngineRun base = run_case(c, 0);
  ASSERT_EQ(base.results.size(), 6u);
  for (const BatchResult& r : base.results) ASSERT_TRUE(r.ok) << r.error;
  // The run exercises what it claims to.
  EXPECT_GT(base.metrics.num_prefix_cached_tokens, 0);
  EXPECT_GT(base.metrics.num_preemptions, 0) << "the cache is not tight enough to preempt";
  if (c.policy != "full") {
    EXPECT_GT(base.metrics.num_compressions, 0);
  }
  // Adjacent heads per group (1, 2), and pairs striped over two slices ({0, 2}, {1, 3}: the
  // grouping tensor parallelism over two ranks uses).
  for (auto [hp, stripes] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{2, 2}}) {
    const EngineRun grouped = run_case(c, hp, stripes);
    ASSERT_EQ(grouped.results.size(), base.results.size());
    for (size_t i = 0; i < base.results.size(); ++i) {
      const BatchResult& a = base.results[i];
      const BatchResult& b = grouped.results[i];
      ASSERT_TRUE(b.ok) << b.error;
      EXPECT_EQ(a.output_token_ids, b.output_token_ids)
          << c.policy << " heads_per_group " << hp << " stripes " << stripes << " request " << i;
      ASSERT_EQ(a.logprobs.size(), b.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t) {
        ASSERT_EQ(a.logprobs[t].logprob, b.logprobs[t].logprob)
            << c.policy << " heads_per_group " << hp << " stripes " << stripes << " request " << i << " token " << t;
        ASSERT_EQ(a.logprobs[t].top.size(), b.logprobs[t].top.size());
        for (size_t k = 0; k < a.logprobs[t].top.size(); ++k)
          ASSERT_EQ(a.logprobs[t].top[k].logprob, b.logprobs[t].top[k].logprob);
      }
    }
    // The same memory, the same decisions.
    EXPECT_EQ(grouped.metrics.num_preemptions, base.metrics.num_preemptions) << "heads_per_group " << hp;
    EXPECT_EQ(grouped.metrics.num_prefix_cached_tokens, base.metrics.num_prefix_cached_tokens);
    EXPECT_EQ(grouped.metrics.num_compressions, base.metrics.num_compressions);
    const int groups_per_block = 6 * 4 / hp;
    EXPECT_EQ(grouped.metrics.peak_kv_blocks_used, groups_per_block * base.metrics.peak_kv_blocks_used);
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, HeadGroupsInvariant,
                         ::testing::Values(Case{"full", 0, 24}, Case{"snapkv", 64, 16}, Case{"streaming", 48, 14, false},
                                           Case{"zipage", 64, 16, false}),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.policy; });

// Watches every compression: the jobs' groups and num_keep, and (knorm) the brute-force top k of
// every (layer, head) against what the backend wrote.
class CompressionWatcher : public CpuBackendWrapper {
 public:
  CompressionWatcher() : CpuBackendWrapper("cpu") {}
  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    const cpu::CpuKVCache& kv = inner_->kv_cache();
    std::vector<Expected> expected;
    for (const CompressionJob& job : batch.compressions) {
      ++jobs;
      keeps.push_back({job.group, job.num_entries, job.num_keep});
      expected.push_back(brute_force(kv, job));
    }
    Status st = inner_->execute(batch, out);
    for (size_t j = 0; j < batch.compressions.size(); ++j) check(kv, batch.compressions[j], expected[j]);
    return st;
  }

  struct Keep {
    int group, entries, num_keep;
  };
  std::vector<Keep> keeps;
  int jobs = 0;
  int mismatches = 0;
  int heads_checked = 0;

 private:
  // Per (layer, head) of the job's group: the keys it must keep, in order.
  struct Expected {
    std::vector<std::vector<float>> keys;  // [item][num_keep * d]
    std::vector<std::pair<int, int>> heads;
  };

  Expected brute_force(const cpu::CpuKVCache& kv, const CompressionJob& job) const {
    const KVLayout& layout = kv.layout();
    const int d = layout.head_dim, bs = layout.block_size, n = job.num_entries;
    const int window = job.recipe->window;
    Expected e;
    for (int l = 0; l < layout.num_layers; ++l)
      for (int h = 0; h < layout.num_kv_heads; ++h) {
        if (kv.head(l, h).group != job.group) continue;
        std::vector<const float*> k(static_cast<size_t>(n));
        std::vector<float> score(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) {
          k[i] = kv.key_at(l, (*job.src_blocks)[i / bs], h, i % bs);
          // knorm's score as the scorer states it (fp32 sum of squares, then sqrt), so that
          // equal norms tie exactly as they do there.
          score[i] = i >= n - std::min(window, n) ? INFINITY : -std::sqrt(cpu::dot(k[i], k[i], d));
        }
        std::vector<int> order(static_cast<size_t>(n));
        for (int i = 0; i < n; ++i) order[i] = i;
        // Higher score first, ties to the newer entry.
        std::sort(order.begin(), order.end(), [&](int a, int b) { return score[a] != score[b] ? score[a] > score[b] : a > b; });
        order.resize(static_cast<size_t>(job.num_keep));
        std::sort(order.begin(), order.end());
        std::vector<float> keys;
        for (int i : order) keys.insert(keys.end(), k[i], k[i] + d);
        e.keys.push_back(std::move(keys));
        e.heads.push_back({l, h});
      }
    return e;
  }

  void check(const cpu::CpuKVCache& kv, const CompressionJob& job, const Expected& e) {
    const int d = kv.layout().head_dim, bs = kv.layout().block_size;
    for (size_t item = 0; item < e.heads.size(); ++item) {
      const auto [l, h] = e.heads[item];
      ++heads_checked;
      for (int i = 0; i < job.num_keep; ++i) {
        const float* got = kv.key_at(l, (*job.dst_blocks)[i / bs], h, i % bs);
        if (std::memcmp(got, e.keys[item].data() + static_cast<size_t>(i) * d, d * sizeof(float)) != 0) {
          ++mismatches;
          break;
        }
      }
    }
  }
};

struct NonUniformRun {
  int peak_pages = 0;
  std::vector<CompressionWatcher::Keep> keeps;
  int jobs = 0, mismatches = 0, heads_checked = 0, compressions = 0;
  std::vector<BatchResult> results;
};

NonUniformRun run_non_uniform(std::vector<float> ratios, const std::string& head_budgets = "") {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.num_threads = 2;
  config.num_kv_blocks = 64;
  config.heads_per_group = 2;
  config.group_budget_ratios = std::move(ratios);
  config.kv_head_budgets = head_budgets;
  config.kv_policy = "knorm";
  config.kv_budget = 64;
  auto watcher = std::make_unique<CompressionWatcher>();
  CompressionWatcher* w = watcher.get();
  auto engine = Engine::create(config, std::move(watcher));
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  if (!engine) return {};
  std::vector<BatchItem> items;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(20, 900);
  // Staggered lengths: requests reach their first compression at different steps, so while one
  // grows to its trigger the others hold their compressed groups.
  for (int i = 0; i < 3; ++i) {
    BatchItem item;
    for (int j = 0; j < 10 + 25 * i; ++j) item.prompt_token_ids.push_back(tok(rng));
    item.sampling = greedy(120);
    items.push_back(std::move(item));
  }
  NonUniformRun run;
  run.results = run_batch(*engine.value(), items);
  run.peak_pages = engine.value()->metrics().peak_kv_blocks_used;
  run.compressions = static_cast<int>(engine.value()->metrics().num_compressions);
  run.keeps = w->keeps;
  run.jobs = w->jobs;
  run.mismatches = w->mismatches;
  run.heads_checked = w->heads_checked;
  return run;
}

TEST(HeadGroupsNonUniform, EachGroupKeepsItsOwnTopK) {
  const NonUniformRun uniform = run_non_uniform({});
  const NonUniformRun ragged = run_non_uniform({0.25f, 1.0f});
  for (const BatchResult& r : ragged.results) ASSERT_TRUE(r.ok) << r.error;
  ASSERT_GT(ragged.compressions, 0);
  // 12 groups (6 layers x 2): one job per group per compression while every group is over budget.
  EXPECT_EQ(ragged.jobs, 12 * ragged.compressions);
  // Each job keeps its group's share: even groups ceil(0.25 x 64) = 16, odd ones 64.
  for (const CompressionWatcher::Keep& k : ragged.keeps) {
    EXPECT_EQ(k.num_keep, k.group % 2 == 0 ? 16 : 64) << "group " << k.group;
    EXPECT_GT(k.entries, k.num_keep);
  }
  for (const CompressionWatcher::Keep& k : uniform.keeps) EXPECT_EQ(k.num_keep, 64);
  EXPECT_EQ(ragged.mismatches, 0) << "of " << ragged.heads_checked << " (layer, head) compactions";
  EXPECT_EQ(ragged.heads_checked, ragged.jobs * 2);
  EXPECT_EQ(uniform.mismatches, 0);
  // Smaller budgets free memory for real: fewer pages at the peak.
  EXPECT_LT(ragged.peak_pages, uniform.peak_pages);
}

// --kv-head-budgets: heads are clustered by budget ({0, 2} and {1, 3}, where adjacent groups
// would be {0, 1} and {2, 3}) and each group keeps its largest head's ratio over the largest
// group's: ceil(0.3 / 0.9 x 64) = 22 and 64. Each head's kept set is its own top k.
TEST(HeadGroupsNonUniform, CalibratedBudgetsClusterHeadsAndSetEachGroupsShare) {
  const NonUniformRun run = run_non_uniform({}, write_head_budgets("tiny_budgets.json"));
  for (const BatchResult& r : run.results) ASSERT_TRUE(r.ok) << r.error;
  ASSERT_GT(run.compressions, 0);
  EXPECT_EQ(run.jobs, 12 * run.compressions);
  for (const CompressionWatcher::Keep& k : run.keeps) EXPECT_EQ(k.num_keep, k.group % 2 == 0 ? 22 : 64) << k.group;
  EXPECT_EQ(run.mismatches, 0) << "of " << run.heads_checked << " (layer, head) compactions";
  EXPECT_EQ(run.heads_checked, run.jobs * 2);
}

TEST(HeadGroupsConfig, CalibratedBudgetsErrorsAreClear) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.kv_head_budgets = write_head_budgets("tiny_budgets_errors.json");
  config.group_budget_ratios = {0.5f, 1.0f};
  auto both = Engine::create(config);
  ASSERT_FALSE(both.has_value());
  EXPECT_NE(both.status().to_string().find("give one"), std::string::npos) << both.status().to_string();
  config.group_budget_ratios.clear();
  config.heads_per_group = 4;
  auto one_group = Engine::create(config);
  ASSERT_FALSE(one_group.has_value());
  EXPECT_NE(one_group.status().to_string().find("at least two head groups"), std::string::npos)
      << one_group.status().to_string();
  config.heads_per_group = 0;
  config.kv_head_budgets = ::testing::TempDir() + "no_such_budgets.json";
  auto missing = Engine::create(config);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().to_string().find("no_such_budgets.json"), std::string::npos) << missing.status().to_string();
}

TEST(HeadGroupsNonUniform, TablesHoldEachGroupsBudgetAfterACompression) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.num_threads = 2;
  config.num_kv_blocks = 64;
  config.heads_per_group = 2;
  config.group_budget_ratios = {0.25f, 1.0f};
  config.kv_policy = "streaming";
  config.kv_budget = 64;
  auto engine = make_engine(config);
  ASSERT_TRUE(engine);
  std::vector<int32_t> prompt(100);
  for (int i = 0; i < 100; ++i) prompt[i] = 30 + i;
  auto id = engine->add_request(prompt, greedy(40), RequestOptions{});
  ASSERT_TRUE(id.has_value());
  bool seen = false;
  while (engine->has_unfinished()) {
    engine->step();
    const Request* r = engine->request(id.value());
    if (r == nullptr || r->is_finished() || r->compression.num_compressions == 0 || seen) continue;
    seen = true;
    // Right after the first compression (the prompt was longer than the budget): even groups
    // hold 16 entries, odd ones 64, plus what was computed since.
    ASSERT_EQ(r->kv.groups.size(), 12u);
    const int since = r->kv.num_entries(1) - 64;
    EXPECT_GE(since, 0);
    for (size_t g = 0; g < 12; ++g)
      EXPECT_EQ(r->kv.num_entries(g), (g % 2 == 0 ? 16 : 64) + since) << "group " << g;
    EXPECT_LT(r->kv.groups[0].blocks.size(), r->kv.groups[1].blocks.size());
  }
  EXPECT_TRUE(seen);
}

TEST(HeadGroupsConfig, BadGroupingIsAClearError) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.heads_per_group = 3;
  auto engine = Engine::create(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("--heads-per-group 3 must divide the model's 4 KV heads"),
            std::string::npos)
      << engine.status().message();
  config.heads_per_group = 2;
  config.group_budget_ratios = {0.5f, 0.5f, 0.5f};
  engine = Engine::create(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("expected one per head group (12) or one per group of a layer (2)"),
            std::string::npos)
      << engine.status().message();
  config.group_budget_ratios = {0.0f, 1.0f};
  engine = Engine::create(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("must be in (0, 1]"), std::string::npos);
  config.heads_per_group = 0;
  config.group_budget_ratios = {0.5f};
  engine = Engine::create(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("group budget ratios need head groups"), std::string::npos);
  // Striped groups (tensor parallelism's layout) take as many heads from every slice.
  config.group_budget_ratios.clear();
  config.heads_per_group = 1;
  config.head_group_stripes = 2;
  engine = Engine::create(config);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("--heads-per-group must be a multiple of the ranks"), std::string::npos)
      << engine.status().message();
}

// The per-head default of Fast KVzip's global threshold over two stripes: groups of two heads,
// one from each slice ({0, 2}, {1, 3}), whose tables hold the larger of their heads' counts.
TEST(HeadGroupsConfig, PerHeadDefaultOverStripesPairsOneHeadOfEachSlice) {
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.kv_policy = "fastkvzip";
  config.kv_gates = std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors";
  config.head_group_stripes = 2;
  struct LayoutWatcher : CpuBackendWrapper {
    LayoutWatcher() : CpuBackendWrapper("cpu") {}
    Status allocate_kv_cache(const KVLayout& l) override {
      layout = l;
      return CpuBackendWrapper::allocate_kv_cache(l);
    }
    KVLayout layout;
  };
  auto watcher = std::make_unique<LayoutWatcher>();
  LayoutWatcher* w = watcher.get();
  auto engine = Engine::create(config, std::move(watcher));
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
  const KVLayout& layout = w->layout;
  ASSERT_EQ(layout.num_groups(), 6 * 2);
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(layout.groups[static_cast<size_t>(2 * l)].kv_heads, (std::vector<int>{0, 2}));
    EXPECT_EQ(layout.groups[static_cast<size_t>(2 * l + 1)].kv_heads, (std::vector<int>{1, 3}));
  }
}

TEST(HeadGroupsConfig, BlockEvictionIsRefusedWithMoreThanOneGroup) {
  // PagedEviction's decode phase drops one block of a table shared by every layer and head.
  EngineConfig config = cpu_config(tiny_qwen3_dir());
  config.num_threads = 2;
  config.heads_per_group = 2;
  config.kv_policy = "pagedeviction";
  config.kv_budget = 32;
  auto engine = make_engine(config);
  ASSERT_TRUE(engine);
  BatchItem item;
  for (int i = 0; i < 20; ++i) item.prompt_token_ids.push_back(40 + i);
  item.sampling = greedy(60);
  const std::vector<BatchResult> results = run_batch(*engine, {item});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_NE(results[0].error.find("block eviction"), std::string::npos) << results[0].error;
  EXPECT_NE(results[0].error.find("one-group layout only"), std::string::npos) << results[0].error;
}

}  // namespace
}  // namespace origami::testing
