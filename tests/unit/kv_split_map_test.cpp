// The AOT workload split map (kv/split_map.h, TANGRAM Algorithm 1): every layer hands out
// exactly max(N_CTA, groups) CTAs, every group at least 1, in proportion to its aggregated
// budget (within 1 of its quota, a larger budget never gets fewer), deterministically; where
// the paper's round() already sums to N_CTA, the same map.
#include "kv/split_map.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

namespace origami {
namespace {

// Algorithm 1 as printed: S = max(1, round(Phi / (Omega / N_CTA))).
std::vector<int> algorithm1(const std::vector<double>& phi, int num_ctas) {
  const double omega = std::accumulate(phi.begin(), phi.end(), 0.0);
  std::vector<int> s;
  for (double p : phi) s.push_back(std::max(1, static_cast<int>(std::lround(p / (omega / num_ctas)))));
  return s;
}

TEST(SplitMap, WorkedExamples) {
  // Proportional weights that divide evenly: the paper's rounding and this agree.
  Expected<SplitMap> m = apportion_ctas({{1.0, 2.0, 3.0, 2.0}, {0.5, 0.5, 0.5, 0.5}}, 16);
  ASSERT_TRUE(m.has_value()) << m.status().message();
  EXPECT_EQ((*m)[0], (std::vector<int>{2, 4, 6, 4}));
  EXPECT_EQ((*m)[1], (std::vector<int>{4, 4, 4, 4}));
  EXPECT_EQ((*m)[0], algorithm1({1.0, 2.0, 3.0, 2.0}, 16));
  // Three equal groups, 4 CTAs: round() would give 1 + 1 + 1; the spare CTA goes to group 0.
  EXPECT_EQ((*apportion_ctas({{1.0, 1.0, 1.0}}, 4))[0], (std::vector<int>{2, 1, 1}));
  // A tiny group is held at 1 and the rest is shared by the others: quotas of 10 CTAs over
  // 0.01, 1, 1 -> 1 for the first, then 9 over two equal groups -> 5, 4.
  EXPECT_EQ((*apportion_ctas({{0.01, 1.0, 1.0}}, 10))[0], (std::vector<int>{1, 5, 4}));
  // Fewer CTAs than groups: one each.
  EXPECT_EQ((*apportion_ctas({{0.1, 0.9, 0.5}}, 2))[0], (std::vector<int>{1, 1, 1}));
}

TEST(SplitMap, FromAGrouping) {
  const std::vector<std::vector<double>> ratios = {{0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4}};
  Expected<HeadGrouping> g = cluster_heads(ratios, 2);
  ASSERT_TRUE(g.has_value());
  // Phi (sums): {0.1+0.2, 0.3+0.4, 0.5+0.7, 0.8+0.9} = {0.3, 0.7, 1.2, 1.7} of 3.9; 78 CTAs:
  // quotas 6, 14, 24, 34.
  Expected<SplitMap> m = compute_split_map(*g, 78);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ((*m)[0], (std::vector<int>{6, 14, 24, 34}));
}

TEST(SplitMap, Errors) {
  EXPECT_FALSE(apportion_ctas({{1.0}}, 0).has_value());
  EXPECT_FALSE(apportion_ctas({{}}, 4).has_value());
  Expected<SplitMap> bad = apportion_ctas({{1.0, 0.0}}, 4);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("layer 0 group 1"), std::string::npos);
  EXPECT_FALSE(apportion_ctas({{1.0, std::nan("")}}, 4).has_value());
  EXPECT_FALSE(apportion_ctas({{1.0, -1.0}}, 4).has_value());
}

TEST(SplitMap, InvariantsOverRandomBudgets) {
  std::mt19937 rng(99);
  std::uniform_real_distribution<double> u(0.001, 1.0);
  for (int trial = 0; trial < 2000; ++trial) {
    const int groups = 1 + static_cast<int>(rng() % 16);
    const int layers = 1 + static_cast<int>(rng() % 3);
    const int num_ctas = 1 + static_cast<int>(rng() % 300);
    std::vector<std::vector<double>> w(layers, std::vector<double>(groups));
    for (auto& row : w)
      for (double& x : row) x = (rng() % 5 == 0) ? 0.5 : u(rng) * (rng() % 3 == 0 ? 0.01 : 4.0);  // ties, small
    Expected<SplitMap> m = apportion_ctas(w, num_ctas);
    ASSERT_TRUE(m.has_value());
    ASSERT_EQ(m->size(), w.size());
    Expected<SplitMap> again = apportion_ctas(w, num_ctas);
    ASSERT_EQ(*m, *again);  // deterministic
    for (int l = 0; l < layers; ++l) {
      const std::vector<int>& s = (*m)[l];
      ASSERT_EQ(static_cast<int>(s.size()), groups);
      const int total = std::accumulate(s.begin(), s.end(), 0);
      ASSERT_EQ(total, std::max(num_ctas, groups)) << "trial " << trial;
      for (int x : s) ASSERT_GE(x, 1);
      // Monotone: a larger budget never gets fewer CTAs.
      for (int a = 0; a < groups; ++a)
        for (int b = 0; b < groups; ++b)
          if (w[l][a] > w[l][b]) {
            ASSERT_GE(s[a], s[b]) << "trial " << trial;
          }
      // Proportional: groups above the floor are within 1 of their share of what the floored
      // groups leave.
      if (num_ctas > groups) {
        int floored = 0;
        double free_weight = 0.0;
        for (int g = 0; g < groups; ++g) {
          const double quota = w[l][g] / std::accumulate(w[l].begin(), w[l].end(), 0.0) * num_ctas;
          if (s[g] == 1 && quota < 1.0 + 1e-9) ++floored; else free_weight += w[l][g];
        }
        for (int g = 0; g < groups; ++g) {
          const double quota = w[l][g] / std::accumulate(w[l].begin(), w[l].end(), 0.0) * num_ctas;
          if (s[g] == 1 && quota < 1.0 + 1e-9) continue;
          const double free_quota = w[l][g] / free_weight * (num_ctas - floored);
          EXPECT_LT(std::abs(s[g] - free_quota), 1.0 + 1e-9) << "trial " << trial << " group " << g;
        }
      }
    }
  }
}

// The maps for s = 1 .. max_s of one set of [layer][group] weights (what RaggedHeadTables builds).
std::vector<SplitMap> maps_up_to(const std::vector<std::vector<double>>& w, int max_s) {
  std::vector<SplitMap> maps;
  for (int s = 1; s <= max_s; ++s) maps.push_back(*apportion_ctas(w, s * static_cast<int>(w[0].size())));
  return maps;
}

TEST(SplitMapChoice, FollowsTheEntriesPerSplitRuleForEverySplitCount) {
  // Two layers of four groups, a calibration-like spread: the map differs from plain splits for
  // every s >= 2 (checked by brute force below, not assumed).
  const std::vector<std::vector<double>> w = {{0.1, 0.25, 0.4, 0.6}, {0.3, 0.35, 0.5, 0.2}};
  const int max_s = 40;
  const std::vector<SplitMap> maps = maps_up_to(w, max_s);
  const SplitMapChoice choice(maps);
  ASSERT_EQ(choice.max_splits(), max_s);
  for (int s = 1; s <= max_s; ++s) {
    bool differs = false;
    for (const auto& layer : maps[s - 1])
      for (int x : layer) differs = differs || x != s;
    EXPECT_EQ(differs, s >= 2) << "s " << s;  // s = 1: one CTA per group either way
    for (int len = 1; len <= 600 * s; len += (len < 500 * s ? 7 : 1)) {
      const bool expected = differs && len >= kSplitMapMinEntriesPerSplit * s;
      ASSERT_EQ(choice.use_map(s, len), expected) << "s " << s << " planning length " << len;
      ASSERT_EQ(choice.use_map(s, len), differs && split_map_wins(len, s));
    }
    EXPECT_EQ(choice.min_planning_len(s), differs ? 512LL * s : -1);
  }
  // Split counts the planner cannot return (the backend clamps before asking): never the map.
  EXPECT_FALSE(choice.use_map(0, 1 << 30));
  EXPECT_FALSE(choice.use_map(max_s + 1, 1 << 30));
}

TEST(SplitMapChoice, UniformBudgetsNeverUseTheMap) {
  // Equal weights: every map is s splits per group, i.e. plain splits, however long the plan.
  const SplitMapChoice choice(maps_up_to({{0.5, 0.5, 0.5, 0.5}, {1.0, 1.0, 1.0, 1.0}}, 66));
  for (int s = 1; s <= 66; ++s) {
    EXPECT_EQ(choice.min_planning_len(s), -1);
    EXPECT_FALSE(choice.use_map(s, 1 << 30));
  }
  EXPECT_FALSE(SplitMapChoice().use_map(1, 1 << 30));  // no layout loaded
}

TEST(SplitMapChoice, PicksTheFasterVariantOfTheMeasuredRows) {
  // H100 rows of bench/ragged_attention_bench.cu (default and --long tables, docs/kernels.md
  // "Ragged paging"), under the plan the backend launches (plan_ragged_attention), whose two
  // variants differ by 2% or more: planning length (the bench's mean group length, from its
  // seed-7 calibration), s, and no map / map.
  struct Row {
    int planning_len, s;
    double nomap_over_map;
  };
  const Row rows[] = {
      {3101, 25, 0.94},   // H_p 2, batch 1, N 8192
      {12400, 33, 0.94},  // H_p 2, batch 1, N 32768
      {24798, 33, 1.04},  // H_p 2, batch 1, N 65536
      {49596, 33, 1.10},  // H_p 2, batch 1, N 131072
      {24798, 16, 1.10},  // H_p 2, batch 2, N 65536
      {49596, 16, 1.11},  // H_p 2, batch 2, N 131072
      {12400, 8, 1.07},   // H_p 2, batch 4, N 32768
      {12400, 5, 1.02},   // H_p 2, batch 16, N 32768
      {3531, 28, 0.95},   // H_p 4, batch 1, N 8192
      {14122, 33, 0.97},  // H_p 4, batch 1, N 32768
      {14122, 8, 1.04},   // H_p 4, batch 4, N 32768
  };
  for (const Row& r : rows)
    EXPECT_EQ(split_map_wins(r.planning_len, r.s), r.nomap_over_map > 1.0)
        << "planning length " << r.planning_len << ", s " << r.s << ": measured no map / map " << r.nomap_over_map;
}

}  // namespace
}  // namespace origami
