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

// Identity of a full block's contents in the prefix cache. `hash` chains the block's token ids
// with its predecessor's hash; `entry_id` names the cache entry that holds these contents (never
// reused), so a lookup only follows a chain whose every link is the entry it was computed from.
constexpr uint64_t kNoCacheEntry = ~uint64_t{0};  // contents could not be registered (collision)
struct BlockKey {
  uint64_t hash = 0;
  uint64_t entry_id = kNoCacheEntry;
};

struct BlockTable {
  std::vector<BlockId> blocks;
  int num_entries = 0;  // KV entries stored (== logical tokens unless compressed)
  // Keys of the leading full blocks already looked up or registered in the prefix cache.
  std::vector<BlockKey> block_keys;
};

struct RequestKV {
  std::vector<BlockTable> groups;  // indexed by head group
  // Entries were evicted (compressed in place): the blocks hold a selection of entries that no
  // token run hashes to, so they are never registered in the prefix cache again.
  bool compacted = false;
  void clear() {
    groups.clear();
    compacted = false;
  }
};

}  // namespace origami
