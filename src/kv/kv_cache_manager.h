#pragma once
// Owns the block pools of every head group and the requests' page tables. All changes follow
// "prepare, then apply": a call that cannot be satisfied returns false and changes nothing.
// A grouped layout (KVLayout::shared_pool) has one pool for all groups: a request holds one
// table per group, every table's pages come from that pool, and an allocation succeeds only if
// the pages of every group fit. Groups may hold different numbers of entries (non-uniform
// budgets); a step adds the same tokens to every group (append_slots).
#include <cstdint>
#include <limits>
#include <span>
#include <memory>
#include <vector>

#include "kv/block_hash.h"
#include "kv/block_pool.h"
#include "kv/kv_sequence.h"
#include "kv/kv_layout.h"
#include "kv/retained_contexts.h"

namespace origami {


// Prefix-cache effectiveness, in tokens, over admissions (a retried admission counts once).
struct PrefixCacheStats {
  int64_t num_queried_tokens = 0;
  int64_t num_hit_tokens = 0;
  double hit_rate() const {
    return num_queried_tokens > 0 ? static_cast<double>(num_hit_tokens) / static_cast<double>(num_queried_tokens) : 0.0;
  }
};

// A page to copy before the step that appends to it (a continuation's partly filled last page,
// shared with its retained context: Backend::copy_block).
struct BlockCopy {
  int group = 0;
  BlockId src = kNullBlock;
  BlockId dst = kNullBlock;
};

class KVCacheManager {
 public:
  KVCacheManager(const KVLayout& layout, bool enable_prefix_caching);

  // On admission: looks up the longest run of the request's full prompt blocks already cached
  // (chained hashes), takes references to them and returns the number of tokens they hold. At
  // least one prompt token is always left to compute, so the last prompt logits exist, and no
  // more than `max_cached_tokens` are served (tokens whose queries a compression needs must be
  // computed, not served from the cache).
  int acquire_cached_prefix(KVSequence& request, int max_cached_tokens = std::numeric_limits<int>::max());
  // Ensures every table of the request can hold `num_entries_after` entries (and records that it
  // holds them); all-or-nothing across groups.
  bool allocate_slots(KVSequence& request, int num_entries_after);
  // Every group of the request grows by `num_new_entries` (a step's tokens); all-or-nothing.
  bool append_slots(KVSequence& request, int num_new_entries);
  // Blocks append_slots(request, num_new_entries) would take, over all groups.
  int blocks_to_append(const KVSequence& request, int num_new_entries) const;
  // Blocks the request holds, over all groups.
  int num_held_blocks(const KVSequence& request) const;
  // After a step: registers the request's newly completed full blocks in the prefix cache. O(1)
  // when its tables did not change and no block filled since its last call (RequestKV::keys_walk_*).
  void cache_full_blocks(KVSequence& request, int num_computed_tokens);
  // Drops the request's references (cached blocks stay reusable until evicted, LRU).
  void free(KVSequence& request);
  // Undoes an admission that acquire_cached_prefix (or continue_retained) began but allocate_slots
  // could not finish: frees like free() and takes the lookup back out of the statistics.
  void abandon_admission(KVSequence& request);

  // --- Retained contexts (kv/retained_contexts.h) ---
  // Enables them, holding at most `max_pages` distinct pages over all pools (0: disabled).
  void enable_retained_contexts(int max_pages);
  bool retained_contexts_enabled() const { return max_retained_pages_ > 0; }
  // Keeps the request's tables as a context standing for its first `num_tokens` tokens (their KV
  // is what the tables hold). Replaces a context of the same history and policy key. False (and
  // nothing kept) when disabled, or when the context alone is over the limit.
  bool retain(const KVSequence& request, int num_tokens, const RetainedPolicyState& state);
  // The longest context whose history is a proper prefix of the request's first `max_tokens`
  // tokens (at least one token is left to compute) and which may be continued under `policy_key`
  // (an uncompressed context under any policy). nullptr: none.
  const RetainedContext* find_retained(const KVSequence& request, int max_tokens, const std::string& policy_key);
  // On admission, instead of acquire_cached_prefix: the request (holding no pages) takes a
  // reference on every page of the context and its tables; a partly filled last page is replaced
  // by a fresh copy (added to `copies`; the caller copies it before the step). Returns the tokens
  // served, or 0 (nothing changed) if the copies cannot be allocated.
  int continue_retained(KVSequence& request, const RetainedContext& context, std::vector<BlockCopy>* copies);
  // Releases contexts, least recently used first, until `pool` has `n` free pages or none is left
  // (pages other holders share free nothing). Whether `n` are free.
  bool reclaim_retained(int n, int pool = 0);
  // Releases every context.
  void release_all_retained();
  const RetainedContextStats& retained_stats() const;
  // Pages no request holds, only retained contexts (given back whenever a request needs them):
  // total_used_blocks() less these is what requests hold.
  int retained_only_pages() const;

  // Blocks outside any request's table (compression targets): all-or-nothing; released with
  // release_blocks() or by becoming part of a table that free() drops.
  bool allocate_blocks(int n, std::vector<BlockId>* out, int group = 0);
  void release_blocks(std::span<const BlockId> blocks, int group = 0);
  int ref_count(BlockId block, int group = 0) const { return pools_[pool_index(group)]->ref_count(block); }
  // Whether a held block is in another table too (ref_count > 1). Without prefix caching or
  // retained contexts none is, and the pool is not read: a compaction asks this of every page of
  // every head group (288 tables a request with per-head pages), each a likely cache miss.
  bool block_shared(BlockId block, int group = 0) const { return blocks_may_be_shared() && ref_count(block, group) > 1; }
  // See BlockPool::forget_contents. Without prefix caching no block has contents to forget, and
  // the pool is not read (as block_shared).
  void forget_contents(BlockId block, int group = 0) {
    if (enable_prefix_caching_) pools_[pool_index(group)]->forget_contents(block);
  }

  // Of group g's pool (the shared pool of a grouped layout: every group's pages together).
  int num_free_blocks(int group = 0) const;
  int num_used_blocks(int group = 0) const;
  // Pages held over every pool.
  int total_used_blocks() const;
  const KVLayout& layout() const { return layout_; }
  BlockPool& pool(int group = 0) { return *pools_[pool_index(group)]; }
  bool prefix_caching_enabled() const { return enable_prefix_caching_; }
  // Whether a block can be in more than one table (ref_count > 1): only a prefix-cache hit (or a
  // retained context) takes a second reference (BlockPool::touch), so without prefix caching every block has one holder and
  // counts of shared blocks are 0 without looking at any table.
  // Retained contexts share their pages with the requests continuing them the same way.
  bool blocks_may_be_shared() const { return enable_prefix_caching_ || retained_contexts_enabled(); }
  // Blocks one group's table needs to hold `num_entries` entries.
  int blocks_needed(int num_entries) const;
  // Blocks that can be handed out at most to one group of a request (the pool minus the null
  // block; a shared pool's pages split evenly over the groups, as uniform budgets take them).
  int num_usable_blocks() const;
  int num_groups() const { return static_cast<int>(layout_.groups.size()); }
  const PrefixCacheStats& prefix_cache_stats() const { return stats_; }
  // Tests: every append and allocation first checks the request's table summary
  // (RequestKV::summary) against a walk over its tables, failing an internal check on a
  // difference (a change that did not call tables_changed(), or a summary moved wrongly); and
  // cache_full_blocks walks the tables even where its record says the walk would register
  // nothing, failing an internal check if it does.
  void set_verify_table_summaries(bool verify) { verify_summaries_ = verify; }
  // Tests force hash collisions with a degenerate hasher; lookups must stay correct.
  void set_block_hasher_for_testing(BlockHasher hasher) { hasher_ = hasher; }

 private:
  KVLayout layout_;
  bool enable_prefix_caching_;
  std::vector<std::unique_ptr<BlockPool>> pools_;
  BlockHasher hasher_ = &hash_block_tokens;
  PrefixCacheStats stats_;
  bool verify_summaries_ = false;

  std::unique_ptr<RetainedContexts> retained_;
  int max_retained_pages_ = 0;
  std::vector<int> pool_of_group_;
  RetainedContextStats no_retained_stats_;
  void release_context(std::list<RetainedContext>::iterator it);
  // Releases LRU contexts (never `keep`) while the contexts hold more than the limit.
  void enforce_retained_limit(const RetainedContext* keep);

  int pool_index(int group) const { return layout_.shared_pool ? 0 : group; }
  void ensure_tables(KVSequence& request) const;
  // Grows every group's table to `num_entries` entries, or with `add` by `num_entries` from its own
  // count; all-or-nothing. Keeps the request's table summary.
  bool grow_tables(KVSequence& request, int num_entries, bool add);
  // grow_tables' blocks per pool, kept to spare an allocation per request and step.
  std::vector<int> extra_per_pool_;
  // The hash chain of group g starts from its own root, so each group's blocks are keyed apart
  // in a shared pool (group 0's root is the usual kRootBlockHash / entry 0).
  static BlockKey group_root(int group);
  // Key of block `index` of the request's tokens, chained on `parent_hash`.
  uint64_t block_hash(const KVSequence& request, int index, uint64_t parent_hash, std::vector<int32_t>* scratch) const;
};

}  // namespace origami
