// The `pagedeviction` policy: its registration (vknorm score, no queries, cache-full bound), its
// budget check (at least 2 blocks, so that a block other than the first and the last exists) and
// its trigger (policy/triggers.h paged_eviction_due): token-wise at the end of a prefill longer
// than k = (N_max - 1) * b, decided once; whole-block eviction at N_max full blocks afterwards.
#include <gtest/gtest.h>

#include "policy/policy_registry.h"

namespace origami {
namespace {

std::shared_ptr<const KVPolicy> make(const PolicyOptionMap& options = {}) {
  auto p = PolicyRegistry::builtin().create("pagedeviction", options);
  EXPECT_TRUE(p.has_value()) << p.status().to_string();
  return *p;
}

TEST(PagedEvictionPolicy, RegisteredWithItsRecipe) {
  auto p = make();
  EXPECT_EQ(p->trigger(), CompressionTrigger::kCacheFull);
  EXPECT_EQ(p->score_recipe().scorer, Scorer::kValueKeyNorm);
  EXPECT_EQ(p->score_recipe().window, 16);
  EXPECT_EQ(p->score_recipe().num_sinks, 0);
  EXPECT_FALSE(p->needs().window_queries);
  EXPECT_FALSE(p->needs().global_scores);
  EXPECT_EQ(make({{"window", "0"}, {"sinks", "4"}})->score_recipe().num_sinks, 4);
}

TEST(PagedEvictionPolicy, BudgetNeedsTwoBlocks) {
  auto p = make();
  EXPECT_TRUE(p->check_budget(32, 16).is_ok());
  EXPECT_TRUE(p->check_budget(2048, 16).is_ok());
  const Status st = p->check_budget(31, 16);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("at least 2 blocks"), std::string::npos) << st.message();
  EXPECT_FALSE(p->check_budget(8, 16).is_ok());
}

TEST(PagedEvictionPolicy, TriggerCompactsLongPromptsOnceThenEvictsBlocks) {
  auto p = make();
  TriggerState s;
  s.budget = 64;
  s.max_blocks = 5;  // k = 64, N_max * b = 80
  s.block_size = 16;
  // Still prefilling: nothing.
  s.entries = 100;
  s.tokens_pending = true;
  EXPECT_FALSE(p->compression_due(s).compress);
  // End of a 100-token prompt: token-wise, decided once.
  s.tokens_pending = false;
  TriggerDecision d = p->compression_due(s);
  EXPECT_TRUE(d.compress);
  EXPECT_FALSE(d.evict_block);
  EXPECT_TRUE(d.prefill_checked);
  // End of a short prompt: no compression, but the decision is taken.
  s.entries = 64;
  d = p->compression_due(s);
  EXPECT_FALSE(d.compress);
  EXPECT_TRUE(d.prefill_checked);
  // Decoding: blocks are evicted only at N_max full blocks.
  s.prefill_checked = true;
  for (int e = 64; e < 80; ++e) {
    s.entries = e;
    EXPECT_FALSE(p->compression_due(s).compress) << e;
  }
  s.entries = 80;
  d = p->compression_due(s);
  EXPECT_TRUE(d.compress);
  EXPECT_TRUE(d.evict_block);
  // A retained context's next prompt carries the cache past N_max blocks (to a count no whole
  // block evens out, or to whole blocks beyond N_max): compacted token-wise, never a block eviction
  // (which drops one block of exactly N_max).
  for (int e : {81, 95, 96, 200}) {
    s.entries = e;
    d = p->compression_due(s);
    EXPECT_TRUE(d.compress) << e;
    EXPECT_FALSE(d.evict_block) << e;
  }
  s.entries = 80;
  // No queries are ever captured.
  EXPECT_EQ(p->capture_from(s), -1);
}

}  // namespace
}  // namespace origami
