// KV cache manager: layout sizes, prefix hits served by the same block ids with shared
// references, the "leave one token to compute" rule, caching of generated tokens (the walk over the
// tables skipped only where it would cache nothing), eviction, collision safety under a degenerate
// hash, and all-or-nothing allocation across groups.
#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "kv/kv_sequence.h"

namespace origami {
namespace {

constexpr int kBlock = 4;

KVLayout small_layout(int num_blocks) { return KVLayout::full(2, 2, 8, kBlock, num_blocks, DType::kF32); }

KVSequence make_request(int /*id*/, std::vector<int32_t> prompt) {
  KVSequence r;
  r.prompt_token_ids = std::move(prompt);
  return r;
}

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// What the scheduler and engine do for a whole prefill in one step.
int admit_and_prefill(KVCacheManager& kv, KVSequence& r) {
  const int cached = kv.acquire_cached_prefix(r);
  EXPECT_TRUE(kv.allocate_slots(r, r.num_tokens()));
  kv.cache_full_blocks(r, r.num_tokens());
  return cached;
}

const std::vector<BlockId>& blocks(const KVSequence& r) { return r.kv.groups.at(0).blocks; }

TEST(KVLayout, FullLayoutAndPageBytes) {
  const KVLayout layout = KVLayout::full(3, 4, 64, 16, 100, DType::kBF16);
  ASSERT_EQ(layout.groups.size(), 1u);
  EXPECT_EQ(layout.groups[0].layers, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(layout.groups[0].kv_heads, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(layout.groups[0].num_blocks, 100);
  EXPECT_EQ(layout.page_bytes(0), size_t{2} * 3 * 4 * 16 * 64 * 2);
  const KVLayout f32 = KVLayout::full(1, 1, 128, 1, 2, DType::kF32);
  EXPECT_EQ(f32.page_bytes(0), size_t{2} * 128 * 4);
}

TEST(KVCacheManager, BlocksNeededRoundsUp) {
  KVCacheManager kv(small_layout(10), true);
  EXPECT_EQ(kv.blocks_needed(0), 0);
  EXPECT_EQ(kv.blocks_needed(1), 1);
  EXPECT_EQ(kv.blocks_needed(4), 1);
  EXPECT_EQ(kv.blocks_needed(5), 2);
  EXPECT_EQ(kv.num_usable_blocks(), 9);
}

TEST(KVCacheManager, AllocatesExactBlockIdsAndTracksEntries) {
  KVCacheManager kv(small_layout(10), false);
  KVSequence r = make_request(1, iota_tokens(10, 100));
  EXPECT_EQ(kv.acquire_cached_prefix(r), 0);  // caching off
  ASSERT_TRUE(kv.allocate_slots(r, 6));  // a first chunk
  EXPECT_EQ(blocks(r), (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(r.kv.num_entries(0), 6);
  ASSERT_TRUE(kv.allocate_slots(r, 8));  // still fits in block 2
  EXPECT_EQ(blocks(r), (std::vector<BlockId>{1, 2}));
  ASSERT_TRUE(kv.allocate_slots(r, 11));
  EXPECT_EQ(blocks(r), (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(kv.num_used_blocks(), 3);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  kv.free(r);
  EXPECT_TRUE(r.kv.groups.empty());
  EXPECT_EQ(kv.num_free_blocks(), 9);
}

TEST(KVCacheManager, PrefixHitSharesTheSameBlocks) {
  KVCacheManager kv(small_layout(12), true);
  KVSequence a = make_request(1, iota_tokens(10, 100));  // 2 full blocks + 2 tokens
  EXPECT_EQ(admit_and_prefill(kv, a), 0);
  EXPECT_EQ(blocks(a), (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);  // the partial block is not cached

  std::vector<int32_t> prompt_b = iota_tokens(8, 100);  // same 2 blocks, then other tokens
  for (int32_t t : {7, 7, 7}) prompt_b.push_back(t);
  KVSequence b = make_request(2, prompt_b);
  EXPECT_EQ(admit_and_prefill(kv, b), 8);
  EXPECT_EQ(b.num_cached_prefix_tokens, 8);
  EXPECT_EQ(blocks(b), (std::vector<BlockId>{1, 2, 4}));
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  EXPECT_EQ(kv.pool().ref_count(2), 2);
  EXPECT_EQ(kv.pool().ref_count(3), 1);
  EXPECT_EQ(kv.pool().ref_count(4), 1);

  kv.free(a);
  EXPECT_EQ(kv.pool().ref_count(1), 1);
  EXPECT_EQ(kv.pool().ref_count(3), 0);
  kv.free(b);
  EXPECT_EQ(kv.pool().ref_count(1), 0);
  EXPECT_EQ(kv.num_free_blocks(), 11);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);  // cached blocks outlive their requests

  KVSequence c = make_request(3, iota_tokens(9, 100));
  EXPECT_EQ(admit_and_prefill(kv, c), 8);
  EXPECT_EQ(blocks(c)[0], 1);
  EXPECT_EQ(blocks(c)[1], 2);

  const PrefixCacheStats& s = kv.prefix_cache_stats();
  EXPECT_EQ(s.num_queried_tokens, 10 + 11 + 9);
  EXPECT_EQ(s.num_hit_tokens, 16);
}

TEST(KVCacheManager, AlwaysLeavesOneTokenToCompute) {
  KVCacheManager kv(small_layout(12), true);
  KVSequence a = make_request(1, iota_tokens(12, 0));  // exactly 3 blocks
  admit_and_prefill(kv, a);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 3);
  KVSequence same = make_request(2, iota_tokens(12, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(same), 8);  // the last block is recomputed
  KVSequence longer = make_request(3, iota_tokens(13, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(longer), 12);
  KVSequence one = make_request(4, iota_tokens(4, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(one), 0);
  KVSequence other = make_request(5, iota_tokens(13, 1));
  EXPECT_EQ(kv.acquire_cached_prefix(other), 0);
}

TEST(KVCacheManager, GeneratedTokensAreCachedToo) {
  KVCacheManager kv(small_layout(12), true);
  KVSequence a = make_request(1, iota_tokens(6, 50));
  admit_and_prefill(kv, a);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  // Decode: the engine appends the sampled token, the next step computes it.
  for (int32_t t : {900, 901, 902}) {
    a.output_token_ids.push_back(t);
    ASSERT_TRUE(kv.allocate_slots(a, a.num_tokens()));
    
    kv.cache_full_blocks(a, a.num_tokens());
  }
  EXPECT_EQ(a.num_tokens(), 9);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);  // tokens 4..7 = 54 55 900 901
  std::vector<int32_t> follow_up = iota_tokens(6, 50);
  for (int32_t t : {900, 901, 902, 5}) follow_up.push_back(t);
  KVSequence b = make_request(2, follow_up);
  EXPECT_EQ(kv.acquire_cached_prefix(b), 8);
  EXPECT_EQ(blocks(b), (std::vector<BlockId>{blocks(a)[0], blocks(a)[1]}));
}

// Decode steps within the pages held add their tokens without a new pages_version
// (RequestKV::append_to_every_table): the walk over the tables is skipped while no block fills,
// and taken the step one does.
TEST(KVCacheManager, ABlockFilledWithinThePagesHeldIsCached) {
  KVCacheManager kv(small_layout(12), true);
  KVSequence a = make_request(1, iota_tokens(5, 50));
  admit_and_prefill(kv, a);  // 2 pages, block 0 full
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  const uint64_t version = a.kv.pages_version;
  for (int32_t t : {900, 901, 902}) {
    a.output_token_ids.push_back(t);
    ASSERT_TRUE(kv.append_slots(a, 1));  // page 1 fills with the third
    kv.cache_full_blocks(a, a.num_tokens());
  }
  EXPECT_EQ(a.kv.pages_version, version);  // no page was added
  EXPECT_EQ(kv.pool().num_cached_blocks(), 2);
  std::vector<int32_t> follow_up = iota_tokens(5, 50);
  for (int32_t t : {900, 901, 902, 5}) follow_up.push_back(t);
  KVSequence b = make_request(2, follow_up);
  EXPECT_EQ(kv.acquire_cached_prefix(b), 8);
}

// Entries whose tokens are not yet computed are not cached; once they are (the same full blocks,
// the same tables), they are: the walk is skipped only while it would find what the last one did.
TEST(KVCacheManager, ATableIsCachedOnceItsEntriesAreComputed) {
  KVCacheManager kv(small_layout(12), true);
  KVSequence a = make_request(1, iota_tokens(7, 50));
  ASSERT_TRUE(kv.allocate_slots(a, 7));
  kv.cache_full_blocks(a, 6);  // 7 entries, 6 computed: not the tokens' KV yet
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0);
  kv.cache_full_blocks(a, 7);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
}

// Tables reported changed (a new pages_version) are walked again, even where the computed tokens
// and the tables' lead over them are as before: here a group's count comes back to the tokens.
TEST(KVCacheManager, TablesReportedChangedAreWalkedAgain) {
  Expected<KVLayout> layout = KVLayout::grouped(2, 4, 8, kBlock, 65, DType::kF32, KVLayout::adjacent_heads(2, 4, 1));
  ASSERT_TRUE(layout.has_value());
  KVCacheManager kv(layout.value(), true);
  KVSequence a = make_request(1, iota_tokens(7, 50));
  ASSERT_TRUE(kv.allocate_slots(a, 7));
  a.kv.set_num_entries(1, 6);  // group 1 not computed as far
  a.kv.tables_changed();
  kv.cache_full_blocks(a, 7);
  EXPECT_EQ(a.kv.keys_of(0).size(), 1u);
  EXPECT_EQ(a.kv.keys_of(1).size(), 0u);
  a.kv.set_num_entries(1, 7);
  a.kv.tables_changed();
  kv.cache_full_blocks(a, 7);
  EXPECT_EQ(a.kv.keys_of(1).size(), 1u);
}

// A table changed without tables_changed() after a walk: the tests' verification (which walks where
// the walk would be skipped) finds a block the skip would have left out.
TEST(KVCacheManagerDeathTest, VerificationFindsACountSetWithoutANewVersion) {
  Expected<KVLayout> layout = KVLayout::grouped(2, 4, 8, kBlock, 65, DType::kF32, KVLayout::adjacent_heads(2, 4, 1));
  ASSERT_TRUE(layout.has_value());
  KVCacheManager kv(layout.value(), true);
  kv.set_verify_table_summaries(true);
  KVSequence a = make_request(1, iota_tokens(7, 50));
  ASSERT_TRUE(kv.allocate_slots(a, 7));
  a.kv.set_num_entries(1, 6);  // group 1 not computed as far (reported)
  a.kv.tables_changed();
  kv.cache_full_blocks(a, 7);
  EXPECT_EQ(a.kv.keys_of(1).size(), 0u);
  a.kv.set_num_entries(1, 7);  // unreported
  EXPECT_DEATH(kv.cache_full_blocks(a, 7), "the last walk's record said were registered");
}

TEST(KVCacheManager, EvictsLeastRecentlyFreedTailFirst) {
  KVCacheManager kv(small_layout(7), true);  // 6 usable blocks
  KVSequence a = make_request(1, iota_tokens(12, 0));
  KVSequence b = make_request(2, iota_tokens(12, 100));
  admit_and_prefill(kv, a);  // blocks 1 2 3
  admit_and_prefill(kv, b);  // blocks 4 5 6
  kv.free(a);
  kv.free(b);
  EXPECT_EQ(kv.pool().free_queue(), (std::vector<BlockId>{3, 2, 1, 6, 5, 4}));
  KVSequence c = make_request(3, iota_tokens(8, 1000));
  admit_and_prefill(kv, c);  // takes a's tail, then its middle block
  EXPECT_EQ(blocks(c), (std::vector<BlockId>{3, 2}));
  EXPECT_EQ(kv.pool().num_evictions(), 2);
  KVSequence a2 = make_request(4, iota_tokens(13, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(a2), 4);  // only a's head survived
  EXPECT_EQ(blocks(a2), (std::vector<BlockId>{1}));
  KVSequence b2 = make_request(5, iota_tokens(13, 100));
  EXPECT_EQ(kv.acquire_cached_prefix(b2), 12);
  EXPECT_EQ(blocks(b2), (std::vector<BlockId>{4, 5, 6}));
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 12345; }

TEST(KVCacheManager, CollidingHashesNeverServeWrongBlocks) {
  KVCacheManager kv(small_layout(16), true);
  kv.set_block_hasher_for_testing(&constant_hash);
  // Every block hashes alike; repeated blocks make tokens match too, so only the chain link
  // tells block 0 from block 1.
  KVSequence a = make_request(1, {7, 7, 7, 7, 7, 7, 7, 7, 1});
  admit_and_prefill(kv, a);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 1);
  KVSequence b = make_request(2, {7, 7, 7, 7, 7, 7, 7, 7, 2});
  EXPECT_EQ(kv.acquire_cached_prefix(b), 4);
  EXPECT_EQ(blocks(b), (std::vector<BlockId>{blocks(a)[0]}));
  KVSequence c = make_request(3, {8, 7, 7, 7, 7, 7, 7, 7, 2});
  EXPECT_EQ(kv.acquire_cached_prefix(c), 0);
  KVSequence d = make_request(4, {7, 7, 7, 7, 3});  // same first block: a true hit
  EXPECT_EQ(kv.acquire_cached_prefix(d), 4);
}

TEST(KVCacheManager, FailedAllocationLeavesEverythingUntouched) {
  KVCacheManager kv(small_layout(6), true);  // 5 usable
  KVSequence a = make_request(1, iota_tokens(12, 0));
  admit_and_prefill(kv, a);  // 3 blocks
  KVSequence b = make_request(2, iota_tokens(8, 100));
  ASSERT_TRUE(kv.allocate_slots(b, 4));
  const std::vector<BlockId> before = blocks(b);
  const std::vector<BlockId> queue_before = kv.pool().free_queue();
  EXPECT_FALSE(kv.allocate_slots(b, 13));  // needs 3 more, 1 free
  EXPECT_EQ(blocks(b), before);
  EXPECT_EQ(b.kv.num_entries(0), 4);
  EXPECT_EQ(kv.pool().free_queue(), queue_before);
  EXPECT_TRUE(kv.allocate_slots(b, 8));
  EXPECT_EQ(kv.num_free_blocks(), 0);
}

TEST(KVCacheManager, AllGroupsGrowOrNone) {
  KVLayout layout = small_layout(0);
  layout.groups.clear();
  layout.groups.push_back({{0}, {0, 1}, 8});
  layout.groups.push_back({{1}, {0, 1}, 4});  // the smaller pool runs out first
  KVCacheManager kv(layout, true);
  EXPECT_EQ(kv.num_groups(), 2);
  EXPECT_EQ(kv.num_usable_blocks(), 3);
  KVSequence a = make_request(1, iota_tokens(12, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));
  EXPECT_EQ(a.kv.groups[0].blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(a.kv.groups[1].blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_FALSE(kv.allocate_slots(a, 13));
  EXPECT_EQ(kv.num_free_blocks(0), 5);
  EXPECT_EQ(kv.num_free_blocks(1), 1);
  ASSERT_TRUE(kv.allocate_slots(a, 12));
  kv.cache_full_blocks(a, 12);
  kv.free(a);
  KVSequence b = make_request(2, iota_tokens(13, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(b), 12);
  EXPECT_EQ(b.kv.groups[0].blocks.size(), 3u);
  EXPECT_EQ(b.kv.groups[1].blocks.size(), 3u);
}

TEST(KVCacheManager, AppendGrowsEachGroupFromItsOwnLengthOrNone) {
  KVLayout layout = small_layout(0);
  layout.groups.clear();
  layout.groups.push_back({{0}, {0, 1}, 9});
  layout.groups.push_back({{1}, {0, 1}, 9});
  layout.shared_pool = true;  // one pool of 8 usable pages for both groups
  KVCacheManager kv(layout, false);
  KVSequence a = make_request(1, iota_tokens(12, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));
  // Non-uniform budgets: group 1 was compacted to 3 entries in one block (the manager's view).
  const BlockId dropped = a.kv.groups[1].blocks.back();
  a.kv.groups[1].blocks.pop_back();
  a.kv.set_num_entries(1, 3);
  a.kv.tables_changed();  // as whoever changes a table tells its RequestKV (its summary is gone)
  kv.release_blocks(std::vector<BlockId>{dropped});
  ASSERT_TRUE(kv.append_slots(a, 2));
  EXPECT_EQ(a.kv.num_entries(0), 10);
  EXPECT_EQ(a.kv.num_entries(1), 5);
  EXPECT_EQ(a.kv.groups[0].blocks.size(), 3u);
  EXPECT_EQ(a.kv.groups[1].blocks.size(), 2u);
  EXPECT_EQ(kv.blocks_to_append(a, 7), 2 + 1);
  EXPECT_EQ(kv.num_free_blocks(), 3);
  // 7 more: group 0 needs 2 blocks, group 1 needs 1; 3 are free.
  ASSERT_TRUE(kv.append_slots(a, 7));
  EXPECT_EQ(a.kv.num_entries(0), 17);
  EXPECT_EQ(a.kv.num_entries(1), 12);
  EXPECT_EQ(kv.num_free_blocks(), 0);
  // Out of pages: nothing changes in any group.
  EXPECT_FALSE(kv.append_slots(a, 4));
  EXPECT_EQ(a.kv.num_entries(0), 17);
  EXPECT_EQ(a.kv.num_entries(1), 12);
  EXPECT_EQ(a.kv.groups[0].blocks.size(), 5u);
  EXPECT_EQ(a.kv.groups[1].blocks.size(), 3u);
}

// The scheduler skips counting shared blocks when blocks_may_be_shared() is false: without prefix
// caching, the same prompt twice must give every held block exactly one reference.
TEST(KVCacheManager, OnlyPrefixHitsShareBlocks) {
  for (const bool prefix_caching : {false, true}) {
    KVCacheManager kv(small_layout(12), prefix_caching);
    EXPECT_EQ(kv.blocks_may_be_shared(), prefix_caching);
    KVSequence a = make_request(1, iota_tokens(10, 100));
    KVSequence b = make_request(2, iota_tokens(10, 100));
    admit_and_prefill(kv, a);
    admit_and_prefill(kv, b);
    ASSERT_TRUE(kv.append_slots(b, 3));
    int max_refs = 0;
    for (const KVSequence* r : {&a, &b})
      for (BlockId block : blocks(*r)) max_refs = std::max(max_refs, kv.ref_count(block));
    EXPECT_EQ(max_refs, prefix_caching ? 2 : 1) << "prefix caching " << prefix_caching;
  }
}

TEST(KVCacheManager, AbandonedAdmissionIsUndone) {
  KVCacheManager kv(small_layout(10), true);
  KVSequence a = make_request(1, iota_tokens(9, 0));
  admit_and_prefill(kv, a);
  kv.free(a);
  const std::vector<BlockId> queue_before = kv.pool().free_queue();
  const PrefixCacheStats stats_before = kv.prefix_cache_stats();
  KVSequence b = make_request(2, iota_tokens(9, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(b), 8);
  EXPECT_EQ(kv.num_free_blocks(), 7);
  kv.abandon_admission(b);
  EXPECT_EQ(kv.num_free_blocks(), 9);
  EXPECT_TRUE(b.kv.groups.empty());
  EXPECT_EQ(b.num_cached_prefix_tokens, 0);
  EXPECT_EQ(kv.prefix_cache_stats().num_queried_tokens, stats_before.num_queried_tokens);
  EXPECT_EQ(kv.prefix_cache_stats().num_hit_tokens, stats_before.num_hit_tokens);
  // The hit blocks are cached contents again, still findable.
  EXPECT_EQ(kv.pool().free_queue().size(), queue_before.size());
  KVSequence c = make_request(3, iota_tokens(9, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(c), 8);
}

TEST(KVCacheManager, CompressedTablesAreNotCached) {
  KVCacheManager kv(small_layout(10), true);
  KVSequence a = make_request(1, iota_tokens(12, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 12));
  a.kv.set_num_entries(0, 8);  // as if compression had dropped entries
  kv.cache_full_blocks(a, 12);
  EXPECT_EQ(kv.pool().num_cached_blocks(), 0);
}

}  // namespace
}  // namespace origami
