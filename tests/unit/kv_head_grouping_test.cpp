// Budget-aware clustering and adjacent grouping (kv/head_grouping.h): groups hold the right heads
// in the right order, a group's ratio is its largest member's, bad H_p is an error listing the
// valid ones, and clustering never needs more memory than adjacent grouping or any other split
// into equal groups (property test over random budgets, checked against brute force).
#include "kv/head_grouping.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace origami {
namespace {

using Groups = std::vector<std::vector<int>>;

TEST(HeadGrouping, ClusteredSortsByBudgetAndCutsConsecutiveGroups) {
  // Layer 0: budgets 0.9 0.1 0.5 0.2 0.8 0.3 0.7 0.4 -> ascending order 1 3 5 7 2 6 4 0.
  // Layer 1: ties: 0.5 0.2 0.5 0.2 -> ascending, ties to the lower index: 1 3 0 2.
  const std::vector<std::vector<double>> ratios = {{0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4},
                                                   {0.5, 0.2, 0.5, 0.2, 1.0, 1.0, 0.05, 0.6}};
  Expected<HeadGrouping> g = cluster_heads(ratios, 2);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  EXPECT_EQ(g->mode, GroupingMode::kClustered);
  EXPECT_EQ(g->heads_per_group, 2);
  EXPECT_EQ(g->num_groups(), 4);
  EXPECT_EQ(g->num_layers(), 2);
  EXPECT_EQ(g->groups[0], (Groups{{1, 3}, {5, 7}, {2, 6}, {0, 4}}));
  EXPECT_EQ(g->group_ratio[0], (std::vector<double>{0.2, 0.4, 0.7, 0.9}));
  EXPECT_NEAR(g->group_budget_sum[0][0], 0.3, 1e-12);
  EXPECT_NEAR(g->group_budget_sum[0][3], 1.7, 1e-12);
  // Layer 1 ascending: 6 (0.05), 1, 3 (0.2), 0, 2 (0.5), 7 (0.6), 4, 5 (1.0).
  EXPECT_EQ(g->groups[1], (Groups{{1, 6}, {0, 3}, {2, 7}, {4, 5}}));
  EXPECT_EQ(g->group_ratio[1], (std::vector<double>{0.2, 0.5, 0.6, 1.0}));

  Expected<HeadGrouping> g4 = cluster_heads(ratios, 4);
  ASSERT_TRUE(g4.has_value());
  EXPECT_EQ(g4->groups[0], (Groups{{1, 3, 5, 7}, {0, 2, 4, 6}}));
  EXPECT_EQ(g4->group_ratio[0], (std::vector<double>{0.4, 0.9}));

  // Memory: H_p * group ratios / (L * H) = 2 * (0.2 + 0.4 + 0.7 + 0.9 + 0.2 + 0.5 + 0.6 + 1.0) / 16.
  EXPECT_NEAR(grouping_memory_fraction(*g), 2 * 4.5 / 16, 1e-12);
}

TEST(HeadGrouping, AdjacentKeepsIndexOrder) {
  const std::vector<std::vector<double>> ratios = {{0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4}};
  Expected<HeadGrouping> g = adjacent_heads(ratios, 2);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->mode, GroupingMode::kAdjacent);
  EXPECT_EQ(g->groups[0], (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g->group_ratio[0], (std::vector<double>{0.9, 0.5, 0.8, 0.7}));
  EXPECT_NEAR(grouping_memory_fraction(*g), 2 * 2.9 / 8, 1e-12);
  Expected<HeadGrouping> c = cluster_heads(ratios, 2);
  EXPECT_NEAR(grouping_memory_fraction(*c), 2 * (0.2 + 0.4 + 0.7 + 0.9) / 8, 1e-12);
  // H_p = 1 is per-head paging: memory = mean ratio, whatever the grouping.
  EXPECT_NEAR(grouping_memory_fraction(*adjacent_heads(ratios, 1)), 3.9 / 8, 1e-12);
  EXPECT_NEAR(grouping_memory_fraction(*cluster_heads(ratios, 1)), 3.9 / 8, 1e-12);
  // H_p = H is one group: the layer's largest ratio for every head.
  EXPECT_NEAR(grouping_memory_fraction(*cluster_heads(ratios, 8)), 0.9, 1e-12);
}

TEST(HeadGrouping, Errors) {
  const std::vector<std::vector<double>> ratios = {{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}};
  Expected<HeadGrouping> g = cluster_heads(ratios, 4);
  ASSERT_FALSE(g.has_value());
  EXPECT_NE(g.status().message().find("H_p = 4 must divide the 6 KV heads; valid values: 1, 2, 3, 6"),
            std::string::npos)
      << g.status().message();
  EXPECT_FALSE(cluster_heads(ratios, 0).has_value());
  EXPECT_FALSE(adjacent_heads(ratios, 7).has_value());
  EXPECT_FALSE(cluster_heads({}, 1).has_value());
  Expected<HeadGrouping> ragged = cluster_heads({{0.5, 0.5}, {0.5}}, 1);
  ASSERT_FALSE(ragged.has_value());
  EXPECT_NE(ragged.status().message().find("layer 1 has 1 budget ratios, layer 0 has 2"), std::string::npos);
  Expected<HeadGrouping> bad = cluster_heads({{0.5, 1.5}}, 1);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("layer 0 head 1"), std::string::npos);
  EXPECT_FALSE(cluster_heads({{0.5, 0.0}}, 1).has_value());
  EXPECT_FALSE(cluster_heads({{0.5, std::nan("")}}, 1).has_value());
  EXPECT_EQ(valid_heads_per_group(8), (std::vector<int>{1, 2, 4, 8}));
}

// Sum of group maxima of `order` cut into consecutive groups of p.
double cost(const std::vector<double>& r, const std::vector<int>& order, int p) {
  double c = 0.0;
  for (size_t i = 0; i < order.size(); i += p) {
    double m = 0.0;
    for (int j = 0; j < p; ++j) m = std::max(m, r[order[i + j]]);
    c += m;
  }
  return c;
}

TEST(HeadGrouping, ClusteredNeverNeedsMoreMemoryThanAnyGrouping) {
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> u(0.001, 1.0);
  for (int trial = 0; trial < 400; ++trial) {
    const int heads = std::vector<int>{2, 4, 6, 8}[rng() % 4];
    const int layers = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<double>> ratios(layers, std::vector<double>(heads));
    for (auto& row : ratios)
      for (double& r : row) r = (rng() % 4 == 0) ? std::round(u(rng) * 4) / 4 + 0.001 : u(rng);  // some ties
    for (auto& row : ratios)
      for (double& r : row) r = std::min(r, 1.0);
    for (int p : valid_heads_per_group(heads)) {
      Expected<HeadGrouping> c = cluster_heads(ratios, p);
      Expected<HeadGrouping> a = adjacent_heads(ratios, p);
      ASSERT_TRUE(c.has_value() && a.has_value());
      EXPECT_LE(grouping_memory_fraction(*c), grouping_memory_fraction(*a) + 1e-12);
      for (int l = 0; l < layers; ++l) {
        // Every head in exactly one group, groups of p, group ratio = max member, ascending.
        std::vector<int> seen;
        for (int gi = 0; gi < c->num_groups(); ++gi) {
          const std::vector<int>& members = c->groups[l][gi];
          ASSERT_EQ(static_cast<int>(members.size()), p);
          ASSERT_TRUE(std::is_sorted(members.begin(), members.end()));
          double m = 0.0;
          for (int h : members) m = std::max(m, ratios[l][h]);
          EXPECT_EQ(c->group_ratio[l][gi], m);
          for (int h : members) EXPECT_EQ(c->group_of_head[l][h], gi);
          for (int n : {1, 7, 100, 2048}) {
            int largest = 0;
            for (int h : members) largest = std::max(largest, ratio_token_budget(ratios[l][h], n));
            EXPECT_EQ(c->group_token_budget(l, gi, n), largest);
          }
          if (gi > 0) {
            EXPECT_GE(c->group_ratio[l][gi], c->group_ratio[l][gi - 1]);
            // Every member of a later group has a budget >= every member of an earlier one.
            for (int h : members)
              for (int e : c->groups[l][gi - 1]) EXPECT_GE(ratios[l][h], ratios[l][e]);
          }
          seen.insert(seen.end(), members.begin(), members.end());
        }
        std::sort(seen.begin(), seen.end());
        std::vector<int> all(heads);
        std::iota(all.begin(), all.end(), 0);
        ASSERT_EQ(seen, all);
        // Brute force over every ordering (heads <= 8; sampled for 8): none beats clustering.
        std::vector<int> order = all;
        double best = cost(ratios[l], order, p);
        int tried = 0;
        do {
          best = std::min(best, cost(ratios[l], order, p));
        } while (std::next_permutation(order.begin(), order.end()) && ++tried < 5000);
        double clustered = 0.0;
        for (double r : c->group_ratio[l]) clustered += r;
        EXPECT_LE(clustered, best + 1e-12);
      }
    }
  }
}

}  // namespace
}  // namespace origami

namespace origami {
namespace {

// A layout's group shares are each group's largest member ratio over the largest group's: under
// the clustering of the same budgets they equal the grouping's own group_ratio (normalized); under
// a grouping fixed by other budgets (a request's file on the engine's groups) they follow the
// layout's head lists, checked against a brute force over the heads.
TEST(HeadGrouping, LayoutGroupSharesFollowTheLayoutsHeads) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> ratio(0.05, 1.0);
  for (int trial = 0; trial < 20; ++trial) {
    const int layers = 3, heads = 8, hp = trial % 2 == 0 ? 2 : 4;
    std::vector<std::vector<double>> a(layers, std::vector<double>(heads)), b = a;
    for (auto& row : a) for (double& r : row) r = ratio(rng);
    for (auto& row : b) for (double& r : row) r = ratio(rng);
    auto grouping = cluster_heads(a, hp);
    ASSERT_TRUE(grouping.has_value());
    auto layout = KVLayout::grouped(layers, heads, 4, 16, 10, DType::kF32, grouping->groups);
    ASSERT_TRUE(layout.has_value()) << layout.status().to_string();
    double largest = 0.0;
    for (const auto& row : grouping->group_ratio) for (double r : row) largest = std::max(largest, r);
    const std::vector<float> own = layout_group_shares(a, *layout);
    ASSERT_EQ(static_cast<int>(own.size()), layout->num_groups());
    const int per_layer = heads / hp;
    for (int g = 0; g < layout->num_groups(); ++g)
      EXPECT_FLOAT_EQ(own[static_cast<size_t>(g)], static_cast<float>(grouping->group_ratio[g / per_layer][g % per_layer] / largest));
    // Other budgets on the same groups: brute force over each group's (layer, head) pairs.
    const std::vector<float> other = layout_group_shares(b, *layout);
    double other_largest = 0.0;
    std::vector<double> group_max;
    for (const HeadGroup& group : layout->groups) {
      double m = 0.0;
      for (int l = 0; l < layers; ++l)
        for (int h = 0; h < heads; ++h)
          if (layout->group_of(l, h).group == static_cast<int>(&group - layout->groups.data())) m = std::max(m, b[l][h]);
      group_max.push_back(m);
      other_largest = std::max(other_largest, m);
    }
    for (size_t g = 0; g < other.size(); ++g) EXPECT_FLOAT_EQ(other[g], static_cast<float>(group_max[g] / other_largest));
    EXPECT_FLOAT_EQ(*std::max_element(other.begin(), other.end()), 1.0f);
  }
}

}  // namespace
}  // namespace origami
