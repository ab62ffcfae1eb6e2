#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace origami {

KVCacheManager::KVCacheManager(const KVLayout& layout, bool enable_prefix_caching)
    : layout_(layout), enable_prefix_caching_(enable_prefix_caching) {
  ORIGAMI_CHECK(layout_.block_size >= 1);
  ORIGAMI_CHECK(!layout_.groups.empty());
  // A shared pool serves every group (its pages have one size): memory one group does not need is
  // usable by all others, where pools of their own would split the capacity up front.
  const size_t num_pools = layout_.shared_pool ? 1 : layout_.groups.size();
  for (size_t p = 0; p < num_pools; ++p)
    pools_.push_back(std::make_unique<BlockPool>(std::max(layout_.groups[p].num_blocks, 1)));
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
  if (request.kv.groups.empty()) request.kv.groups.resize(layout_.groups.size());
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
  return pools_[pool_index(group)]->allocate(n, out);
}

void KVCacheManager::release_blocks(std::span<const BlockId> blocks, int group) {
  pools_[pool_index(group)]->free(blocks);
}

int KVCacheManager::acquire_cached_prefix(KVSequence& request, int max_cached_tokens) {
  ensure_tables(request);
  for (const BlockTable& t : request.kv.groups) ORIGAMI_CHECK_MSG(t.blocks.empty(), "admitting a request that holds blocks");
  request.num_cached_prefix_tokens = 0;
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
    for (int i = 0; i < num_hit; ++i) {
      const BlockId block = matched[g][static_cast<size_t>(i)];
      pools_[pool_index(g)]->touch(block);
      table.blocks.push_back(block);
      table.block_keys.push_back(keys[g][static_cast<size_t>(i)]);
    }
    table.num_entries = num_hit * b;
  }
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
  int n = 0;
  for (const BlockTable& t : request.kv.groups)
    n += std::max(0, blocks_needed(t.num_entries + num_new_entries) - static_cast<int>(t.blocks.size()));
  return n;
}

int KVCacheManager::num_held_blocks(const KVSequence& request) const {
  int n = 0;
  for (const BlockTable& t : request.kv.groups) n += static_cast<int>(t.blocks.size());
  return n;
}

bool KVCacheManager::grow_tables(KVSequence& request, int num_entries, bool add) {
  auto entries_after = [&](const BlockTable& table) { return add ? table.num_entries + num_entries : num_entries; };
  // Prepare: every group must be able to grow (groups sharing a pool together), or nothing changes.
  // Every running request calls this each step, over all its groups: no allocation here.
  extra_per_pool_.assign(pools_.size(), 0);
  for (size_t g = 0; g < request.kv.groups.size(); ++g) {
    const BlockTable& table = request.kv.groups[g];
    const int after = entries_after(table);
    ORIGAMI_CHECK(after >= table.num_entries);
    const int extra = blocks_needed(after) - static_cast<int>(table.blocks.size());
    extra_per_pool_[static_cast<size_t>(pool_index(static_cast<int>(g)))] += std::max(extra, 0);
  }
  for (size_t p = 0; p < pools_.size(); ++p)
    if (extra_per_pool_[p] > pools_[p]->num_free_blocks()) return false;
  for (size_t g = 0; g < request.kv.groups.size(); ++g) {
    BlockTable& table = request.kv.groups[g];
    const int after = entries_after(table);
    const int extra = blocks_needed(after) - static_cast<int>(table.blocks.size());
    if (extra > 0) ORIGAMI_CHECK(pools_[pool_index(static_cast<int>(g))]->allocate(extra, &table.blocks));
    // The step being planned writes these entries; the backend reads the table as holding them.
    table.num_entries = after;
  }
  return true;
}

void KVCacheManager::cache_full_blocks(KVSequence& request, int num_computed_tokens) {
  // A compressed request's blocks hold a selection of entries that no token run hashes to.
  if (!enable_prefix_caching_ || request.kv.groups.empty() || request.kv.compacted) return;
  const int b = layout_.block_size;
  ORIGAMI_CHECK(num_computed_tokens <= request.num_tokens());
  std::vector<int32_t> scratch;
  for (size_t g = 0; g < request.kv.groups.size(); ++g) {
    BlockPool& pool = *pools_[pool_index(static_cast<int>(g))];
    BlockTable& table = request.kv.groups[g];
    // A block's contents equal its tokens' KV only while the cache holds every entry in order;
    // once entries were evicted (compression) the blocks no longer match any token run.
    if (table.num_entries != num_computed_tokens) continue;
    const int num_full = std::min(num_computed_tokens / b, static_cast<int>(table.blocks.size()));
    for (int i = static_cast<int>(table.block_keys.size()); i < num_full; ++i) {
      const BlockKey parent = i == 0 ? group_root(static_cast<int>(g)) : table.block_keys[static_cast<size_t>(i - 1)];
      const uint64_t hash = block_hash(request, i, parent.hash, &scratch);
      // After a link that could not be registered, nothing later in the chain can be found.
      const uint64_t entry = parent.entry_id == kNoCacheEntry
                                 ? kNoCacheEntry
                                 : pool.cache_block(table.blocks[static_cast<size_t>(i)], hash, parent.entry_id, scratch);
      table.block_keys.push_back({hash, entry});
    }
  }
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
  if (enable_prefix_caching_) {
    stats_.num_queried_tokens -= request.num_tokens();
    stats_.num_hit_tokens -= request.num_cached_prefix_tokens;
  }
  request.num_cached_prefix_tokens = 0;
  free(request);
}

}  // namespace origami
