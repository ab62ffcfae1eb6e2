#pragma once
// Retained contexts: the KV of a finished request (compressed or not) kept as a context keyed by
// the whole token history it stands for (prompt + outputs whose KV was computed, not only the
// entries kept), with the policy state a continuation needs. A later request whose tokens begin
// with that history continues from the context's pages and computes only the rest.
//
// A context holds one reference on every page of its tables (BlockPool refcounts): its pages stay
// allocated while it lives, and every request continuing it shares them. Shared pages are never
// written: a continuation takes a copy of a partly filled last page (the engine copies it before
// the step that appends to it), and compaction writes fresh targets for shared pages, as for
// prefix-cache hits. Contexts are released least recently used first, when an allocation would
// otherwise fail (never at a running request's expense) and when they hold more distinct pages
// than their limit. This file is the bookkeeping only; KVCacheManager takes and drops the
// references.
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <vector>

#include "kv/block_table.h"

namespace origami {

// What a compression policy had done to a context's KV, as plain counts (sched/ fills and reads
// them from a request's RequestCompression; kv/ only stores them). `policy_key` names the policy,
// budget and options it was compressed under: a compressed context is continued only under the
// same key (its entries are that policy's selection and its global scores that policy's).
struct RetainedPolicyState {
  std::string policy_key;
  int num_compressions = 0;
  int num_scored_entries = 0;
  bool prefill_checked = false;
  int tail_from = 0;
  int entries_after_compression = 0;
};

struct RetainedContext {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // the history: KV of every token here is in `kv` (or was evicted)
  uint64_t tokens_hash = 0;     // prefix_hash of `tokens`
  RequestKV kv;                 // one table per head group, a reference held on every page
  RetainedPolicyState state;
  uint64_t last_used = 0;       // LRU clock
  int num_pages() const {
    int n = 0;
    for (const BlockTable& t : kv.groups) n += static_cast<int>(t.blocks.size());
    return n;
  }
};

// Counters for metrics (engine, server /metrics).
struct RetainedContextStats {
  int64_t num_retained = 0;      // contexts created
  int64_t num_hits = 0;          // admissions that continued a context
  int64_t num_hit_tokens = 0;    // tokens those admissions did not compute again
  int64_t num_releases = 0;      // contexts released (memory needed, limit, replaced)
  int num_contexts = 0;          // alive now
  int num_pages = 0;             // distinct pages the alive contexts hold
};

// Rolling hash of a token prefix: prefix_hash(t[0..n)) extends prefix_hash(t[0..n-1)) by t[n-1],
// so one pass over a request's tokens gives the hash of every prefix (lookup compares a context's
// hash with the request's prefix of its length, then the tokens themselves).
constexpr uint64_t kEmptyPrefixHash = 0xcbf29ce484222325ull;
inline uint64_t extend_prefix_hash(uint64_t h, int32_t token) {
  h ^= static_cast<uint64_t>(static_cast<uint32_t>(token)) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h * 0x100000001b3ull;
}
uint64_t prefix_hash(std::span<const int32_t> tokens);

// The contexts, most recently used last, and how many contexts reference each page.
class RetainedContexts {
 public:
  // `num_pool_pages`: pages of each pool (the distinct-page counts are per pool).
  explicit RetainedContexts(std::vector<int> num_pool_pages);

  std::list<RetainedContext>& contexts() { return contexts_; }
  const std::list<RetainedContext>& contexts() const { return contexts_; }
  // Records the context's pages (pool of each table given by `pool_of_group`): distinct counts.
  void count_pages(const RetainedContext& context, std::span<const int> pool_of_group, int delta);
  // Marks a context used now (moves it to the back: released last).
  void touch(std::list<RetainedContext>::iterator it);
  // Contexts holding page `page` of pool `pool`.
  int page_refs(int pool, BlockId page) const { return refs_[static_cast<size_t>(pool)][static_cast<size_t>(page)]; }
  uint64_t next_id() { return next_id_++; }
  uint64_t tick() { return ++clock_; }
  RetainedContextStats& stats() { return stats_; }
  const RetainedContextStats& stats() const { return stats_; }

 private:
  std::list<RetainedContext> contexts_;
  std::vector<std::vector<int>> refs_;  // [pool][page]: contexts holding it
  uint64_t next_id_ = 1;
  uint64_t clock_ = 0;
  RetainedContextStats stats_;
};

}  // namespace origami
