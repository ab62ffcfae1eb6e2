// Runtime head budgets end to end on origami-tiny-qwen3 (docs/policies.md, "Runtime head
// budgets"): with alpha_safe = 1 every head's guarantee is the whole budget, so a joint selection
// must keep exactly the uniform selection's entries: `adakv` gives `snapkv`'s tokens and Fast
// KVzip's global threshold its uniform tokens (its cache-full trigger and the trimmed tables
// included), on the one-group layout and on per-head pages. With the default safeguard the counts
// differ per head, and per-head pages hold about the budget (page rounding only) while the one
// group holds its largest head's count. Page-aligned counts keep whole pages: exactly the scope's
// pages at every compaction on per-head pages. A backend without joint selection refuses the
// requests, naming the policy and the allocation.
#include <random>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

std::vector<BatchItem> prompts(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<BatchItem> out;
  for (int i = 0; i < 6; ++i) {
    BatchItem item;
    const int len = 90 + static_cast<int>(rng() % 120);
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 8000 + 3));
    item.sampling = greedy(40);
    out.push_back(item);
  }
  return out;
}

EngineConfig config(const std::string& policy, PolicyOptionMap options, int heads_per_group, int budget) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.kv_policy = policy;
  c.kv_policy_options = std::move(options);
  c.kv_budget = budget;
  c.heads_per_group = heads_per_group;
  if (policy == "fastkvzip") c.kv_gates = tiny_qwen3_gates();
  return c;
}

std::vector<BatchResult> run(const EngineConfig& c, int64_t* compressions = nullptr, int64_t* kept_pages = nullptr) {
  auto engine = make_engine(c);
  EXPECT_NE(engine, nullptr);
  if (engine == nullptr) return {};
  std::vector<BatchResult> r = run_batch(*engine, prompts(9));
  for (const BatchResult& x : r) EXPECT_TRUE(x.ok) << x.error;
  EXPECT_GT(engine->metrics().num_compressions, 0);
  if (compressions) *compressions = engine->metrics().num_compressions;
  if (kept_pages) *kept_pages = engine->metrics().num_kept_kv_pages;
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
  return r;
}

void expect_same_tokens(const std::vector<BatchResult>& a, const std::vector<BatchResult>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].output_token_ids, b[i].output_token_ids) << "item " << i;
}

TEST(RuntimeAllocation, FullSafeguardIsTheUniformSelection) {
  for (int hp : {0, 1}) {
    SCOPED_TRACE("heads per group " + std::to_string(hp));
    expect_same_tokens(run(config("adakv", {{"alpha_safe", "1"}}, hp, 64)), run(config("snapkv", {}, hp, 64)));
    // Uniform Fast KVzip spelled out (its default is the global threshold in whole pages).
    const PolicyOptionMap fk = {{"window", "16"}, {"allocation", "uniform"}, {"page_aligned", "0"}};
    PolicyOptionMap global = fk;
    global["allocation"] = "global";
    global["alpha_safe"] = "1";
    expect_same_tokens(run(config("fastkvzip", global, hp, 48)), run(config("fastkvzip", fk, hp, 48)));
  }
}

// With the default safeguard heads keep different counts: per-head pages hold the budget plus
// page rounding (at most one page per head beyond it), the one group its largest head's count for
// every head, so more than the budget.
TEST(RuntimeAllocation, PerHeadPagesHoldTheBudgetTheOneGroupItsLargestHead) {
  constexpr int kBudget = 64, kHeads = 6 * 4, kBlock = 16;
  int64_t n = 0, pages = 0;
  const std::vector<BatchResult> per_head = run(config("adakv", {}, 1, kBudget), &n, &pages);
  const double per_head_entries = static_cast<double>(pages) * kBlock / static_cast<double>(n * kHeads);
  EXPECT_GE(per_head_entries, kBudget);
  EXPECT_LE(per_head_entries, kBudget + kBlock);
  const std::vector<BatchResult> one_group = run(config("adakv", {}, 0, kBudget), &n, &pages);
  EXPECT_GT(static_cast<double>(pages) * kBlock / static_cast<double>(n), kBudget + kBlock);
  // Per-head pages and the one group keep different entries, so somewhere the tokens differ from
  // uniform SnapKV's.
  const std::vector<BatchResult> uniform = run(config("snapkv", {}, 1, kBudget));
  bool differs = false;
  for (size_t i = 0; i < uniform.size(); ++i) differs = differs || uniform[i].output_token_ids != per_head[i].output_token_ids;
  EXPECT_TRUE(differs);
}

// Page-aligned counts (page_aligned=1): with alpha_safe = 1 and the budget a whole number of
// pages the guarantees are the pages, so Fast KVzip's global threshold keeps its uniform tokens;
// with the default safeguard every compaction on per-head pages keeps exactly the scope's
// heads x budget / b pages (its cache-full compactions always have more entries than that).
TEST(RuntimeAllocation, PageAlignedCountsKeepWholePages) {
  constexpr int kBudget = 48, kHeads = 6 * 4, kBlock = 16;
  PolicyOptionMap fk = {{"window", "16"}, {"allocation", "uniform"}, {"page_aligned", "0"}};
  const std::vector<BatchResult> uniform = run(config("fastkvzip", fk, 1, kBudget));
  fk["allocation"] = "global";
  fk["page_aligned"] = "1";
  PolicyOptionMap full_safeguard = fk;
  full_safeguard["alpha_safe"] = "1";
  expect_same_tokens(run(config("fastkvzip", full_safeguard, 1, kBudget)), uniform);
  int64_t n = 0, pages = 0;
  const std::vector<BatchResult> global = run(config("fastkvzip", fk, 1, kBudget), &n, &pages);
  EXPECT_EQ(pages, n * kHeads * (kBudget / kBlock));
  bool differs = false;
  for (size_t i = 0; i < uniform.size(); ++i) differs = differs || uniform[i].output_token_ids != global[i].output_token_ids;
  EXPECT_TRUE(differs);
}

class NoJointSelectionBackend : public CpuBackendWrapper {
 public:
  NoJointSelectionBackend() : CpuBackendWrapper("nojoint") {}
  bool selects_jointly() const override { return false; }
};

TEST(RuntimeAllocation, RefusedWhereTheBackendCannotSelectJointly) {
  auto refused = Engine::create(config("adakv", {}, 0, 64), std::make_unique<NoJointSelectionBackend>());
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("KV policy adakv with allocation layer"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("nojoint backend"), std::string::npos) << refused.status().message();
  // An engine that serves uniform SnapKV refuses the request instead.
  auto engine = Engine::create(config("snapkv", {}, 0, 64), std::make_unique<NoJointSelectionBackend>());
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
  RequestOptions options;
  options.kv_policy = "adakv";
  auto id = (*engine)->add_request({5, 6, 7}, greedy(2), options);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("KV policy adakv with allocation layer"), std::string::npos)
      << id.status().message();
}

}  // namespace
}  // namespace origami::testing
