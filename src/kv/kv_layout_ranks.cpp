#include "kv/kv_layout_ranks.h"

#include <string>

namespace origami {

Expected<std::vector<std::vector<std::vector<int>>>> striped_heads(int num_layers, int num_kv_heads,
                                                                   int heads_per_group, int ranks) {
  if (ranks < 1 || num_kv_heads % ranks != 0)
    return invalid_argument("tensor parallelism: " + std::to_string(num_kv_heads) + " KV heads do not split over " +
                            std::to_string(ranks) + " ranks");
  if (heads_per_group < ranks || heads_per_group % ranks != 0 || num_kv_heads % heads_per_group != 0)
    return invalid_argument("tensor parallelism: " + std::to_string(heads_per_group) + " heads per group over " +
                            std::to_string(ranks) +
                            " ranks: a group takes as many heads from every rank, so --heads-per-group must be a "
                            "multiple of the ranks that divides the model's " +
                            std::to_string(num_kv_heads) + " KV heads");
  const int per_rank = num_kv_heads / ranks, share = heads_per_group / ranks;
  std::vector<std::vector<std::vector<int>>> out(static_cast<size_t>(num_layers));
  for (auto& layer : out)
    for (int k = 0; k < per_rank / share; ++k) {
      std::vector<int> group;
      for (int r = 0; r < ranks; ++r)
        for (int j = 0; j < share; ++j) group.push_back(r * per_rank + k * share + j);
      layer.push_back(std::move(group));
    }
  return out;
}

Expected<KVLayout> slice_layout_for_rank(const KVLayout& layout, int rank, int ranks) {
  if (ranks < 1 || rank < 0 || rank >= ranks) return invalid_argument("tensor parallelism: rank out of range");
  if (layout.num_kv_heads % ranks != 0)
    return invalid_argument("tensor parallelism: " + std::to_string(layout.num_kv_heads) + " KV heads over " +
                            std::to_string(ranks) + " ranks");
  const int per_rank = layout.num_kv_heads / ranks, first = rank * per_rank;
  KVLayout out = layout;
  out.num_kv_heads = per_rank;
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const HeadGroup& group = layout.groups[g];
    // Heads per rank in this group: all must be equal (a page has one size on every rank).
    std::vector<int> count(static_cast<size_t>(ranks), 0);
    for (int h : group.kv_heads) ++count[static_cast<size_t>(h / per_rank)];
    for (int r = 1; r < ranks; ++r)
      if (count[static_cast<size_t>(r)] != count[0])
        return Status(ErrorCode::kUnimplemented,
                      "tensor parallelism: head group " + std::to_string(g) + " has " + std::to_string(count[0]) +
                          " KV heads on rank 0 and " + std::to_string(count[static_cast<size_t>(r)]) + " on rank " +
                          std::to_string(r) +
                          ": groups must hold as many heads on every rank (use --heads-per-group N with N a "
                          "multiple of --tensor-parallel-size; calibrated groups run on one GPU)");
    HeadGroup& local = out.groups[g];
    local.kv_heads.clear();
    for (int h : group.kv_heads)
      if (h >= first && h < first + per_rank) local.kv_heads.push_back(h - first);
  }
  return out;
}

}  // namespace origami
