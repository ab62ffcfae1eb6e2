#pragma once
// Device tables of a grouped KV layout (KVLayout::grouped, TANGRAM §4.2-4.3) for the attention
// and KV-write kernels: per layer, each KV head's group (its table index within the layer) and
// its slot in the group's pages, and the ahead-of-time split map (kv/split_map.h) for every
// uniform split count the attention planner can choose.
//
// Why one map per uniform split count: plan_paged_attention picks s KV splits per (query tile,
// KV head) so that the grid fills the GPU; the ragged launch keeps that CTA count, s x H per
// query tile, and apportions it among a layer's groups in proportion to their budgets
// (apportion_ctas with N_CTA = s x groups), so a group of ratio 0.6 gets six times the splits of
// one of ratio 0.1 and every CTA reads about as many entries. The maps depend only on the layout
// and s, so they are computed once here and a CUDA graph captured for a bucket replays its own.
//
// The map only where it wins: for every s the tables also hold plain splits (every head s), and
// which of the two a step launches is decided here too (kv/split_map.h SplitMapChoice: the map
// from kSplitMapMinEntriesPerSplit entries per split of the planning length, and only where it
// differs from plain splits); a step compares its planning length with the bound of its s.
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/paged_attention.h"
#include "core/status.h"
#include "kv/kv_layout.h"
#include "kv/split_map.h"

namespace origami::cuda {

class RaggedHeadTables {
 public:
  RaggedHeadTables() = default;
  ~RaggedHeadTables();
  RaggedHeadTables(const RaggedHeadTables&) = delete;
  RaggedHeadTables& operator=(const RaggedHeadTables&) = delete;

  // Builds and uploads the tables of a grouped layout (layout.shared_pool; groups numbered layer
  // by layer, each one layer and heads_per_group() heads) for uniform split counts 1 ..
  // max_uniform_splits. use_budgets = false gives every group the same splits (the baseline the
  // split map is measured against). Errors name what is wrong with the layout.
  Status build(const KVLayout& layout, int max_uniform_splits, bool use_budgets = true);
  bool empty() const { return num_layers_ == 0; }
  // Frees the tables (a one-group layout replaced a grouped one).
  void clear();

  int groups_per_layer() const { return groups_per_layer_; }
  int max_uniform_splits() const { return max_s_; }
  // The largest split count any head gets with `uniform_splits` (the workspace's partial slots);
  // split_map = false: plain splits, uniform_splits itself (clamped).
  int max_splits(int uniform_splits, bool split_map = true) const;
  // The attention kernel's view of `layer` with the map for `uniform_splits` (clamped to
  // 1 .. max_uniform_splits()), or with plain splits (every head uniform_splits) when split_map
  // is false; page_stride in elements.
  RaggedHeads layer(int layer, int uniform_splits, long long page_stride, bool split_map = true) const;
  // Whether a step with `uniform_splits` splits planned for `planning_len` entries (the value
  // planning_length() gave the planner) launches the split map rather than plain splits: decided
  // in build() for every split count (SplitMapChoice), one comparison here.
  bool use_split_map(int uniform_splits, int planning_len) const {
    return choice_.use_map(clamp_s(uniform_splits), planning_len);
  }
  const int32_t* head_table(int layer) const { return dev_ + layer * num_kv_heads_; }
  const int32_t* head_slot(int layer) const { return dev_ + (num_layers_ + layer) * num_kv_heads_; }

  // The length the attention planner sizes a ragged step by, for a step whose longest group
  // holds `max_kv_len` entries: the mean group length, max_kv_len x mean budget / largest budget
  // (group lengths follow their budgets), so the ragged launch has as many CTAs as the one-group
  // layout would for the same KV bytes; the split map then gives long groups more of them. Uniform
  // budgets: max_kv_len itself.
  int planning_length(int max_kv_len) const;
  // Every group has the same budget: the map gives every head the same splits, and the backend
  // plans ragged steps exactly like one-group ones (so the grouping does not change results).
  bool uniform_budgets() const { return mean_length_fraction_ >= 1.0; }

  // The host split map for `uniform_splits`: [layer][group of the layer] -> splits (for tests).
  const std::vector<std::vector<int>>& split_map(int uniform_splits) const;

 private:
  int clamp_s(int s) const;
  int num_layers_ = 0;
  int num_kv_heads_ = 0;
  int groups_per_layer_ = 0;
  int max_s_ = 0;
  double mean_length_fraction_ = 1.0;  // mean group budget / largest
  std::vector<std::vector<std::vector<int>>> maps_;  // [s - 1][layer][group]
  std::vector<int> max_splits_;                      // [s - 1]
  SplitMapChoice choice_;
  // [L][H] table, [L][H] slot, then per s: [L][H] splits, [L][H] first grid row (the map), then
  // per s: [H] splits, [H] first grid row (plain splits, the same for every layer).
  int32_t* dev_ = nullptr;
};

}  // namespace origami::cuda
