#include "kv/head_grouping.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace origami {

const char* grouping_mode_name(GroupingMode mode) {
  return mode == GroupingMode::kClustered ? "clustered" : "adjacent";
}

std::vector<float> layout_group_shares(const std::vector<std::vector<double>>& ratios, const KVLayout& layout) {
  std::vector<double> group_ratio;
  double largest = 0.0;
  for (const HeadGroup& group : layout.groups) {
    double r = 0.0;
    for (int layer : group.layers)
      for (int head : group.kv_heads) r = std::max(r, ratios.at(static_cast<size_t>(layer)).at(static_cast<size_t>(head)));
    group_ratio.push_back(r);
    largest = std::max(largest, r);
  }
  std::vector<float> shares;
  for (double r : group_ratio) shares.push_back(static_cast<float>(largest > 0.0 ? std::min(1.0, r / largest) : 1.0));
  return shares;
}

std::vector<int> valid_heads_per_group(int num_kv_heads) {
  std::vector<int> out;
  for (int p = 1; p <= num_kv_heads; ++p)
    if (num_kv_heads % p == 0) out.push_back(p);
  return out;
}

Expected<HeadGrouping> group_heads(const std::vector<std::vector<double>>& ratios, int heads_per_group,
                                   GroupingMode mode) {
  if (ratios.empty() || ratios[0].empty())
    return invalid_argument("head grouping: no budget ratios (expected one per layer and KV head)");
  const int heads = static_cast<int>(ratios[0].size());
  for (size_t l = 0; l < ratios.size(); ++l) {
    if (static_cast<int>(ratios[l].size()) != heads)
      return invalid_argument("head grouping: layer " + std::to_string(l) + " has " + std::to_string(ratios[l].size()) +
                              " budget ratios, layer 0 has " + std::to_string(heads));
    for (int h = 0; h < heads; ++h)
      if (!(ratios[l][h] > 0.0 && ratios[l][h] <= 1.0))
        return invalid_argument("head grouping: ratio of layer " + std::to_string(l) + " head " + std::to_string(h) +
                                " = " + std::to_string(ratios[l][h]) + " is not in (0, 1]");
  }
  if (heads_per_group < 1 || heads % heads_per_group != 0) {
    std::string valid;
    for (int p : valid_heads_per_group(heads)) valid += (valid.empty() ? "" : ", ") + std::to_string(p);
    return invalid_argument("heads per group H_p = " + std::to_string(heads_per_group) + " must divide the " +
                            std::to_string(heads) + " KV heads; valid values: " + valid);
  }
  HeadGrouping g;
  g.mode = mode;
  g.heads_per_group = heads_per_group;
  g.num_kv_heads = heads;
  const int num_groups = heads / heads_per_group;
  for (const std::vector<double>& row : ratios) {
    std::vector<int> order(heads);
    std::iota(order.begin(), order.end(), 0);
    // Stable on index order, so equal budgets keep the lower head first.
    if (mode == GroupingMode::kClustered)
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return row[a] < row[b]; });
    std::vector<std::vector<int>> layer_groups;
    std::vector<double> layer_ratio, layer_sum;
    std::vector<int> layer_group_of(heads, -1);
    for (int i = 0; i < num_groups; ++i) {
      std::vector<int> members(order.begin() + i * heads_per_group, order.begin() + (i + 1) * heads_per_group);
      double max_ratio = 0.0, sum = 0.0;
      for (int h : members) {
        max_ratio = std::max(max_ratio, row[h]);
        sum += row[h];
        layer_group_of[h] = i;
      }
      std::sort(members.begin(), members.end());
      layer_groups.push_back(std::move(members));
      layer_ratio.push_back(max_ratio);
      layer_sum.push_back(sum);
    }
    g.groups.push_back(std::move(layer_groups));
    g.group_ratio.push_back(std::move(layer_ratio));
    g.group_budget_sum.push_back(std::move(layer_sum));
    g.group_of_head.push_back(std::move(layer_group_of));
  }
  return g;
}

double grouping_memory_fraction(const HeadGrouping& g) {
  if (g.groups.empty() || g.num_kv_heads == 0) return 0.0;
  double sum = 0.0;
  for (const std::vector<double>& layer : g.group_ratio)
    for (double r : layer) sum += static_cast<double>(g.heads_per_group) * r;
  return sum / (static_cast<double>(g.num_layers()) * g.num_kv_heads);
}

}  // namespace origami
