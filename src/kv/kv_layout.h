#pragma once
// How KV memory is cut into head groups and pages. A head group is a set of (layer, KV head)
// pairs that share one page table and one length per request.
//
//  - Full layout (KVLayout::full): one group with every layer and head; a page holds, for each
//    layer, K and V of `block_size` tokens for all heads, laid out per layer as
//    [num_blocks, num_kv_heads, block_size, head_dim] ("HND": one head's tokens are contiguous,
//    which keeps per-head compaction and per-head attention reads contiguous).
//  - Grouped layout (KVLayout::grouped, TANGRAM §4.2): each group is (one layer, H_p of its KV
//    heads), and every group draws its pages from ONE shared pool (`shared_pool`): all pages have
//    the same size (K and V of H_p heads x block_size x head_dim, one layer), so the pages a group
//    with a small budget does not need are usable by every other group. A page is laid out
//    [2 (K, V), H_p, block_size, head_dim].
#include <cstddef>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace origami {

struct HeadGroup {
  std::vector<int> layers;    // layers this group covers
  std::vector<int> kv_heads;  // KV heads it covers, in every one of its layers, in slot order
  int num_blocks = 0;         // pages in this group's pool (the shared pool's size when shared)
  // The group's share of a request's budget (its entries relative to the other groups'; 1 =
  // uniform). Backends split attention work by it (kv/split_map.h), decided once at layout setup.
  double budget = 1.0;
};

// Where one (layer, KV head) lives: its group and its slot (index) among the group's heads.
struct HeadGroupSlot {
  int group = -1;
  int slot = -1;
};

struct KVLayout {
  int num_layers = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  // FP8 entries (--kv-cache-dtype fp8, kv/kv_cache_dtype.h): each head vector of K and of V is
  // head_dim E4M3 codes plus one fp32 scale; `dtype` is then the precision reads dequantize to.
  bool fp8 = false;
  std::vector<HeadGroup> groups;
  // Every group allocates from one pool of groups[0].num_blocks pages (grouped layouts).
  bool shared_pool = false;

  // The usual layout: one group with every layer and head, `num_blocks` pages.
  static KVLayout full(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_blocks, DType dtype);
  // Per-layer head groups sharing one pool of `num_pages` pages (the null page included):
  // heads_per_layer_group[layer] lists that layer's groups, each an ordered list of KV heads;
  // every head of every layer must appear exactly once and all groups must have the same number
  // of heads (pages have one size). Groups are numbered layer by layer in the order given.
  // A single group per layer with every head is still a grouped layout (one group per layer);
  // use full() for the one-group layout. Fails with a message naming what is wrong.
  static Expected<KVLayout> grouped(int num_layers, int num_kv_heads, int head_dim, int block_size, int num_pages,
                                    DType dtype,
                                    const std::vector<std::vector<std::vector<int>>>& heads_per_layer_group);
  // The simplest grouping: per layer, heads 0..H_p-1, H_p..2H_p-1, ... (H_p must divide
  // num_kv_heads).
  static std::vector<std::vector<std::vector<int>>> adjacent_heads(int num_layers, int num_kv_heads,
                                                                   int heads_per_group);

  int num_groups() const { return static_cast<int>(groups.size()); }
  // Heads per group (every group has as many).
  int heads_per_group() const { return groups.empty() ? 0 : static_cast<int>(groups[0].kv_heads.size()); }
  // The group holding (layer, head) and the head's slot in it.
  HeadGroupSlot group_of(int layer, int head) const;
  // Bytes of one head vector of K (or V) of one token: head_dim elements, plus its scale if FP8.
  size_t head_vector_bytes() const;
  // Bytes of one page of group g (K and V, all its layers and heads).
  size_t page_bytes(int group) const;
  // Pages of a grouped layout that hold as much as `num_blocks` pages of the full layout
  // (the full page spans every group: its bytes over one group page's).
  int groups_per_full_block() const;
};

}  // namespace origami
