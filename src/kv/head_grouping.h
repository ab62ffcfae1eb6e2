#pragma once
// Which KV heads share a page table (TANGRAM's ragged paging, paper §4.2). A head group holds
// H_p heads of one layer; its pages hold as many entries as its largest budget asks, so mixing a
// long-retention head with short ones pads the short ones. Budget-aware clustering (§4.2.2)
// sorts each layer's heads by calibrated budget and cuts the order into consecutive groups of
// H_p, so every group's allocation tracks what its members keep; `adjacent` grouping (heads
// 0..H_p-1, H_p..2H_p-1, ...) is the baseline it is compared with (paper Fig. 15).
//
// Sorting into consecutive groups is optimal for equal-sized groups: the i-th largest group
// maximum can never be below the (i * H_p)-th largest budget, and clustering attains exactly
// that, so clustered groups never need more memory than any other grouping, adjacent included.
#include <vector>

#include "core/status.h"
#include "kv/head_budgets.h"
#include "kv/kv_layout.h"

namespace origami {

enum class GroupingMode {
  kClustered,  // budget-aware: sort by budget, then cut (TANGRAM)
  kAdjacent,   // consecutive head indices
};
const char* grouping_mode_name(GroupingMode mode);

struct HeadGrouping {
  GroupingMode mode = GroupingMode::kClustered;
  int heads_per_group = 0;  // H_p
  int num_kv_heads = 0;     // H
  // [layer][group] -> the group's KV heads in ascending index order. Clustered: groups in
  // ascending budget order (group 0 holds the H_p smallest budgets, ties to the lower head
  // index); adjacent: group g holds heads g*H_p .. (g+1)*H_p - 1.
  std::vector<std::vector<std::vector<int>>> groups;
  // [layer][group] -> the group's budget ratio: the largest of its heads' ratios (its page
  // table holds ceil(ratio * N) entries for each of its heads).
  std::vector<std::vector<double>> group_ratio;
  // [layer][group] -> the sum of its heads' ratios (the paper's aggregated budget Phi, Alg. 1).
  std::vector<std::vector<double>> group_budget_sum;
  // [layer][head] -> the group holding that head.
  std::vector<std::vector<int>> group_of_head;

  int num_layers() const { return static_cast<int>(groups.size()); }
  int num_groups() const { return heads_per_group > 0 ? num_kv_heads / heads_per_group : 0; }
  // Entries each head of (layer, group) has room for in an N-token document: ceil(ratio * N),
  // the largest of its members' head_token_budget (ratio_token_budget is monotone).
  int group_token_budget(int layer, int group, int num_tokens) const {
    return ratio_token_budget(group_ratio[layer][group], num_tokens);
  }
};

// Groups the heads of a [layer][head] ratio matrix (every row the same length H >= 1, every
// ratio in (0, 1]). Errors: an empty or ragged matrix, a ratio outside (0, 1] or NaN, H_p < 1,
// or H_p not dividing H (the message lists the H_p that do).
Expected<HeadGrouping> group_heads(const std::vector<std::vector<double>>& ratios, int heads_per_group,
                                   GroupingMode mode);
inline Expected<HeadGrouping> cluster_heads(const std::vector<std::vector<double>>& ratios, int heads_per_group) {
  return group_heads(ratios, heads_per_group, GroupingMode::kClustered);
}
inline Expected<HeadGrouping> adjacent_heads(const std::vector<std::vector<double>>& ratios, int heads_per_group) {
  return group_heads(ratios, heads_per_group, GroupingMode::kAdjacent);
}
inline Expected<HeadGrouping> group_heads(const HeadBudgets& budgets, int heads_per_group, GroupingMode mode) {
  return group_heads(budgets.ratios, heads_per_group, mode);
}

// The KV memory a grouping needs as a share of full KV, for long documents (ignoring page
// rounding): sum over layers and groups of H_p * group_ratio / (L * H). 1 = no saving.
double grouping_memory_fraction(const HeadGrouping& grouping);

// Each head group of a grouped `layout` holds as many entries as its largest budget asks: its
// heads' largest ratio in the [layer][head] matrix `ratios` (which must match the layout's
// shape). Returned over the largest group's, in the layout's group order, so the group that
// retains most has share 1 and group g keeps ceil(share_g x lead) entries per head. Works for any
// grouping of the heads: clustered by these very budgets, or fixed by other ones (a request's own
// budget file under the engine's groups).
std::vector<float> layout_group_shares(const std::vector<std::vector<double>>& ratios, const KVLayout& layout);

// The H_p in [1, H] that divide H, ascending.
std::vector<int> valid_heads_per_group(int num_kv_heads);

}  // namespace origami
