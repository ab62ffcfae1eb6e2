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

}  // namespace origami
