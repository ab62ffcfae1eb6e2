#pragma once
// A request's pages. The cache is organised in head groups: a group is a set of (layer, KV head)
// pairs that share one page table and one length per request. Full KV uses one group holding
// every layer and head (a vLLM block); non-uniform methods use several groups with their own
// tables and lengths. Attention kernels see each table as a CSR row (indptr/indices/last_len).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/table_summary.h"

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

// 32 bytes, two to a cache line: the engine walks every table of every running request several
// times a step (73,728 tables at 256 requests with per-head pages), and each walk's cost is the
// cache lines it reads. What only the prefix cache reads lives beside the tables (RequestKV).
struct BlockTable {
  std::vector<BlockId> blocks;
  // KV entries stored (== logical tokens unless compressed) when the request's tables last changed
  // (RequestKV::tables_changed). The table holds these plus what steps appended to every table
  // since: read and set its count through RequestKV::num_entries / set_num_entries.
  int base_entries = 0;
};

struct RequestKV {
  std::vector<BlockTable> groups;  // indexed by head group
  // Per group: keys of the leading full blocks already looked up or registered in the prefix
  // cache (sized on first use; a group past the end has none).
  std::vector<std::vector<BlockKey>> block_keys;
  // KVCacheManager::cache_full_blocks' last walk over the tables, kept so that a step can skip the
  // next one (288 tables a request with per-head pages) when it would register nothing: the
  // pages_version it walked under, the computed tokens' full blocks, and the tables' appended
  // entries less the computed tokens (with the version standing, each table's count less the
  // computed tokens, which decides whether the table is registered, is then as it was).
  uint64_t keys_walk_version = 0;
  int keys_walk_full_blocks = 0;
  int keys_walk_lag = 0;
  // Entries were evicted (compressed in place): the blocks hold a selection of entries that no
  // token run hashes to, so they are never registered in the prefix cache again.
  bool compacted = false;
  // Two things derived from the tables, kept so that a step need not walk all of them (288 tables a
  // request with per-head pages). Only a step's tokens added to every table in pages it already
  // has (KVCacheManager::append_slots: append_to_every_table below) leave both standing (it moves
  // the summary itself); whoever changes the tables otherwise (a page added, a compaction, a block
  // eviction, a prefix hit, new or released tables, counts set) calls tables_changed().
  // - summary: the entries over all tables, the longest, the room left in their pages
  //   (kv/table_summary.h); forgotten by tables_changed(), walked for again by the next reader.
  // - pages_version: names the tables' pages, a number never drawn before (process-wide); a
  //   backend that flattens the same request's tables step after step keeps them under it and
  //   re-reads them only when it moved (backend/page_table_inputs.h). 0: never set, tables whose
  //   changes nobody reports (hand-built ones): re-read every step.
  mutable TableSummary summary;
  uint64_t pages_version = 0;
  void tables_changed() {
    static std::atomic<uint64_t> next{0};
    // Whoever changes the tables walks them anyway: the appended entries become each table's base.
    if (appended_to_every_table_ != 0) {
      for (BlockTable& t : groups) t.base_entries += appended_to_every_table_;
      appended_to_every_table_ = 0;
    }
    summary.forget();
    pages_version = next.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  // Group g's entries: its base plus what was appended to every table since the tables last changed.
  int num_entries(std::size_t group) const { return groups[group].base_entries + appended_to_every_table_; }
  // Sets group g's entries (a change of the tables: its caller calls tables_changed()).
  void set_num_entries(std::size_t group, int n) { groups[group].base_entries = n - appended_to_every_table_; }
  // Every table gains `n` entries in pages it already has (KVCacheManager::append_slots, which
  // moves the summary too): one number, where writing each table's count would touch 288 tables a
  // request with per-head pages each decode step, most of them cold since the last step. Neither
  // the pages nor pages_version change.
  void append_to_every_table(int n) { appended_to_every_table_ += n; }
  // Entries appended to every table since they last changed (their counts are base_entries + this).
  int appended_to_every_table() const { return appended_to_every_table_; }
  // The summary with its entry counts known: a walk over the tables only after they changed.
  const TableSummary& entries_summary() const {
    if (!summary.entries_known()) summarize_entries(*this, &summary);
    return summary;
  }

  std::vector<BlockKey>& keys_of(std::size_t group) {
    if (block_keys.size() <= group) block_keys.resize(groups.size() > group ? groups.size() : group + 1);
    return block_keys[group];
  }
  // Keeps at most the first `n` keys of a group (its tables' first n full blocks).
  void trim_keys(std::size_t group, std::size_t n) {
    if (group < block_keys.size() && block_keys[group].size() > n) block_keys[group].resize(n);
  }
  void clear() {
    groups.clear();
    block_keys.clear();
    compacted = false;
    tables_changed();
  }

 private:
  int appended_to_every_table_ = 0;
};

}  // namespace origami
