#pragma once
// A request's pages. The cache is organised in head groups: a group is a set of (layer, KV head)
// pairs that share one page table and one length per request. Full KV uses one group holding
// every layer and head (a vLLM block); non-uniform methods use several groups with their own
// tables and lengths. Attention kernels see each table as a CSR row (indptr/indices/last_len).
#include <cstdint>
#include <vector>

namespace origami {

using BlockId = int32_t;
constexpr BlockId kNullBlock = 0;  // block 0 is never handed out; padding rows point at it

struct BlockTable {
  std::vector<BlockId> blocks;
  int num_entries = 0;  // KV entries stored (== logical tokens unless compressed)
};

struct RequestKV {
  std::vector<BlockTable> groups;  // indexed by head group
  void clear() { groups.clear(); }
};

}  // namespace origami
