// KV layouts cut across tensor-parallel ranks (kv/kv_layout_ranks.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "kv/kv_layout_ranks.h"

namespace origami {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(KVLayoutRanks, StripedGroupsTakeAsManyHeadsFromEveryRank) {
  auto pairs = striped_heads(3, 4, 2, 2);
  ASSERT_TRUE(pairs.has_value()) << pairs.status().to_string();
  ASSERT_EQ(pairs->size(), 3u);
  for (const auto& layer : *pairs) EXPECT_EQ(layer, (Groups{{0, 2}, {1, 3}}));
  auto quads = striped_heads(1, 8, 4, 2);
  ASSERT_TRUE(quads.has_value());
  EXPECT_EQ((*quads)[0], (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  auto one_per_layer = striped_heads(1, 8, 8, 4);
  ASSERT_TRUE(one_per_layer.has_value());
  EXPECT_EQ((*one_per_layer)[0], (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // What cannot split evenly is refused, naming tensor parallelism.
  for (auto [heads, hp, ranks] : {std::tuple{4, 1, 2}, std::tuple{8, 6, 2}, std::tuple{8, 3, 3}, std::tuple{6, 4, 4}}) {
    auto bad = striped_heads(2, heads, hp, ranks);
    ASSERT_FALSE(bad.has_value()) << heads << " " << hp << " " << ranks;
    EXPECT_NE(bad.status().to_string().find("tensor parallelism"), std::string::npos) << bad.status().to_string();
  }
}

TEST(KVLayoutRanks, FullLayoutGivesEachRankItsHeads) {
  const KVLayout full = KVLayout::full(6, 8, 64, 16, 100, DType::kBF16);
  for (int rank = 0; rank < 4; ++rank) {
    auto slice = slice_layout_for_rank(full, rank, 4);
    ASSERT_TRUE(slice.has_value()) << slice.status().to_string();
    EXPECT_EQ(slice->num_kv_heads, 2);
    ASSERT_EQ(slice->groups.size(), 1u);
    EXPECT_EQ(slice->groups[0].kv_heads, (std::vector<int>{0, 1}));
    EXPECT_EQ(slice->groups[0].layers, full.groups[0].layers);
    EXPECT_EQ(slice->groups[0].num_blocks, 100);
  }
  EXPECT_FALSE(slice_layout_for_rank(full, 0, 3).has_value()) << "8 heads over 3 ranks";
}

// Every rank's slice of a grouped layout keeps the groups, pages and budgets; its local heads,
// mapped back to model heads, are exactly the group's heads on that rank in slot order, and the
// ranks together hold every head of every group once.
TEST(KVLayoutRanks, GroupedLayoutSplitsWhereEveryGroupSpansTheRanksEvenly) {
  for (auto [heads, hp, ranks] : {std::tuple{4, 2, 2}, std::tuple{8, 2, 2}, std::tuple{8, 4, 2}, std::tuple{8, 4, 4}}) {
    auto grouping = striped_heads(3, heads, hp, ranks);
    ASSERT_TRUE(grouping.has_value());
    auto layout = KVLayout::grouped(3, heads, 64, 16, 500, DType::kBF16, *grouping);
    ASSERT_TRUE(layout.has_value()) << layout.status().to_string();
    for (size_t g = 0; g < layout->groups.size(); ++g) layout->groups[g].budget = 0.25 + 0.1 * g;
    const int per_rank = heads / ranks;
    std::vector<std::vector<int>> seen(layout->groups.size());
    for (int rank = 0; rank < ranks; ++rank) {
      auto slice = slice_layout_for_rank(*layout, rank, ranks);
      ASSERT_TRUE(slice.has_value()) << slice.status().to_string();
      EXPECT_EQ(slice->num_kv_heads, per_rank);
      EXPECT_TRUE(slice->shared_pool);
      ASSERT_EQ(slice->groups.size(), layout->groups.size());
      for (size_t g = 0; g < layout->groups.size(); ++g) {
        const HeadGroup& whole = layout->groups[g];
        const HeadGroup& local = slice->groups[g];
        EXPECT_EQ(local.layers, whole.layers);
        EXPECT_EQ(local.num_blocks, whole.num_blocks);
        EXPECT_DOUBLE_EQ(local.budget, whole.budget);
        ASSERT_EQ(static_cast<int>(local.kv_heads.size()), hp / ranks);
        std::vector<int> expected;
        for (int h : whole.kv_heads)
          if (h / per_rank == rank) expected.push_back(h - rank * per_rank);
        EXPECT_EQ(local.kv_heads, expected);
        for (int h : local.kv_heads) seen[g].push_back(rank * per_rank + h);
      }
    }
    for (size_t g = 0; g < seen.size(); ++g) {
      std::vector<int> all = layout->groups[g].kv_heads;
      std::sort(all.begin(), all.end());
      std::sort(seen[g].begin(), seen[g].end());
      EXPECT_EQ(seen[g], all);
    }
  }
}

TEST(KVLayoutRanks, GroupsOnOneRankAreRefused) {
  // Adjacent pairs of 4 heads over 2 ranks: {0, 1} lives on rank 0 alone.
  auto layout = KVLayout::grouped(2, 4, 64, 16, 50, DType::kBF16, KVLayout::adjacent_heads(2, 4, 2));
  ASSERT_TRUE(layout.has_value());
  auto slice = slice_layout_for_rank(*layout, 0, 2);
  ASSERT_FALSE(slice.has_value());
  const std::string why = slice.status().to_string();
  EXPECT_NE(why.find("tensor parallelism"), std::string::npos) << why;
  EXPECT_NE(why.find("head group 0 has 2 KV heads on rank 0 and 0 on rank 1"), std::string::npos) << why;
}

}  // namespace
}  // namespace origami
