// The base-scorer registry (kv/scorers.h): names are unique and round-trip, only attention needs
// queries, and a ScoreRecipe's needs_queries() follows its scorer.
#include "kv/scorers.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "kv/compression.h"

namespace origami {
namespace {

TEST(Scorers, NamesAreUniqueAndRoundTrip) {
  std::set<std::string> names;
  for (int i = 0; i < kNumScorers; ++i) {
    const Scorer s = static_cast<Scorer>(i);
    EXPECT_TRUE(valid_scorer(s));
    EXPECT_TRUE(names.insert(scorer_name(s)).second) << scorer_name(s);
    EXPECT_FALSE(std::string(scorer_summary(s)).empty()) << scorer_name(s);
    Scorer found = Scorer::kZero;
    ASSERT_TRUE(find_scorer(scorer_name(s), &found)) << scorer_name(s);
    EXPECT_EQ(found, s);
    EXPECT_EQ(scorer_bit(s), 1u << i);
  }
  EXPECT_FALSE(valid_scorer(static_cast<Scorer>(kNumScorers)));
  EXPECT_FALSE(valid_scorer(static_cast<Scorer>(-1)));
  Scorer unused = Scorer::kZero;
  EXPECT_FALSE(find_scorer("h2o", &unused));
  EXPECT_STREQ(scorer_name(Scorer::kKeyNorm), "knorm");
  EXPECT_STREQ(scorer_name(static_cast<Scorer>(kNumScorers)), "unknown");
}

TEST(Scorers, OnlyAttentionNeedsQueries) {
  ScoreRecipe r;
  EXPECT_EQ(r.scorer, Scorer::kAttention);  // the default
  EXPECT_TRUE(r.needs_queries());
  for (Scorer s : {Scorer::kZero, Scorer::kRecency, Scorer::kKeyNorm}) {
    r.scorer = s;
    EXPECT_FALSE(r.needs_queries()) << scorer_name(s);
    EXPECT_FALSE(scorer_needs_queries(s));
  }
  EXPECT_TRUE(scorer_needs_queries(Scorer::kAttention));
}

}  // namespace
}  // namespace origami
