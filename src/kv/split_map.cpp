#include "kv/split_map.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>

namespace origami {
namespace {

// One layer: CTAs for groups with weights w (all > 0).
std::vector<int> apportion_layer(const std::vector<double>& w, int num_ctas) {
  const int groups = static_cast<int>(w.size());
  std::vector<int> out(groups, 1);
  if (num_ctas <= groups) return out;  // one each is the floor
  // Groups whose quota falls below 1 are held at 1; that shrinks what the others share, which
  // may push another below 1, so repeat until no free group's quota is below 1.
  std::vector<char> floored(groups, 0);
  std::vector<double> quota(groups, 0.0);
  while (true) {
    int free_ctas = num_ctas;
    double free_weight = 0.0;
    for (int g = 0; g < groups; ++g) {
      if (floored[g]) --free_ctas; else free_weight += w[g];
    }
    bool changed = false;
    for (int g = 0; g < groups; ++g) {
      if (floored[g]) continue;
      quota[g] = w[g] / free_weight * static_cast<double>(free_ctas);
      if (quota[g] < 1.0) {
        floored[g] = 1;
        changed = true;
      }
    }
    if (!changed) break;
  }
  // Hamilton: floors, then one more for the largest remainders (ties to the lower index).
  int assigned = 0;
  std::vector<int> free_groups;
  for (int g = 0; g < groups; ++g) {
    if (!floored[g]) {
      out[g] = static_cast<int>(std::floor(quota[g]));
      free_groups.push_back(g);
    }
    assigned += out[g];
  }
  // Remainders on a 1e-9 grid: quotas equal up to rounding are ties.
  std::vector<int64_t> rem(groups, 0);
  for (int g : free_groups) rem[g] = std::llround((quota[g] - std::floor(quota[g])) * 1e9);
  std::stable_sort(free_groups.begin(), free_groups.end(), [&](int a, int b) { return rem[a] > rem[b]; });
  for (size_t i = 0; assigned < num_ctas && i < free_groups.size(); ++i, ++assigned) ++out[free_groups[i]];
  return out;
}

}  // namespace

Expected<SplitMap> apportion_ctas(const std::vector<std::vector<double>>& group_weights, int num_ctas) {
  if (num_ctas < 1) return invalid_argument("split map: N_CTA = " + std::to_string(num_ctas) + " must be >= 1");
  SplitMap map;
  for (size_t l = 0; l < group_weights.size(); ++l) {
    const std::vector<double>& w = group_weights[l];
    if (w.empty()) return invalid_argument("split map: layer " + std::to_string(l) + " has no head groups");
    for (size_t g = 0; g < w.size(); ++g)
      if (!(std::isfinite(w[g]) && w[g] > 0.0))
        return invalid_argument("split map: weight of layer " + std::to_string(l) + " group " + std::to_string(g) +
                                " = " + std::to_string(w[g]) + " must be finite and > 0");
    map.push_back(apportion_layer(w, num_ctas));
  }
  return map;
}

Expected<SplitMap> compute_split_map(const HeadGrouping& grouping, int num_ctas) {
  return apportion_ctas(grouping.group_budget_sum, num_ctas);
}

SplitMapChoice::SplitMapChoice(const std::vector<SplitMap>& maps_by_splits) {
  for (size_t i = 0; i < maps_by_splits.size(); ++i) {
    const int s = static_cast<int>(i) + 1;
    bool differs = false;
    for (const std::vector<int>& layer : maps_by_splits[i])
      for (int splits : layer) differs = differs || splits != s;
    min_len_.push_back(differs ? static_cast<long long>(kSplitMapMinEntriesPerSplit) * s : -1);
  }
}

long long SplitMapChoice::min_planning_len(int uniform_splits) const {
  if (uniform_splits < 1 || uniform_splits > max_splits()) return -1;
  return min_len_[static_cast<size_t>(uniform_splits) - 1];
}

bool SplitMapChoice::use_map(int uniform_splits, long long planning_len) const {
  const long long bound = min_planning_len(uniform_splits);
  return bound >= 0 && planning_len >= bound;
}

}  // namespace origami
