// Budget arithmetic (Zipage §4.1–4.2): N_max = floor(budget / b) + 1, k = (N_max - 1) * b, and
// the query-slot count M of eq. 1/2, checked against a brute-force search of the constraints.
#include "policy/kv_budget.h"

#include <gtest/gtest.h>

#include "policy/policy_registry.h"
#include "policy/triggers.h"

#include <cmath>
#include <vector>

namespace origami {
namespace {

TEST(KVBudget, MaxBlocksAndKeep) {
  EXPECT_EQ(max_blocks_for_budget(2048, 256), 9);
  EXPECT_EQ(entries_kept_for_budget(2048, 256), 2048);
  EXPECT_EQ(max_blocks_for_budget(2047, 256), 8);
  EXPECT_EQ(entries_kept_for_budget(2047, 256), 1792);  // a budget rounds down to whole blocks
  EXPECT_EQ(max_blocks_for_budget(16, 16), 2);
  EXPECT_EQ(entries_kept_for_budget(16, 16), 16);
  EXPECT_EQ(max_blocks_for_budget(100, 16), 7);
  EXPECT_EQ(entries_kept_for_budget(100, 16), 96);
  EXPECT_EQ(max_blocks_for_budget(5, 16), 1);
  EXPECT_EQ(entries_kept_for_budget(5, 16), 0);
}

// The budget limit: every policy refuses a budget above kMaxKvBudget by name, and at the limit
// the cache-full level N_max * b stays inside int. Above it (2^31 - 16 at b = 16) N_max * b used
// to wrap negative and fire a compression of a request holding a few entries (an internal check).
TEST(KVBudget, BudgetsAboveTheLimitAreRefusedAndTriggersDoNotWrap) {
  for (const char* name : {"streaming", "zipage", "pagedeviction", "snapkv"}) {
    auto policy = PolicyRegistry::builtin().create(name, {});
    ASSERT_TRUE(policy.has_value()) << name;
    EXPECT_TRUE((*policy)->check_budget(kMaxKvBudget, 16).is_ok()) << name;
    for (int budget : {kMaxKvBudget + 1, 2147483632, 2147483647}) {
      const Status st = (*policy)->check_budget(budget, 16);
      ASSERT_FALSE(st.is_ok()) << name << " " << budget;
      EXPECT_NE(st.message().find("at most 1073741824"), std::string::npos) << st.message();
    }
  }
  EXPECT_LE(static_cast<int64_t>(max_blocks_for_budget(kMaxKvBudget, 1024)) * 1024, int64_t{1} << 31);
  // A level of 2^31 entries (N_max = 2^27 blocks of 16), which int arithmetic wraps to -2^31.
  TriggerState s;
  s.entries = 20;
  s.entries_after_known = 21;
  s.max_blocks = 1 << 27;
  s.block_size = 16;
  EXPECT_FALSE(cache_full_due(s).compress);
  s.prefill_checked = true;
  EXPECT_FALSE(paged_eviction_due(s).compress);
  s.prefill_checked = false;
  EXPECT_FALSE(paged_eviction_due(s).compress);
}

// Calibrated budgets: the lead group's count makes the groups keep the average on average.
TEST(KVBudget, LeadBudgetForAnAverage) {
  EXPECT_EQ(lead_budget_for_average(64, {}), 64);
  EXPECT_EQ(lead_budget_for_average(64, {1.0f, 1.0f}), 64);
  // Shares 1/3 and 1: ceil(64 x 2 / (4/3)) = 96; the groups keep 32 and 96, average 64.
  EXPECT_EQ(lead_budget_for_average(64, {1.0f / 3.0f, 1.0f}), 96);
  // Shares 1/4, 1, 1/4, 1: 40 x 4 / 2.5 = 64 exactly.
  EXPECT_EQ(lead_budget_for_average(40, {0.25f, 1.0f, 0.25f, 1.0f}), 64);
  // Rounding up: the average kept is never below the budget.
  for (int avg = 1; avg < 300; avg += 7) {
    const std::vector<float> shares = {0.14f, 0.37f, 1.0f, 0.55f};
    const int lead = lead_budget_for_average(avg, shares);
    double kept = 0.0;
    for (float r : shares) kept += std::ceil(static_cast<double>(r) * lead - 1e-9);
    EXPECT_GE(kept / 4.0, avg) << avg;
    EXPECT_LT(kept / 4.0, avg + 1.0 + 1.0 / 0.14 / 4.0 * 4.0) << avg;
  }
}

TEST(KVBudget, PaperExampleSizes) {
  // Qwen3-8B-like: 36 layers, 8 KV heads, d = 128, bf16, b = 256, 32 q heads, w = 16, budget 2048.
  const int64_t block = int64_t{36} * 8 * 128 * 2 * 2 * 256;
  const int64_t slot = int64_t{36} * 16 * 32 * 128 * 2;
  const int64_t avail = int64_t{60} << 30;
  QuerySlotSizing s = size_query_slots(avail, block, 0, 9, slot, 1 << 20);
  EXPECT_EQ(s.num_query_slots, static_cast<int>(avail / (block * 9 + slot)));
  EXPECT_EQ(s.num_blocks, static_cast<int>((avail - s.num_query_slots * slot) / block));
  EXPECT_GE(s.num_blocks, s.num_query_slots * 9);  // M <= N_total / N_max holds at the optimum
}

// Brute force: the largest M with some N_total >= M * N_max fitting beside M slots.
int brute_force_m(int64_t avail, int64_t m_block, int n_max, int64_t slot) {
  int best = 0;
  for (int m = 0; m < 200000; ++m) {
    const int64_t left = avail - m * slot;
    if (left < 0) break;
    if (left / m_block >= static_cast<int64_t>(m) * n_max) best = m;
  }
  return best;
}

TEST(KVBudget, QuerySlotsMatchBruteForce) {
  for (int64_t avail : {int64_t{0}, int64_t{999}, int64_t{12345}, int64_t{1} << 20, int64_t{7777777}}) {
    for (int64_t block : {int64_t{64}, int64_t{1000}, int64_t{4096}}) {
      for (int64_t page : {int64_t{0}, int64_t{16}}) {
        for (int n_max : {1, 2, 9}) {
          for (int64_t slot : {int64_t{0}, int64_t{100}, int64_t{5000}}) {
            QuerySlotSizing s = size_query_slots(avail, block, page, n_max, slot, 1 << 30);
            if (slot == 0 && avail > 0) {
              EXPECT_EQ(s.num_query_slots, static_cast<int>(avail / ((block + page) * n_max)));
            } else if (avail > 0) {
              EXPECT_EQ(s.num_query_slots, brute_force_m(avail, block + page, n_max, slot))
                  << avail << " " << block << " " << page << " " << n_max << " " << slot;
            }
            EXPECT_LE(s.num_query_slots * slot + static_cast<int64_t>(s.num_blocks) * (block + page), std::max<int64_t>(avail, 0));
          }
        }
      }
    }
  }
}

TEST(KVBudget, CapReturnsSlotMemoryToBlocks) {
  QuerySlotSizing uncapped = size_query_slots(100000, 100, 0, 2, 50, 1000);
  QuerySlotSizing capped = size_query_slots(100000, 100, 0, 2, 50, 3);
  EXPECT_EQ(uncapped.num_query_slots, 100000 / 250);
  EXPECT_EQ(capped.num_query_slots, 3);
  EXPECT_EQ(capped.num_blocks, (100000 - 150) / 100);
}

}  // namespace
}  // namespace origami
