// Block pool: exact ids handed out, reference counts, free-queue (eviction) order, the prefix
// cache's collision safety and all-or-nothing allocation.
#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace origami {
namespace {

std::vector<BlockId> range(BlockId first, BlockId last) {  // [first, last]
  std::vector<BlockId> v(static_cast<size_t>(last - first + 1));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<BlockId> take(BlockPool& pool, int n) {
  std::vector<BlockId> out;
  EXPECT_TRUE(pool.allocate(n, &out));
  return out;
}

TEST(BlockPool, HandsOutBlocksInOrderAndNeverTheNullBlock) {
  BlockPool pool(10);
  EXPECT_EQ(pool.num_usable_blocks(), 9);
  EXPECT_EQ(pool.num_free_blocks(), 9);
  EXPECT_EQ(pool.free_queue(), range(1, 9));
  EXPECT_EQ(take(pool, 3), (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(take(pool, 1), (std::vector<BlockId>{4}));
  EXPECT_EQ(take(pool, 5), range(5, 9));
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.num_used_blocks(), 9);
  for (BlockId b = 1; b < 10; ++b) EXPECT_EQ(pool.ref_count(b), 1);
  std::vector<BlockId> out;
  EXPECT_FALSE(pool.allocate(1, &out));
  EXPECT_TRUE(out.empty());
}

TEST(BlockPool, FailedAllocationChangesNothing) {
  BlockPool pool(6);
  const std::vector<BlockId> held = take(pool, 2);
  pool.cache_block(held[0], 42, 0, std::vector<int32_t>{1, 2});
  pool.free(std::vector<BlockId>{held[0]});  // a cached free block, evictable
  const std::vector<BlockId> queue_before = pool.free_queue();
  std::vector<BlockId> out{7};
  EXPECT_FALSE(pool.allocate(5, &out));
  EXPECT_EQ(out, std::vector<BlockId>{7});
  EXPECT_EQ(pool.free_queue(), queue_before);
  EXPECT_EQ(pool.num_free_blocks(), 4);
  EXPECT_TRUE(pool.is_cached(held[0]));
  EXPECT_EQ(pool.lookup(42, 0, std::vector<int32_t>{1, 2}), held[0]);
  EXPECT_EQ(pool.num_evictions(), 0);
}

TEST(BlockPool, FreedBlocksReturnToThePool) {
  BlockPool pool(8);
  const std::vector<BlockId> a = take(pool, 3);  // 1 2 3
  const std::vector<BlockId> b = take(pool, 2);  // 4 5
  EXPECT_EQ(pool.num_free_blocks(), 2);
  pool.free(a);
  EXPECT_EQ(pool.num_free_blocks(), 5);
  for (BlockId id : a) EXPECT_EQ(pool.ref_count(id), 0);
  // Blocks without cached contents are reused first, in the sequence's own order.
  EXPECT_EQ(pool.free_queue(), (std::vector<BlockId>{1, 2, 3, 6, 7}));
  EXPECT_EQ(take(pool, 4), (std::vector<BlockId>{1, 2, 3, 6}));
  pool.free(b);
  EXPECT_EQ(pool.free_queue(), (std::vector<BlockId>{4, 5, 7}));
}

TEST(BlockPool, SharedBlocksCountReferences) {
  BlockPool pool(5);
  const std::vector<BlockId> a = take(pool, 2);
  pool.cache_block(a[0], 11, 0, std::vector<int32_t>{5});
  pool.touch(a[0]);  // a second request shares the first block
  EXPECT_EQ(pool.ref_count(a[0]), 2);
  EXPECT_EQ(pool.ref_count(a[1]), 1);
  pool.free(a);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.ref_count(a[1]), 0);
  EXPECT_EQ(pool.num_free_blocks(), 3);  // a[0] still held by the sharer
  pool.free(std::vector<BlockId>{a[0]});
  EXPECT_EQ(pool.ref_count(a[0]), 0);
  EXPECT_EQ(pool.num_free_blocks(), 4);
}

TEST(BlockPool, CachedFreeBlocksAreEvictedLeastRecentlyUsedTailFirst) {
  BlockPool pool(9);
  const std::vector<BlockId> a = take(pool, 3);  // 1 2 3: a request's full blocks
  const std::vector<BlockId> b = take(pool, 3);  // 4 5 6
  uint64_t parent = 0;
  for (int i = 0; i < 3; ++i) parent = pool.cache_block(a[i], 100 + i, parent, std::vector<int32_t>{i});
  parent = 0;
  for (int i = 0; i < 3; ++i) parent = pool.cache_block(b[i], 200 + i, parent, std::vector<int32_t>{10 + i});
  pool.free(a);  // freed first: evicted first; within it the tail goes before the head
  pool.free(b);
  EXPECT_EQ(pool.free_queue(), (std::vector<BlockId>{7, 8, 3, 2, 1, 6, 5, 4}));
  EXPECT_EQ(pool.num_cached_blocks(), 6);

  // Uncached blocks go first, then cached ones in that order, each eviction dropping its entry.
  EXPECT_EQ(take(pool, 3), (std::vector<BlockId>{7, 8, 3}));
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_FALSE(pool.is_cached(3));
  EXPECT_EQ(pool.lookup(102, pool.entry_id(2), std::vector<int32_t>{2}), kNullBlock);
  EXPECT_EQ(pool.lookup(101, pool.entry_id(1), std::vector<int32_t>{1}), 2);

  // A hit takes a cached block out of the queue; freeing it again makes it most recent.
  pool.touch(1);
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_EQ(pool.free_queue(), (std::vector<BlockId>{2, 6, 5, 4}));
  pool.free(std::vector<BlockId>{1});
  EXPECT_EQ(pool.free_queue(), (std::vector<BlockId>{2, 6, 5, 4, 1}));
  EXPECT_EQ(take(pool, 4), (std::vector<BlockId>{2, 6, 5, 4}));
  EXPECT_EQ(pool.num_evictions(), 5);
  EXPECT_EQ(pool.num_cached_blocks(), 1);
}

TEST(BlockPool, HashCollisionIsAMissNeverAWrongBlock) {
  BlockPool pool(6);
  const std::vector<BlockId> a = take(pool, 2);
  const std::vector<int32_t> tokens_a{1, 2, 3};
  const std::vector<int32_t> tokens_b{1, 2, 4};
  const uint64_t entry = pool.cache_block(a[0], 777, 0, tokens_a);
  ASSERT_NE(entry, kNoCacheEntry);
  // Same hash, other tokens: the hash is owned, so the second block stays uncached.
  EXPECT_EQ(pool.cache_block(a[1], 777, 0, tokens_b), kNoCacheEntry);
  EXPECT_FALSE(pool.is_cached(a[1]));
  EXPECT_EQ(pool.lookup(777, 0, tokens_b), kNullBlock);
  EXPECT_EQ(pool.lookup(777, 0, std::vector<int32_t>{1, 2}), kNullBlock);  // a prefix of the tokens
  // Same hash and tokens after another parent (a different prefix): also a miss.
  EXPECT_EQ(pool.lookup(777, entry + 5, tokens_a), kNullBlock);
  EXPECT_EQ(pool.lookup(777, 0, tokens_a), a[0]);
  // Identical contents registered again resolve to the existing entry.
  EXPECT_EQ(pool.cache_block(a[1], 777, 0, tokens_a), entry);
  EXPECT_FALSE(pool.is_cached(a[1]));
}

TEST(BlockPool, EntryIdsAreNeverReused) {
  BlockPool pool(3);
  std::vector<BlockId> a = take(pool, 1);
  const uint64_t first = pool.cache_block(a[0], 5, 0, std::vector<int32_t>{9});
  pool.free(a);
  a = take(pool, 2);  // evicts block 1's entry
  const uint64_t second = pool.cache_block(a[1], 5, 0, std::vector<int32_t>{9});
  EXPECT_NE(first, second);
  EXPECT_EQ(pool.lookup(5, 0, std::vector<int32_t>{9}), a[1]);
}

TEST(BlockPool, ResetPrefixCacheForgetsContentsButKeepsReferences) {
  BlockPool pool(5);
  const std::vector<BlockId> a = take(pool, 2);
  pool.cache_block(a[0], 1, 0, std::vector<int32_t>{1});
  pool.cache_block(a[1], 2, pool.entry_id(a[0]), std::vector<int32_t>{2});
  pool.free(std::vector<BlockId>{a[1]});
  pool.reset_prefix_cache();
  EXPECT_EQ(pool.num_cached_blocks(), 0);
  EXPECT_EQ(pool.ref_count(a[0]), 1);
  EXPECT_EQ(pool.lookup(1, 0, std::vector<int32_t>{1}), kNullBlock);
  EXPECT_EQ(pool.free_queue().front(), a[1]);  // nothing left to keep it for
  EXPECT_EQ(pool.num_free_blocks(), 3);
}

}  // namespace
}  // namespace origami
