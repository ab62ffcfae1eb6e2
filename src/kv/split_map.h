#pragma once
// TANGRAM's ahead-of-time workload split map (paper §4.3, Algorithm 1): how many decode-
// attention CTAs (KV splits) each head group of each layer gets, computed once from the
// calibrated budgets, so that every CTA reads about the same number of KV entries and no
// runtime planning is needed. A group's weight is its aggregated budget Phi = sum of its heads'
// ratios; since every group's length scales with the same document length N, the plan holds for
// every N and batch.
//
// Where origami differs from Algorithm 1: the paper sets S = max(1, round(Phi / tau)) with
// tau = Omega / N_CTA, which can hand out more or fewer than N_CTA CTAs in total (three equal
// groups and N_CTA = 4 give 1 + 1 + 1). Here the CTAs are apportioned exactly (Hamilton's
// largest-remainder method, ties to the lower group index): every group gets at least 1, groups
// whose quota is below 1 are held at 1 and the rest of N_CTA is shared among the others in
// proportion to Phi, so a layer's entries sum to exactly max(N_CTA, number of groups), every
// unfloored entry is within 1 of its quota, and a group with a larger Phi never gets fewer CTAs.
// Where round() already sums to N_CTA the two agree.
#include <vector>

#include "core/status.h"
#include "kv/head_grouping.h"

namespace origami {

// [layer][group] -> CTAs.
using SplitMap = std::vector<std::vector<int>>;

// Apportions `num_ctas` among the groups of every layer in proportion to `group_weights`
// ([layer][group], every weight finite and > 0), as described above. Errors: num_ctas < 1, an
// empty layer, a weight that is not finite and > 0.
Expected<SplitMap> apportion_ctas(const std::vector<std::vector<double>>& group_weights, int num_ctas);

// Algorithm 1 over a grouping (clustered or adjacent): weights = group_budget_sum.
Expected<SplitMap> compute_split_map(const HeadGrouping& grouping, int num_ctas);

// The split map only where it wins (issue 29). A launch of s uniform splits sized by a planning
// length of P entries (the mean group length, RaggedHeadTables::planning_length) either shares
// its s x groups CTAs out by the map or gives every group s splits ("plain"). Measured on the
// H100 with the narrow decode kernel (bench/ragged_attention_bench.cu and its --long rows,
// Qwen3-8B shape, 36 launches, head ratios in [0.1, 0.6]; docs/kernels.md "Ragged paging"), under
// the plan the backend launches (plan_ragged_attention), no map / map by P / s:
//   124-126  (batch 1, N 8K: 3-5K entries per head)        0.93-0.96x  plain wins
//   375-427  (batch 1, N 32K)                               0.94-0.97x  plain wins
//   387-441  (batch 4, N 8K)                                1.00-1.01x  tie
//   620-706  (batch 16, N 8K)                               1.00x       tie
//   751      (batch 1, N 64K)                               1.04x       map wins
//   1502-7061 (batch 1-2 with N 64-128K, batch 4-64 long)   1.01-1.11x  map wins
// Short splits are latency-bound: the map's extra splits for long groups each pay a CTA's fixed
// work and lengthen the merge, and that outweighs the shorter longest CTA until a split reads
// several hundred entries. Threshold: 512 entries (eight 64-entry KV tiles, four 128-entry
// minimum splits), between the last loss (427) and the first win (751); the rows between are
// ties. Not measured: batch 1 between 427 and 751, and other GPUs (re-measure with the bench,
// which prints the rule's pick and the faster variant per row). Under plan_paged_attention's two
// waves (not what the backend launches for non-uniform budgets at batch 1-4) the map loses more
// (0.84-0.95x at batch 1-2 up to P / s 1550): the threshold is set by the one-wave plan.
inline constexpr int kSplitMapMinEntriesPerSplit = 512;

// The rule alone: the map for `uniform_splits` splits of a `planning_len` plan.
inline bool split_map_wins(long long planning_len, int uniform_splits) {
  return planning_len >= static_cast<long long>(kSplitMapMinEntriesPerSplit) * uniform_splits;
}

// The rule decided once per layout (when the budgets load), for every uniform split count the
// planner can return: maps_by_splits[s - 1] is the split map for s uniform splits. A step then
// only compares its planning length with the bound of its s (no planning, no new tables). Where
// the map gives every group exactly s splits (uniform budgets, or s = 1) it is plain splits and
// is never "used" (plain tables, the same launch).
class SplitMapChoice {
 public:
  SplitMapChoice() = default;
  explicit SplitMapChoice(const std::vector<SplitMap>& maps_by_splits);
  // The shortest planning length from which the map is used with s uniform splits (-1 = never;
  // s outside 1 .. max_splits(): never).
  long long min_planning_len(int uniform_splits) const;
  bool use_map(int uniform_splits, long long planning_len) const;
  int max_splits() const { return static_cast<int>(min_len_.size()); }

 private:
  std::vector<long long> min_len_;  // [s - 1]
};

}  // namespace origami
