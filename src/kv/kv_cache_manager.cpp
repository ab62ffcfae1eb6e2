#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace origami {

KVCacheManager::KVCacheManager(const KVLayout& layout, bool enable_prefix_caching)
    : layout_(layout), enable_prefix_caching_(enable_prefix_caching) {
  ORIGAMI_CHECK(layout_.block_size >= 1);
  ORIGAMI_CHECK(!layout_.groups.empty());
  for (const HeadGroup& g : layout_.groups) pools_.push_back(std::make_unique<BlockPool>(std::max(g.num_blocks, 1)));
}

int KVCacheManager::num_free_blocks(int group) const { return pools_[group]->num_free_blocks(); }
int KVCacheManager::num_used_blocks(int group) const { return pools_[group]->num_used_blocks(); }

int KVCacheManager::blocks_needed(int num_entries) const {
  return (num_entries + layout_.block_size - 1) / layout_.block_size;
}

int KVCacheManager::num_usable_blocks() const {
  int n = pools_[0]->num_usable_blocks();
  for (const auto& p : pools_) n = std::min(n, p->num_usable_blocks());
  return n;
}

void KVCacheManager::ensure_tables(KVSequence& request) const {
  if (request.kv.groups.empty()) request.kv.groups.resize(pools_.size());
  ORIGAMI_CHECK(request.kv.groups.size() == pools_.size());
}

uint64_t KVCacheManager::block_hash(const KVSequence& request, int index, uint64_t parent_hash,
                                    std::vector<int32_t>* scratch) const {
  const int b = layout_.block_size;
  scratch->resize(static_cast<size_t>(b));
  for (int i = 0; i < b; ++i) (*scratch)[static_cast<size_t>(i)] = request.token_at(index * b + i);
  return hasher_(parent_hash, *scratch);
}

bool KVCacheManager::allocate_blocks(int n, std::vector<BlockId>* out, int group) {
  return pools_[group]->allocate(n, out);
}

void KVCacheManager::release_blocks(std::span<const BlockId> blocks, int group) { pools_[group]->free(blocks); }

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

  std::vector<uint64_t> hashes;
  std::vector<std::vector<int32_t>> tokens;  // [num_hit_blocks][block_size]
  std::vector<std::vector<BlockId>> matched(pools_.size());
  int num_hit = max_blocks;
  uint64_t parent_hash = kRootBlockHash;
  for (size_t g = 0; g < pools_.size(); ++g) {
    uint64_t parent_entry = 0;
    for (int i = 0; i < num_hit; ++i) {
      if (i == static_cast<int>(hashes.size())) {
        tokens.emplace_back();
        parent_hash = block_hash(request, i, parent_hash, &tokens.back());
        hashes.push_back(parent_hash);
      }
      const BlockId block = pools_[g]->lookup(hashes[static_cast<size_t>(i)], parent_entry, tokens[static_cast<size_t>(i)]);
      if (block == kNullBlock) break;
      matched[g].push_back(block);
      parent_entry = pools_[g]->entry_id(block);
    }
    // Every group must serve the same prefix; later groups only look as far as earlier ones hit.
    num_hit = std::min(num_hit, static_cast<int>(matched[g].size()));
  }

  for (size_t g = 0; g < pools_.size(); ++g) {
    BlockTable& table = request.kv.groups[g];
    for (int i = 0; i < num_hit; ++i) {
      const BlockId block = matched[g][static_cast<size_t>(i)];
      pools_[g]->touch(block);
      table.blocks.push_back(block);
      table.block_keys.push_back({hashes[static_cast<size_t>(i)], pools_[g]->entry_id(block)});
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
  const int need = blocks_needed(num_entries_after);
  // Prepare: every group must be able to grow, or nothing changes.
  for (size_t g = 0; g < pools_.size(); ++g) {
    const BlockTable& table = request.kv.groups[g];
    ORIGAMI_CHECK(num_entries_after >= table.num_entries);
    const int extra = need - static_cast<int>(table.blocks.size());
    if (extra > pools_[g]->num_free_blocks()) return false;
  }
  for (size_t g = 0; g < pools_.size(); ++g) {
    BlockTable& table = request.kv.groups[g];
    const int extra = need - static_cast<int>(table.blocks.size());
    if (extra > 0) ORIGAMI_CHECK(pools_[g]->allocate(extra, &table.blocks));
    // The step being planned writes these entries; the backend reads the table as holding them.
    table.num_entries = num_entries_after;
  }
  return true;
}

void KVCacheManager::cache_full_blocks(KVSequence& request, int num_computed_tokens) {
  // A compressed request's blocks hold a selection of entries that no token run hashes to.
  if (!enable_prefix_caching_ || request.kv.groups.empty() || request.kv.compacted) return;
  const int b = layout_.block_size;
  ORIGAMI_CHECK(num_computed_tokens <= request.num_tokens());
  std::vector<int32_t> scratch;
  for (size_t g = 0; g < pools_.size(); ++g) {
    BlockTable& table = request.kv.groups[g];
    // A block's contents equal its tokens' KV only while the cache holds every entry in order;
    // once entries were evicted (compression) the blocks no longer match any token run.
    if (table.num_entries != num_computed_tokens) continue;
    const int num_full = std::min(num_computed_tokens / b, static_cast<int>(table.blocks.size()));
    for (int i = static_cast<int>(table.block_keys.size()); i < num_full; ++i) {
      const BlockKey parent = i == 0 ? BlockKey{kRootBlockHash, 0} : table.block_keys[static_cast<size_t>(i - 1)];
      const uint64_t hash = block_hash(request, i, parent.hash, &scratch);
      // After a link that could not be registered, nothing later in the chain can be found.
      const uint64_t entry = parent.entry_id == kNoCacheEntry
                                 ? kNoCacheEntry
                                 : pools_[g]->cache_block(table.blocks[static_cast<size_t>(i)], hash, parent.entry_id, scratch);
      table.block_keys.push_back({hash, entry});
    }
  }
}

void KVCacheManager::free(KVSequence& request) {
  for (size_t g = 0; g < request.kv.groups.size(); ++g) pools_[g]->free(request.kv.groups[g].blocks);
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
