#pragma once
// How KV memory is cut into head groups and pages. A page of group g holds, for each of the
// group's layers, K and V of `block_size` tokens for the group's heads, laid out per layer as
// [num_blocks, num_group_heads, block_size, head_dim] ("HND": one head's tokens are contiguous,
// which keeps per-head compaction and per-head attention reads contiguous).
#include <cstddef>
#include <vector>

#include "core/dtype.h"

namespace origami {

struct HeadGroup {
  std::vector<int> layers;    // layers this group covers
  std::vector<int> kv_heads;  // KV heads it covers, in every one of its layers
  int num_blocks = 0;         // pages in this group's pool (block 0 is the null block)
};

struct KVLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  std::vector<HeadGroup> groups;

  // The usual layout: one group with every layer and head, `num_blocks` pages.
  static KVLayout full(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks, DType dtype);
  // Bytes of one page of group g (K and V, all its layers and heads).
  size_t page_bytes(int group) const;
};

}  // namespace origami
