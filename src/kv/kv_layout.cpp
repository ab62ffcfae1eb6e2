#include "kv/kv_layout.h"

#include <numeric>

#include "core/check.h"

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

size_t KVLayout::page_bytes(int group) const {
  ORIGAMI_CHECK(group >= 0 && group < static_cast<int>(groups.size()));
  const HeadGroup& g = groups[static_cast<size_t>(group)];
  // K and V, for each of the group's layers: [num_group_heads, block_size, head_dim].
  return size_t{2} * g.layers.size() * g.kv_heads.size() * static_cast<size_t>(block_size) *
         static_cast<size_t>(head_dim) * dtype_size(dtype);
}

}  // namespace origami
