#pragma once
// The pages of one head group: reference counts, the prefix cache (content hash -> block) and the
// free queue. The free queue is kept in eviction order: allocation takes its front, and when the
// block taken still holds cached contents they are evicted then. Freed blocks that hold cached
// contents join the back (least recently used are evicted first); freed blocks holding nothing
// reusable join the front, so they are reused before any cached contents are given up.
// Block 0 is the null block: never handed out, never freed.
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_table.h"

namespace origami {

class BlockPool {
 public:
  // `num_blocks` counts the null block, so `num_blocks - 1` blocks can be handed out.
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return num_blocks_; }
  int num_usable_blocks() const { return num_blocks_ - 1; }
  // Blocks no request holds, cached ones included (they are evicted on demand).
  int num_free_blocks() const { return num_free_; }
  int num_used_blocks() const { return num_usable_blocks() - num_free_; }
  // Blocks whose contents are registered in the prefix cache (held or free).
  int num_cached_blocks() const { return static_cast<int>(hash_to_block_.size()); }
  int64_t num_evictions() const { return num_evictions_; }

  // Takes `n` blocks from the front of the free queue with reference count 1, evicting their
  // cached contents. Returns false and changes nothing when fewer than `n` are free.
  bool allocate(int n, std::vector<BlockId>* out);
  // Takes one more reference; a free cached block leaves the free queue (a prefix-cache hit).
  void touch(BlockId block);
  // Drops one reference to each block, visiting them back to front: a sequence's blocks are
  // passed in order, and its tail is then evicted before its head (the head is more shareable).
  void free(std::span<const BlockId> blocks);

  // The block whose contents are (parent entry, token ids), or kNullBlock. Both are compared,
  // not only the hash, so a hash collision is a miss and never serves another prefix's KV.
  BlockId lookup(uint64_t hash, uint64_t parent_entry_id, std::span<const int32_t> token_ids) const;
  // Registers a full, held block's contents. Returns the entry id now holding those contents:
  // the new one, or an existing block's if identical contents are already cached (the caller's
  // block stays an uncached duplicate); kNoCacheEntry if another content owns this hash.
  uint64_t cache_block(BlockId block, uint64_t hash, uint64_t parent_entry_id, std::span<const int32_t> token_ids);
  // Forgets the cached contents of a held block that is about to be rewritten in place (KV
  // compression compacts kept entries into a request's own blocks): no later lookup may find it.
  void forget_contents(BlockId block);
  // Forgets every cached content (e.g. between benchmark runs); held blocks stay held.
  void reset_prefix_cache();

  int ref_count(BlockId block) const { return blocks_[block].ref_count; }
  bool is_cached(BlockId block) const { return blocks_[block].entry_id != kNoCacheEntry; }
  uint64_t entry_id(BlockId block) const { return blocks_[block].entry_id; }
  // The free queue, front (next evicted) first; for tests and debugging.
  std::vector<BlockId> free_queue() const;

 private:
  struct Block {
    int ref_count = 0;
    uint64_t hash = 0;
    uint64_t entry_id = kNoCacheEntry;  // kNoCacheEntry: holds no cached contents
    uint64_t parent_entry_id = 0;
    std::vector<int32_t> token_ids;     // compared on lookup (collision safety)
    BlockId prev = -1;                  // free-queue links; -1 when not in the queue
    BlockId next = -1;
  };

  void uncache(BlockId block);
  void unlink(BlockId block);
  void push_front(BlockId block);
  void push_back(BlockId block);
  bool in_free_queue(BlockId block) const { return blocks_[block].prev >= 0; }

  int num_blocks_;
  int num_free_ = 0;
  int64_t num_evictions_ = 0;
  uint64_t next_entry_id_ = 1;  // 0 is the parent of every sequence's first block
  std::vector<Block> blocks_;   // [num_blocks + 1]: the last one is the free queue's sentinel
  BlockId sentinel_;
  std::unordered_map<uint64_t, BlockId> hash_to_block_;
};

}  // namespace origami
