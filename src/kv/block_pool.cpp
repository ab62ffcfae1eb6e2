#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace origami {

BlockPool::BlockPool(int num_blocks) : num_blocks_(num_blocks), sentinel_(num_blocks) {
  ORIGAMI_CHECK(num_blocks >= 1);
  blocks_.resize(static_cast<size_t>(num_blocks) + 1);
  blocks_[sentinel_].prev = sentinel_;
  blocks_[sentinel_].next = sentinel_;
  for (BlockId b = 1; b < num_blocks; ++b) push_back(b);
  blocks_[kNullBlock].ref_count = 1;  // pinned, so it can never be freed into the queue
}

void BlockPool::unlink(BlockId block) {
  Block& b = blocks_[block];
  blocks_[b.prev].next = b.next;
  blocks_[b.next].prev = b.prev;
  b.prev = b.next = -1;
  --num_free_;
}

void BlockPool::push_front(BlockId block) {
  Block& b = blocks_[block];
  const BlockId first = blocks_[sentinel_].next;
  b.prev = sentinel_;
  b.next = first;
  blocks_[first].prev = block;
  blocks_[sentinel_].next = block;
  ++num_free_;
}

void BlockPool::push_back(BlockId block) {
  Block& b = blocks_[block];
  const BlockId last = blocks_[sentinel_].prev;
  b.prev = last;
  b.next = sentinel_;
  blocks_[last].next = block;
  blocks_[sentinel_].prev = block;
  ++num_free_;
}

void BlockPool::uncache(BlockId block) {
  Block& b = blocks_[block];
  if (b.entry_id == kNoCacheEntry) return;
  auto it = hash_to_block_.find(b.hash);
  if (it != hash_to_block_.end() && it->second == block) hash_to_block_.erase(it);
  b.entry_id = kNoCacheEntry;
  b.parent_entry_id = 0;
  b.hash = 0;
  b.token_ids.clear();
}

bool BlockPool::allocate(int n, std::vector<BlockId>* out) {
  ORIGAMI_CHECK(n >= 0);
  if (n > num_free_) return false;
  for (int i = 0; i < n; ++i) {
    const BlockId block = blocks_[sentinel_].next;
    ORIGAMI_CHECK(block != sentinel_ && block != kNullBlock);
    unlink(block);
    if (blocks_[block].entry_id != kNoCacheEntry) {
      uncache(block);
      ++num_evictions_;
    }
    blocks_[block].ref_count = 1;
    out->push_back(block);
  }
  return true;
}

void BlockPool::touch(BlockId block) {
  ORIGAMI_CHECK(block > kNullBlock && block < num_blocks_);
  Block& b = blocks_[block];
  if (b.ref_count == 0) {
    ORIGAMI_CHECK(in_free_queue(block));
    unlink(block);
  }
  ++b.ref_count;
}

void BlockPool::free(std::span<const BlockId> blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const BlockId block = *it;
    ORIGAMI_CHECK(block > kNullBlock && block < num_blocks_);
    Block& b = blocks_[block];
    ORIGAMI_CHECK_MSG(b.ref_count > 0, "block freed more often than it was taken");
    if (--b.ref_count > 0) continue;
    if (b.entry_id != kNoCacheEntry) {
      push_back(block);
    } else {
      push_front(block);
    }
  }
}

BlockId BlockPool::lookup(uint64_t hash, uint64_t parent_entry_id, std::span<const int32_t> token_ids) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return kNullBlock;
  const Block& b = blocks_[it->second];
  if (b.parent_entry_id != parent_entry_id) return kNullBlock;
  if (!std::equal(b.token_ids.begin(), b.token_ids.end(), token_ids.begin(), token_ids.end())) return kNullBlock;
  return it->second;
}

uint64_t BlockPool::cache_block(BlockId block, uint64_t hash, uint64_t parent_entry_id,
                                std::span<const int32_t> token_ids) {
  ORIGAMI_CHECK(block > kNullBlock && block < num_blocks_);
  Block& b = blocks_[block];
  ORIGAMI_CHECK(b.ref_count > 0);
  if (b.entry_id != kNoCacheEntry) {
    // Already holds cached contents (it was served by the cache); they must be these.
    return (b.hash == hash && b.parent_entry_id == parent_entry_id) ? b.entry_id : kNoCacheEntry;
  }
  auto it = hash_to_block_.find(hash);
  if (it != hash_to_block_.end()) {
    const BlockId owner = it->second;
    return lookup(hash, parent_entry_id, token_ids) == owner ? blocks_[owner].entry_id : kNoCacheEntry;
  }
  b.hash = hash;
  b.entry_id = next_entry_id_++;
  b.parent_entry_id = parent_entry_id;
  b.token_ids.assign(token_ids.begin(), token_ids.end());
  hash_to_block_.emplace(hash, block);
  return b.entry_id;
}

void BlockPool::forget_contents(BlockId block) {
  ORIGAMI_CHECK(block > kNullBlock && block < num_blocks_);
  ORIGAMI_CHECK_MSG(blocks_[block].ref_count > 0, "only a held block's contents can be rewritten");
  uncache(block);
}

void BlockPool::reset_prefix_cache() {
  for (BlockId b = 1; b < num_blocks_; ++b) {
    if (blocks_[b].entry_id == kNoCacheEntry) continue;
    uncache(b);
    // A free block without contents belongs at the front of the queue.
    if (blocks_[b].ref_count == 0) {
      unlink(b);
      push_front(b);
    }
  }
  ORIGAMI_CHECK(hash_to_block_.empty());
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> order;
  order.reserve(static_cast<size_t>(num_free_));
  for (BlockId b = blocks_[sentinel_].next; b != sentinel_; b = blocks_[b].next) order.push_back(b);
  return order;
}

}  // namespace origami
