#include "kv/kv_layout.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/check.h"
#include "kv/kv_cache_dtype.h"

namespace origami {

KVLayout KVLayout::full(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks, DType dtype) {
  KVLayout layout;
  layout.num_layers = num_layers;
  layout.num_kv_heads = num_kv_heads;
  layout.head_dim = head_dim;
  layout.block_size = block_size;
  layout.dtype = dtype;
  HeadGroup group;
  group.layers.resize(static_cast<size_t>(num_layers));
  std::iota(group.layers.begin(), group.layers.end(), 0);
  group.kv_heads.resize(static_cast<size_t>(num_kv_heads));
  std::iota(group.kv_heads.begin(), group.kv_heads.end(), 0);
  group.num_blocks = num_blocks;
  layout.groups.push_back(std::move(group));
  return layout;
}

Expected<KVLayout> KVLayout::grouped(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_pages,
                                     DType dtype,
                                     const std::vector<std::vector<std::vector<int>>>& heads_per_layer_group) {
  auto fail = [](std::string why) { return invalid_argument("head groups: " + std::move(why)); };
  if (num_layers <= 0 || num_kv_heads <= 0) return fail("num_layers and num_kv_heads must be positive");
  if (static_cast<int>(heads_per_layer_group.size()) != num_layers)
    return fail("expected the groups of " + std::to_string(num_layers) + " layers, got " +
                std::to_string(heads_per_layer_group.size()));
  KVLayout layout;
  layout.num_layers = num_layers;
  layout.num_kv_heads = num_kv_heads;
  layout.head_dim = head_dim;
  layout.block_size = block_size;
  layout.dtype = dtype;
  layout.shared_pool = true;
  size_t heads = 0;
  for (int l = 0; l < num_layers; ++l) {
    std::vector<int> seen(static_cast<size_t>(num_kv_heads), 0);
    const auto& layer_groups = heads_per_layer_group[static_cast<size_t>(l)];
    if (layer_groups.empty()) return fail("layer " + std::to_string(l) + " has no group");
    for (const std::vector<int>& g : layer_groups) {
      if (g.empty()) return fail("layer " + std::to_string(l) + " has an empty group");
      if (heads == 0) heads = g.size();
      if (g.size() != heads)
        return fail("every group must have the same number of heads (pages have one size); layer " +
                    std::to_string(l) + " has a group of " + std::to_string(g.size()) + ", expected " +
                    std::to_string(heads));
      for (int h : g) {
        if (h < 0 || h >= num_kv_heads)
          return fail("layer " + std::to_string(l) + " names KV head " + std::to_string(h) + " of " +
                      std::to_string(num_kv_heads));
        if (seen[static_cast<size_t>(h)]++)
          return fail("layer " + std::to_string(l) + " lists KV head " + std::to_string(h) + " twice");
      }
      layout.groups.push_back({{l}, g, num_pages});
    }
    for (int h = 0; h < num_kv_heads; ++h)
      if (!seen[static_cast<size_t>(h)])
        return fail("layer " + std::to_string(l) + " leaves KV head " + std::to_string(h) + " in no group");
  }
  return layout;
}

std::vector<std::vector<std::vector<int>>> KVLayout::adjacent_heads(int num_layers, int num_kv_heads,
                                                                    int heads_per_group) {
  ORIGAMI_CHECK(heads_per_group >= 1 && num_kv_heads % heads_per_group == 0);
  std::vector<std::vector<std::vector<int>>> out(static_cast<size_t>(num_layers));
  for (auto& layer : out)
    for (int h0 = 0; h0 < num_kv_heads; h0 += heads_per_group) {
      std::vector<int> g(static_cast<size_t>(heads_per_group));
      std::iota(g.begin(), g.end(), h0);
      layer.push_back(std::move(g));
    }
  return out;
}

HeadGroupSlot KVLayout::group_of(int layer, int head) const {
  for (int g = 0; g < num_groups(); ++g) {
    const HeadGroup& group = groups[static_cast<size_t>(g)];
    if (std::find(group.layers.begin(), group.layers.end(), layer) == group.layers.end()) continue;
    for (size_t s = 0; s < group.kv_heads.size(); ++s)
      if (group.kv_heads[s] == head) return {g, static_cast<int>(s)};
  }
  return {};
}

size_t KVLayout::head_vector_bytes() const {
  return fp8 ? static_cast<size_t>(head_dim) + kKVFp8ScaleBytes : static_cast<size_t>(head_dim) * dtype_size(dtype);
}

size_t KVLayout::page_bytes(int group) const {
  ORIGAMI_CHECK(group >= 0 && group < static_cast<int>(groups.size()));
  const HeadGroup& g = groups[static_cast<size_t>(group)];
  // K and V, for each of the group's layers: [num_group_heads, block_size, head vector].
  return size_t{2} * g.layers.size() * g.kv_heads.size() * static_cast<size_t>(block_size) * head_vector_bytes();
}

int KVLayout::groups_per_full_block() const {
  const size_t full = size_t{2} * num_layers * num_kv_heads * block_size * head_vector_bytes();
  return static_cast<int>(full / page_bytes(0));
}

}  // namespace origami
