#include "kv/kv_cache_manager.h"

#include <algorithm>
#include <unordered_set>

#include "core/check.h"

namespace origami {

namespace {

// Prefix-cache keys the request holds over all its tables (a check of cache_full_blocks' skip).
size_t total_keys(const RequestKV& kv) {
  size_t n = 0;
  for (const std::vector<BlockKey>& keys : kv.block_keys) n += keys.size();
  return n;
}

}  // namespace

KVCacheManager::KVCacheManager(const KVLayout& layout, bool enable_prefix_caching)
    : layout_(layout), enable_prefix_caching_(enable_prefix_caching) {
  ORIGAMI_CHECK(layout_.block_size >= 1);
  ORIGAMI_CHECK(!layout_.groups.empty());
  // A shared pool serves every group (its pages have one size): memory one group does not need is
  // usable by all others, where pools of their own would split the capacity up front.
  const size_t num_pools = layout_.shared_pool ? 1 : layout_.groups.size();
  for (size_t p = 0; p < num_pools; ++p)
    pools_.push_back(std::make_unique<BlockPool>(std::max(layout_.groups[p].num_blocks, 1)));
  for (int g = 0; g < num_groups(); ++g) pool_of_group_.push_back(pool_index(g));
}

int KVCacheManager::num_free_blocks(int group) const { return pools_[pool_index(group)]->num_free_blocks(); }
int KVCacheManager::num_used_blocks(int group) const { return pools_[pool_index(group)]->num_used_blocks(); }

int KVCacheManager::total_used_blocks() const {
  int n = 0;
  for (const auto& p : pools_) n += p->num_used_blocks();
  return n;
}

BlockKey KVCacheManager::group_root(int group) {
  if (group == 0) return {kRootBlockHash, 0};
  // Entry ids count up from 1, so ids counted down from kNoCacheEntry never name a real entry:
  // even under a hash collision a lookup cannot follow another group's chain.
  return {kRootBlockHash ^ (0xbf58476d1ce4e5b9ull * static_cast<uint64_t>(group)),
          kNoCacheEntry - 1 - static_cast<uint64_t>(group)};
}

int KVCacheManager::blocks_needed(int num_entries) const {
  return (num_entries + layout_.block_size - 1) / layout_.block_size;
}

int KVCacheManager::num_usable_blocks() const {
  if (layout_.shared_pool) return pools_[0]->num_usable_blocks() / num_groups();
  int n = pools_[0]->num_usable_blocks();
  for (const auto& p : pools_) n = std::min(n, p->num_usable_blocks());
  return n;
}

void KVCacheManager::ensure_tables(KVSequence& request) const {
  if (request.kv.groups.empty()) {
    request.kv.groups.resize(layout_.groups.size());
    request.kv.tables_changed();
  }
  ORIGAMI_CHECK(request.kv.groups.size() == layout_.groups.size());
}

uint64_t KVCacheManager::block_hash(const KVSequence& request, int index, uint64_t parent_hash,
                                    std::vector<int32_t>* scratch) const {
  const int b = layout_.block_size;
  scratch->resize(static_cast<size_t>(b));
  for (int i = 0; i < b; ++i) (*scratch)[static_cast<size_t>(i)] = request.token_at(index * b + i);
  return hasher_(parent_hash, *scratch);
}

bool KVCacheManager::allocate_blocks(int n, std::vector<BlockId>* out, int group) {
  reclaim_retained(n, pool_index(group));
  return pools_[pool_index(group)]->allocate(n, out);
}

void KVCacheManager::release_blocks(std::span<const BlockId> blocks, int group) {
  pools_[pool_index(group)]->free(blocks);
}

int KVCacheManager::acquire_cached_prefix(KVSequence& request, int max_cached_tokens) {
  ensure_tables(request);
  for (const BlockTable& t : request.kv.groups) ORIGAMI_CHECK_MSG(t.blocks.empty(), "admitting a request that holds blocks");
  request.num_cached_prefix_tokens = 0;
  request.num_retained_tokens = 0;
  if (!enable_prefix_caching_) return 0;

  const int b = layout_.block_size;
  const int num_tokens = request.num_tokens();
  // Full blocks only, and never the whole sequence: the last token must be computed so that
  // its logits exist (a prompt of exactly k blocks hits at most k - 1 of them).
  const int max_blocks = std::min(std::max(num_tokens - 1, 0), std::max(max_cached_tokens, 0)) / b;

  const int num_groups = this->num_groups();
  std::vector<std::vector<BlockKey>> keys(static_cast<size_t>(num_groups));
  std::vector<std::vector<int32_t>> tokens;  // [num_hit_blocks][block_size], shared by the groups
  std::vector<std::vector<BlockId>> matched(static_cast<size_t>(num_groups));
  int num_hit = max_blocks;
  for (int g = 0; g < num_groups; ++g) {
    BlockPool& pool = *pools_[pool_index(g)];
    BlockKey parent = group_root(g);
    for (int i = 0; i < num_hit; ++i) {
      if (i == static_cast<int>(tokens.size())) {
        tokens.emplace_back();
        (void)block_hash(request, i, 0, &tokens.back());  // fills the block's token ids
      }
      const std::vector<int32_t>& ids = tokens[static_cast<size_t>(i)];
      const uint64_t hash = hasher_(parent.hash, ids);
      const BlockId block = pool.lookup(hash, parent.entry_id, ids);
      if (block == kNullBlock) break;
      matched[g].push_back(block);
      parent = {hash, pool.entry_id(block)};
      keys[g].push_back(parent);
    }
    // Every group must serve the same prefix; later groups only look as far as earlier ones hit.
    num_hit = std::min(num_hit, static_cast<int>(matched[g].size()));
  }

  for (int g = 0; g < num_groups; ++g) {
    BlockTable& table = request.kv.groups[static_cast<size_t>(g)];
    std::vector<BlockKey>& table_keys = request.kv.keys_of(static_cast<size_t>(g));
    for (int i = 0; i < num_hit; ++i) {
      const BlockId block = matched[g][static_cast<size_t>(i)];
      pools_[pool_index(g)]->touch(block);
      table.blocks.push_back(block);
      table_keys.push_back(keys[g][static_cast<size_t>(i)]);
    }
    request.kv.set_num_entries(static_cast<size_t>(g), num_hit * b);
  }
  request.kv.tables_changed();
  const int num_cached = num_hit * b;
  stats_.num_queried_tokens += num_tokens;
  stats_.num_hit_tokens += num_cached;
  request.num_cached_prefix_tokens = num_cached;
  return num_cached;
}

bool KVCacheManager::allocate_slots(KVSequence& request, int num_entries_after) {
  ensure_tables(request);
  return grow_tables(request, num_entries_after, /*add=*/false);
}

bool KVCacheManager::append_slots(KVSequence& request, int num_new_entries) {
  ensure_tables(request);
  return grow_tables(request, num_new_entries, /*add=*/true);
}

int KVCacheManager::blocks_to_append(const KVSequence& request, int num_new_entries) const {
  if (request.kv.groups.empty()) return blocks_needed(num_new_entries) * num_groups();
  const TableSummary& summary = request.kv.summary;
  if (summary.room_known() && summary.min_room >= num_new_entries) return 0;
  int n = 0;
  for (size_t g = 0; g < request.kv.groups.size(); ++g)
    n += std::max(0, blocks_needed(request.kv.num_entries(g) + num_new_entries) -
                         static_cast<int>(request.kv.groups[g].blocks.size()));
  return n;
}

int KVCacheManager::num_held_blocks(const KVSequence& request) const {
  if (verify_summaries_)
    ORIGAMI_CHECK_MSG(summary_matches(request.kv.summary, request.kv, layout_.block_size),
                      "a request's table summary differs from a walk over its tables");
  // Kept in the summary: the scheduler asks for every running request each step (288 tables a
  // request with per-head pages); a walk only after the tables changed.
  return static_cast<int>(request.kv.entries_summary().pages);
}

bool KVCacheManager::grow_tables(KVSequence& request, int num_entries, bool add) {
  RequestKV& kv = request.kv;
  const int b = layout_.block_size;
  if (verify_summaries_)
    ORIGAMI_CHECK_MSG(summary_matches(kv.summary, kv, b),
                      "a request's table summary differs from a walk over its tables (a change that did not call tables_changed(), or the summary moved wrongly)");
  // A decode step: every running request appends one entry to each of its groups (288 tables per
  // request for the Qwen3-8B shape with per-head pages), and most steps no table needs a page.
  // The summary says so without looking at the tables (walked once after they changed), and the
  // counts move as one number for all of them (RequestKV::append_to_every_table): no table is
  // touched.
  if (add) {
    ORIGAMI_CHECK(num_entries >= 0);
    if (!kv.summary.room_known()) kv.summary = summarize_tables(kv, b);
    if (kv.summary.min_room >= num_entries) {
      kv.append_to_every_table(num_entries);
      kv.summary.grow_all(num_entries, static_cast<int64_t>(kv.groups.size()));
      return true;
    }
  }
  auto entries_after = [&](size_t g) { return add ? kv.num_entries(g) + num_entries : num_entries; };
  // Prepare: every group must be able to grow (groups sharing a pool together), or nothing changes.
  // Every running request calls this each step, over all its groups: no allocation here.
  extra_per_pool_.assign(pools_.size(), 0);
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    const BlockTable& table = kv.groups[g];
    const int after = entries_after(g);
    ORIGAMI_CHECK(after >= kv.num_entries(g));
    const int extra = blocks_needed(after) - static_cast<int>(table.blocks.size());
    extra_per_pool_[static_cast<size_t>(pool_index(static_cast<int>(g)))] += std::max(extra, 0);
  }
  for (size_t p = 0; p < pools_.size(); ++p)
    if (extra_per_pool_[p] > pools_[p]->num_free_blocks() && !reclaim_retained(extra_per_pool_[p], static_cast<int>(p)))
      return false;
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    BlockTable& table = kv.groups[g];
    const int after = entries_after(g);
    const int extra = blocks_needed(after) - static_cast<int>(table.blocks.size());
    if (extra > 0) ORIGAMI_CHECK(pools_[pool_index(static_cast<int>(g))]->allocate(extra, &table.blocks));
    // The step being planned writes these entries; the backend reads the table as holding them.
    kv.set_num_entries(g, after);
  }
  // Pages were added, or the counts set: the tables' flattened copies are out of date, and the
  // summary is taken again while the tables are still in cache.
  kv.tables_changed();
  kv.summary = summarize_tables(kv, b);
  return true;
}

void KVCacheManager::cache_full_blocks(KVSequence& request, int num_computed_tokens) {
  // A compressed request's blocks hold a selection of entries that no token run hashes to.
  if (!enable_prefix_caching_ || request.kv.groups.empty() || request.kv.compacted) return;
  const int b = layout_.block_size;
  ORIGAMI_CHECK(num_computed_tokens <= request.num_tokens());
  RequestKV& kv = request.kv;
  // Every step calls this for every running request, and most steps fill no block: the walk over
  // the tables (288 a request with per-head pages) is skipped when it would find what the last
  // one found. With the version standing, each table holds its base plus the appended entries and
  // its pages are the same, so a table is registered (count == computed tokens) as it was, up to
  // the same full blocks (min(tokens / b, pages)), and its keys already reach them.
  const int full_blocks = num_computed_tokens / b;
  const int lag = kv.appended_to_every_table() - num_computed_tokens;
  const bool walked = kv.pages_version != 0 && kv.keys_walk_version == kv.pages_version &&
                      kv.keys_walk_full_blocks == full_blocks && kv.keys_walk_lag == lag;
  if (walked && !verify_summaries_) return;
  const size_t keys_before = verify_summaries_ ? total_keys(kv) : 0;
  std::vector<int32_t> scratch;
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    BlockPool& pool = *pools_[pool_index(static_cast<int>(g))];
    BlockTable& table = kv.groups[g];
    // A block's contents equal its tokens' KV only while the cache holds every entry in order;
    // once entries were evicted (compression) the blocks no longer match any token run.
    if (kv.num_entries(g) != num_computed_tokens) continue;
    const int num_full = std::min(num_computed_tokens / b, static_cast<int>(table.blocks.size()));
    std::vector<BlockKey>& keys = request.kv.keys_of(g);
    for (int i = static_cast<int>(keys.size()); i < num_full; ++i) {
      const BlockKey parent = i == 0 ? group_root(static_cast<int>(g)) : keys[static_cast<size_t>(i - 1)];
      const uint64_t hash = block_hash(request, i, parent.hash, &scratch);
      // After a link that could not be registered, nothing later in the chain can be found.
      const uint64_t entry = parent.entry_id == kNoCacheEntry
                                 ? kNoCacheEntry
                                 : pool.cache_block(table.blocks[static_cast<size_t>(i)], hash, parent.entry_id, scratch);
      keys.push_back({hash, entry});
    }
  }
  if (walked)
    ORIGAMI_CHECK_MSG(total_keys(kv) == keys_before,
                      "a walk over a request's tables registered blocks that the last walk's record said were registered");
  kv.keys_walk_version = kv.pages_version;
  kv.keys_walk_full_blocks = full_blocks;
  kv.keys_walk_lag = lag;
}

void KVCacheManager::free(KVSequence& request) {
  if (!layout_.shared_pool) {
    for (size_t g = 0; g < request.kv.groups.size(); ++g)
      pools_[pool_index(static_cast<int>(g))]->free(request.kv.groups[g].blocks);
  } else {
    // One pool: free block i of every group together, back to front, so that the eviction order
    // of cached contents follows token order across groups as it does for one table (a prefix is
    // then evicted tail first in every group at once, and stays findable in all or none).
    size_t longest = 0;
    for (const BlockTable& t : request.kv.groups) longest = std::max(longest, t.blocks.size());
    for (size_t i = longest; i-- > 0;)
      for (const BlockTable& t : request.kv.groups)
        if (i < t.blocks.size()) pools_[0]->free(std::span<const BlockId>(&t.blocks[i], 1));
  }
  request.kv.clear();
}

void KVCacheManager::abandon_admission(KVSequence& request) {
  if (request.num_retained_tokens > 0) {
    RetainedContextStats& st = retained_->stats();
    --st.num_hits;
    st.num_hit_tokens -= request.num_retained_tokens;
    request.num_retained_tokens = 0;
  } else if (enable_prefix_caching_) {
    stats_.num_queried_tokens -= request.num_tokens();
    stats_.num_hit_tokens -= request.num_cached_prefix_tokens;
  }
  request.num_cached_prefix_tokens = 0;
  free(request);
}

void KVCacheManager::enable_retained_contexts(int max_pages) {
  release_all_retained();
  max_retained_pages_ = std::max(max_pages, 0);
  if (max_retained_pages_ > 0 && retained_ == nullptr) {
    std::vector<int> pages;
    for (const auto& p : pools_) pages.push_back(p->num_blocks());
    retained_ = std::make_unique<RetainedContexts>(std::move(pages));
  }
}

const RetainedContextStats& KVCacheManager::retained_stats() const {
  return retained_ != nullptr ? retained_->stats() : no_retained_stats_;
}

int KVCacheManager::retained_only_pages() const {
  if (retained_ == nullptr) return 0;
  int n = 0;
  std::unordered_set<uint64_t> seen;
  for (const RetainedContext& c : retained_->contexts())
    for (size_t g = 0; g < c.kv.groups.size(); ++g) {
      const int pool = pool_of_group_[g];
      for (BlockId b : c.kv.groups[g].blocks) {
        const int refs = retained_->page_refs(pool, b);
        if (pools_[static_cast<size_t>(pool)]->ref_count(b) != refs) continue;  // a request holds it too
        if (refs > 1) {  // several contexts hold it: count it once
          if (!seen.insert((static_cast<uint64_t>(pool) << 32) | static_cast<uint32_t>(b)).second) continue;
        }
        ++n;
      }
    }
  return n;
}

void KVCacheManager::release_context(std::list<RetainedContext>::iterator it) {
  retained_->count_pages(*it, pool_of_group_, -1);
  KVSequence holder;
  holder.kv = std::move(it->kv);
  free(holder);
  RetainedContextStats& st = retained_->stats();
  ++st.num_releases;
  --st.num_contexts;
  retained_->contexts().erase(it);
}

void KVCacheManager::release_all_retained() {
  if (retained_ == nullptr) return;
  while (!retained_->contexts().empty()) release_context(retained_->contexts().begin());
}

bool KVCacheManager::reclaim_retained(int n, int pool) {
  BlockPool& p = *pools_[static_cast<size_t>(pool)];
  if (retained_ == nullptr) return p.num_free_blocks() >= n;
  auto& contexts = retained_->contexts();
  while (p.num_free_blocks() < n && !contexts.empty()) release_context(contexts.begin());
  return p.num_free_blocks() >= n;
}

void KVCacheManager::enforce_retained_limit(const RetainedContext* keep) {
  auto& contexts = retained_->contexts();
  for (auto it = contexts.begin(); retained_->stats().num_pages > max_retained_pages_ && it != contexts.end();) {
    auto next = std::next(it);
    if (&*it != keep) release_context(it);
    it = next;
  }
}

bool KVCacheManager::retain(const KVSequence& request, int num_tokens, const RetainedPolicyState& state) {
  if (!retained_contexts_enabled() || request.kv.groups.empty() || num_tokens < 1) return false;
  ORIGAMI_CHECK(num_tokens <= request.num_tokens());
  RetainedContext context;
  context.tokens.reserve(static_cast<size_t>(num_tokens));
  for (int i = 0; i < num_tokens; ++i) context.tokens.push_back(request.token_at(i));
  context.tokens_hash = prefix_hash(context.tokens);
  context.kv = request.kv;
  context.kv.tables_changed();  // trimmed below; a copy is another set of tables
  // Pages beyond the entries (a cache-full request's spare page for its next tokens) hold nothing
  // of the history; a continuation appending into a shared one would write it.
  for (size_t g = 0; g < context.kv.groups.size(); ++g) {
    BlockTable& t = context.kv.groups[g];
    const size_t used = static_cast<size_t>(blocks_needed(context.kv.num_entries(g)));
    ORIGAMI_CHECK(used <= t.blocks.size());
    t.blocks.resize(used);
    context.kv.trim_keys(g, used);
  }
  context.state = state;
  if (context.num_pages() > max_retained_pages_) return false;
  auto& contexts = retained_->contexts();
  // The same history under the same policy: the newer context replaces the older one.
  for (auto it = contexts.begin(); it != contexts.end(); ++it) {
    if (it->tokens_hash == context.tokens_hash && it->tokens == context.tokens && it->state.policy_key == state.policy_key) {
      release_context(it);
      break;
    }
  }
  for (size_t g = 0; g < context.kv.groups.size(); ++g)
    for (BlockId b : context.kv.groups[g].blocks) pools_[static_cast<size_t>(pool_of_group_[g])]->touch(b);
  context.id = retained_->next_id();
  contexts.push_back(std::move(context));
  auto it = std::prev(contexts.end());
  retained_->touch(it);
  retained_->count_pages(*it, pool_of_group_, +1);
  ++retained_->stats().num_retained;
  ++retained_->stats().num_contexts;
  enforce_retained_limit(&*it);
  return true;
}

const RetainedContext* KVCacheManager::find_retained(const KVSequence& request, int max_tokens,
                                                     const std::string& policy_key) {
  if (!retained_contexts_enabled() || retained_->contexts().empty()) return nullptr;
  const int n = std::min(max_tokens, request.num_tokens() - 1);  // the last token is computed
  if (n < 1) return nullptr;
  std::vector<uint64_t> hashes(static_cast<size_t>(n) + 1);
  hashes[0] = kEmptyPrefixHash;
  for (int i = 0; i < n; ++i) hashes[static_cast<size_t>(i) + 1] = extend_prefix_hash(hashes[static_cast<size_t>(i)], request.token_at(i));
  const RetainedContext* best = nullptr;
  for (const RetainedContext& c : retained_->contexts()) {
    const int len = static_cast<int>(c.tokens.size());
    if (len > n || (best != nullptr && len <= static_cast<int>(best->tokens.size()))) continue;
    if (hashes[static_cast<size_t>(len)] != c.tokens_hash) continue;
    const bool compressed = c.kv.compacted || c.state.num_compressions > 0;
    if (compressed && c.state.policy_key != policy_key) continue;
    bool equal = true;
    for (int i = 0; i < len && equal; ++i) equal = request.token_at(i) == c.tokens[static_cast<size_t>(i)];
    if (equal) best = &c;
  }
  return best;
}

int KVCacheManager::continue_retained(KVSequence& request, const RetainedContext& context, std::vector<BlockCopy>* copies) {
  ensure_tables(request);
  for (const BlockTable& t : request.kv.groups) ORIGAMI_CHECK_MSG(t.blocks.empty(), "admitting a request that holds blocks");
  ORIGAMI_CHECK(context.kv.groups.size() == request.kv.groups.size());
  const int b = layout_.block_size;
  // Fresh pages for the partly filled last pages, taken first: an allocation may release
  // contexts, this one included (its pages stay while this request's references are taken).
  std::vector<int> partial_per_pool(pools_.size(), 0);
  for (size_t g = 0; g < context.kv.groups.size(); ++g)
    if (context.kv.num_entries(g) % b != 0) ++partial_per_pool[static_cast<size_t>(pool_of_group_[g])];
  RequestKV kv = context.kv;
  const int num_tokens = static_cast<int>(context.tokens.size());
  const uint64_t id = context.id;
  for (size_t g = 0; g < kv.groups.size(); ++g)
    for (BlockId block : kv.groups[g].blocks) pools_[static_cast<size_t>(pool_of_group_[g])]->touch(block);
  std::vector<std::vector<BlockId>> fresh(pools_.size());
  for (size_t p = 0; p < pools_.size(); ++p) {
    if (partial_per_pool[p] == 0) continue;
    reclaim_retained(partial_per_pool[p], static_cast<int>(p));
    if (!pools_[p]->allocate(partial_per_pool[p], &fresh[p])) {
      for (size_t q = 0; q < pools_.size(); ++q) pools_[q]->free(fresh[q]);
      KVSequence undo;
      undo.kv = std::move(kv);
      free(undo);
      return 0;
    }
  }
  std::vector<size_t> next(pools_.size(), 0);
  for (size_t g = 0; g < kv.groups.size(); ++g) {
    BlockTable& t = kv.groups[g];
    if (kv.num_entries(g) % b == 0) continue;
    const size_t p = static_cast<size_t>(pool_of_group_[g]);
    const BlockId dst = fresh[p][next[p]++];
    copies->push_back({static_cast<int>(g), t.blocks.back(), dst});
    pools_[p]->free(std::span<const BlockId>(&t.blocks.back(), 1));
    t.blocks.back() = dst;
    // Only full pages carry prefix-cache keys; the copy is the request's own.
    kv.trim_keys(g, t.blocks.size() - 1);
  }
  request.kv = std::move(kv);
  request.kv.tables_changed();  // the context's tables, with fresh last pages
  // Used now: released last.
  auto& contexts = retained_->contexts();
  for (auto it = contexts.begin(); it != contexts.end(); ++it)
    if (it->id == id) {
      retained_->touch(it);
      break;
    }
  RetainedContextStats& st = retained_->stats();
  ++st.num_hits;
  st.num_hit_tokens += num_tokens;
  request.num_retained_tokens = num_tokens;
  request.num_cached_prefix_tokens = num_tokens;
  return num_tokens;
}

}  // namespace origami
