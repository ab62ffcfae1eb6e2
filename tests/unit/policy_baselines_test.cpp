// The baseline policies (`h2o`, `tova`, `keydiff`, `rkv`): the recipes they build with their
// default options (docs/policies.md states them), their needs and their budget checks.
#include <gtest/gtest.h>

#include "policy/policy_registry.h"

namespace origami {
namespace {

TEST(BaselinePolicies, DefaultRecipes) {
  const PolicyRegistry& reg = PolicyRegistry::builtin();
  auto h2o = reg.create("h2o");
  ASSERT_TRUE(h2o.has_value()) << h2o.status().to_string();
  const ScoreRecipe& h = (*h2o)->score_recipe();
  EXPECT_EQ(h.scorer, Scorer::kAttention);
  EXPECT_EQ(h.window, 16);
  EXPECT_EQ(h.global_mode, GlobalMode::kSum);
  EXPECT_EQ(h.global_decay, 1.0f);
  EXPECT_EQ(h.recent_ratio, 0.5f);
  EXPECT_EQ(h.pool_kernel, 0);
  EXPECT_TRUE((*h2o)->needs().global_scores);
  EXPECT_TRUE((*h2o)->check_budget(64, 16).is_ok());
  // One block keeps 16 entries, all protected by the window; a window larger than a block misses
  // queries.
  EXPECT_FALSE((*h2o)->check_budget(16, 16).is_ok());
  EXPECT_FALSE((*h2o)->check_budget(64, 8).is_ok());

  auto tova = reg.create("tova");
  ASSERT_TRUE(tova.has_value());
  EXPECT_EQ((*tova)->score_recipe().scorer, Scorer::kAttention);
  EXPECT_EQ((*tova)->score_recipe().window, 1);
  EXPECT_EQ((*tova)->needs().window, 1);
  EXPECT_FALSE((*tova)->needs().global_scores);

  auto keydiff = reg.create("keydiff");
  ASSERT_TRUE(keydiff.has_value());
  EXPECT_EQ((*keydiff)->score_recipe().scorer, Scorer::kKeyDiff);
  EXPECT_FALSE((*keydiff)->needs().window_queries);

  auto rkv = reg.create("rkv");
  ASSERT_TRUE(rkv.has_value());
  const ScoreRecipe& k = (*rkv)->score_recipe();
  EXPECT_EQ(k.window, 8);
  EXPECT_EQ(k.pool_kernel, 7);
  EXPECT_FALSE(k.pool_first_only);
  EXPECT_EQ(k.redundancy, RedundancyMode::kFlash);
  EXPECT_FLOAT_EQ(k.redundancy_lambda, 0.1f);
  EXPECT_FLOAT_EQ(k.redundancy_tau, 1.0f);
  EXPECT_FLOAT_EQ(k.redundancy_threshold, 0.5f);
  EXPECT_FALSE(reg.create("rkv", {{"kernel", "4"}}).has_value());
  EXPECT_FALSE(reg.create("h2o", {{"recent_ratio", "1"}}).has_value());
}

}  // namespace
}  // namespace origami
