#pragma once
// What a step needs to know of a request's page tables taken together: the entries they hold in
// all, the longest one, the pages they hold, and the fewest entries any one can still take in the
// pages it holds.
//
// Why it is kept rather than computed: with per-head pages a request has one table per (layer,
// KV head), 288 for the Qwen3-8B shape, so a step of 256 requests would walk 73,728 tables for
// each of these numbers, and on a busy host each walk costs its cache misses
// (docs/benchmarks.md). Yet between two changes of a request's tables every table gains the same
// tokens each step (KVCacheManager::append_slots), so every number moves by a known amount: the
// sum by tokens x tables, the longest by the tokens (the same table stays the longest), the pages
// not at all, the room down by the tokens. A change of any other kind (a page added, a
// compaction, a block eviction, a prefix hit, new, copied or released tables, counts set) calls
// RequestKV::tables_changed(), which forgets the summary; the next reader walks the tables once.
#include <cstdint>

namespace origami {

struct RequestKV;

struct TableSummary {
  static constexpr int64_t kUnknown = INT64_MIN;
  // Entries over every table, the most one table holds, and the first table holding that many
  // (the lead group, sched/compression_state.h); the last two only with the sum known.
  int64_t entries_sum = kUnknown;
  int max_entries = 0;
  int lead_table = 0;
  // Pages over every table (a page shared by two tables counted in each), walked with the entry
  // counts and known with the sum: what the scheduler's reservations subtract for every running
  // request each step (KVCacheManager::num_held_blocks).
  int64_t pages = 0;
  // The least, over the tables, of (pages held x block size - entries): tokens every table can
  // still take without a new page (negative for a table holding more than its pages, which only
  // hand-built tables do). Known only to the KV manager, which knows the block size (the entry
  // counts above do not depend on it).
  int64_t min_room = kUnknown;

  bool entries_known() const { return entries_sum != kUnknown; }
  bool room_known() const { return min_room != kUnknown; }
  void forget() {
    entries_sum = kUnknown;
    min_room = kUnknown;
  }
  // Each of `num_tables` tables gained `tokens` entries in pages it already had.
  void grow_all(int tokens, int64_t num_tables) {
    if (entries_known()) {
      entries_sum += int64_t{tokens} * num_tables;
      max_entries += tokens;
    }
    if (room_known()) min_room -= tokens;
  }
};

// The entry counts of the request's tables (sum, longest, lead) and their pages, by walking them;
// room stays as it was.
void summarize_entries(const RequestKV& kv, TableSummary* summary);
// Everything, by walking them: pages of `block_size` entries. No tables: room 0.
TableSummary summarize_tables(const RequestKV& kv, int block_size);
// Whether what `kept` knows equals a walk over the request's tables (the unknown parts are not compared).
bool summary_matches(const TableSummary& kept, const RequestKV& kv, int block_size);

}  // namespace origami
