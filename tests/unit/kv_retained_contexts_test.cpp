// Retained contexts in the KV cache manager: a context holds a reference on each page of its
// tables; the longest history that is a proper prefix of a request's tokens is found (not a
// longer one, not a mere hash match, not a compressed context under another policy key); a
// continuation shares the full pages and gets a copy of the partly filled last one; contexts are
// released LRU-first when an allocation would fail and within their page limit; every page comes
// back to the pool.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_sequence.h"

namespace origami {
namespace {

constexpr int kBlock = 4;

KVLayout small_layout(int num_blocks) { return KVLayout::full(2, 2, 8, kBlock, num_blocks, DType::kF32); }

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

KVSequence prefilled(KVCacheManager& kv, std::vector<int32_t> prompt) {
  KVSequence r;
  r.prompt_token_ids = std::move(prompt);
  EXPECT_EQ(kv.acquire_cached_prefix(r), 0);
  EXPECT_TRUE(kv.allocate_slots(r, r.num_tokens()));
  return r;
}

TEST(RetainedContexts, ContinuationSharesFullPagesAndCopiesThePartialOne) {
  KVCacheManager kv(small_layout(32), /*enable_prefix_caching=*/false);
  kv.enable_retained_contexts(100);
  const int free_at_start = kv.num_free_blocks();
  KVSequence a = prefilled(kv, iota_tokens(10, 1));  // 3 pages, the last holding 2 entries
  a.output_token_ids = {100, 101};                   // the last output's KV is never computed
  ASSERT_TRUE(kv.allocate_slots(a, 11));
  ASSERT_TRUE(kv.retain(a, 11, {}));
  const std::vector<BlockId> a_pages = a.kv.groups[0].blocks;
  kv.free(a);
  EXPECT_EQ(kv.retained_stats().num_contexts, 1);
  EXPECT_EQ(kv.retained_stats().num_pages, 3);
  EXPECT_EQ(kv.num_free_blocks(), free_at_start - 3);

  KVSequence b;
  b.prompt_token_ids = iota_tokens(10, 1);
  b.prompt_token_ids.insert(b.prompt_token_ids.end(), {100, 101, 7, 8});
  const RetainedContext* c = kv.find_retained(b, b.num_tokens(), "");
  ASSERT_NE(c, nullptr);
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.continue_retained(b, *c, &copies), 11);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a_pages[2]);
  EXPECT_EQ(b.kv.num_entries(0), 11);
  EXPECT_EQ(b.kv.groups[0].blocks[0], a_pages[0]);
  EXPECT_EQ(b.kv.groups[0].blocks[1], a_pages[1]);
  EXPECT_EQ(b.kv.groups[0].blocks[2], copies[0].dst);
  EXPECT_EQ(kv.ref_count(a_pages[0]), 2);
  EXPECT_EQ(kv.ref_count(a_pages[2]), 1);  // only the context holds the partial page
  EXPECT_EQ(kv.ref_count(copies[0].dst), 1);
  EXPECT_EQ(kv.retained_stats().num_hits, 1);
  EXPECT_EQ(kv.retained_stats().num_hit_tokens, 11);
  ASSERT_TRUE(kv.append_slots(b, 3));
  kv.free(b);
  kv.release_all_retained();
  EXPECT_EQ(kv.num_free_blocks(), free_at_start);
  EXPECT_EQ(kv.retained_stats().num_pages, 0);
}

TEST(RetainedContexts, FindsTheLongestProperPrefixOnly) {
  KVCacheManager kv(small_layout(64), false);
  kv.enable_retained_contexts(100);
  for (int n : {4, 8, 12}) {
    KVSequence r = prefilled(kv, iota_tokens(n, 1));
    ASSERT_TRUE(kv.retain(r, n, {}));
    kv.free(r);
  }
  KVSequence q;
  q.prompt_token_ids = iota_tokens(12, 1);  // equal to the longest: one token must be computed
  const RetainedContext* c = kv.find_retained(q, q.num_tokens(), "");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->tokens.size(), 8u);
  q.prompt_token_ids.push_back(99);
  EXPECT_EQ(kv.find_retained(q, q.num_tokens(), "")->tokens.size(), 12u);
  EXPECT_EQ(kv.find_retained(q, 9, "")->tokens.size(), 8u);  // max_tokens bounds the history
  q.prompt_token_ids[5] = 77;                                  // differs inside the 8- and 12-token histories
  EXPECT_EQ(kv.find_retained(q, q.num_tokens(), "")->tokens.size(), 4u);
  q.prompt_token_ids[0] = 77;
  EXPECT_EQ(kv.find_retained(q, q.num_tokens(), ""), nullptr);
  kv.release_all_retained();
  EXPECT_EQ(kv.num_used_blocks(), 0);
}

TEST(RetainedContexts, CompressedContextsContinueOnlyUnderTheirPolicyKey) {
  KVCacheManager kv(small_layout(32), false);
  kv.enable_retained_contexts(100);
  KVSequence r = prefilled(kv, iota_tokens(12, 1));
  r.kv.compacted = true;
  r.kv.set_num_entries(0, 6);  // a compression kept 6 of 12 entries
  RetainedPolicyState state;
  state.policy_key = "snapkv|budget=6";
  state.num_compressions = 1;
  ASSERT_TRUE(kv.retain(r, 12, state));
  EXPECT_EQ(kv.retained_stats().num_pages, 2);  // the page beyond the 6 entries is not kept
  kv.free(r);
  KVSequence q;
  q.prompt_token_ids = iota_tokens(14, 1);
  EXPECT_EQ(kv.find_retained(q, 14, ""), nullptr);
  EXPECT_EQ(kv.find_retained(q, 14, "streaming|budget=6"), nullptr);
  const RetainedContext* c = kv.find_retained(q, 14, "snapkv|budget=6");
  ASSERT_NE(c, nullptr);
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.continue_retained(q, *c, &copies), 12);
  EXPECT_TRUE(q.kv.compacted);
  EXPECT_EQ(q.kv.num_entries(0), 6);
  EXPECT_EQ(copies.size(), 1u);  // 6 entries: the second page is partly filled
  kv.abandon_admission(q);       // an admission that could not finish is undone
  EXPECT_EQ(kv.retained_stats().num_hits, 0);
  kv.release_all_retained();
  EXPECT_EQ(kv.num_used_blocks(), 0);
}

TEST(RetainedContexts, ReleasedLeastRecentlyUsedFirstWhenPagesAreNeeded) {
  KVCacheManager kv(small_layout(1 + 12), false);  // 12 usable pages
  kv.enable_retained_contexts(100);
  std::vector<std::vector<int32_t>> histories;
  for (int i = 0; i < 3; ++i) {  // three contexts of 4 pages each: the pool is full
    histories.push_back(iota_tokens(16, 100 * i + 1));
    KVSequence r = prefilled(kv, histories.back());
    ASSERT_TRUE(kv.retain(r, 16, {}));
    kv.free(r);
  }
  EXPECT_EQ(kv.num_free_blocks(), 0);
  // Continuing the first makes it the most recently used.
  KVSequence use;
  use.prompt_token_ids = histories[0];
  use.prompt_token_ids.push_back(5);
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.continue_retained(use, *kv.find_retained(use, use.num_tokens(), ""), &copies), 16);
  EXPECT_TRUE(copies.empty());  // 16 entries fill their pages
  kv.free(use);
  // A request needing 6 pages releases the second context (4 pages) and then the third.
  KVSequence big;
  big.prompt_token_ids = iota_tokens(24, 5000);
  kv.acquire_cached_prefix(big);
  ASSERT_TRUE(kv.allocate_slots(big, 24));
  EXPECT_EQ(kv.retained_stats().num_releases, 2);
  EXPECT_EQ(kv.retained_stats().num_contexts, 1);
  KVSequence again;
  again.prompt_token_ids = histories[0];
  again.prompt_token_ids.push_back(6);
  EXPECT_NE(kv.find_retained(again, again.num_tokens(), ""), nullptr);
  // More than the pool: every context goes, and the allocation still fails cleanly.
  KVSequence huge;
  huge.prompt_token_ids = iota_tokens(40, 9000);
  kv.acquire_cached_prefix(huge);
  EXPECT_FALSE(kv.allocate_slots(huge, 40));
  EXPECT_EQ(kv.retained_stats().num_contexts, 0);
  kv.abandon_admission(huge);
  kv.free(big);
  EXPECT_EQ(kv.num_used_blocks(), 0);
}

TEST(RetainedContexts, PageLimitCountsSharedPagesOnce) {
  KVCacheManager kv(small_layout(64), false);
  kv.enable_retained_contexts(6);
  KVSequence a = prefilled(kv, iota_tokens(16, 1));  // 4 pages
  ASSERT_TRUE(kv.retain(a, 16, {}));
  // A continuation of it, 4 pages more... its first 4 are a's own.
  KVSequence b;
  b.prompt_token_ids = iota_tokens(24, 1);
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.continue_retained(b, *kv.find_retained(b, 24, ""), &copies), 16);
  ASSERT_TRUE(kv.allocate_slots(b, 24));
  ASSERT_TRUE(kv.retain(b, 24, {}));  // 6 distinct pages: both stay
  EXPECT_EQ(kv.retained_stats().num_contexts, 2);
  EXPECT_EQ(kv.retained_stats().num_pages, 6);
  // Two more pages: over the limit, released LRU-first until within it. Releasing `a` frees
  // nothing (b's context holds its pages too), so b's goes as well.
  KVSequence d = prefilled(kv, iota_tokens(8, 900));
  ASSERT_TRUE(kv.retain(d, 8, {}));
  EXPECT_EQ(kv.retained_stats().num_contexts, 1);
  EXPECT_EQ(kv.retained_stats().num_pages, 2);
  EXPECT_EQ(kv.retained_stats().num_releases, 2);
  // A context bigger than the limit is not kept at all.
  KVSequence c = prefilled(kv, iota_tokens(40, 700));
  EXPECT_FALSE(kv.retain(c, 40, {}));
  EXPECT_EQ(kv.retained_stats().num_contexts, 1);
  kv.free(d);
  kv.free(a);
  kv.free(b);
  kv.free(c);
  kv.release_all_retained();
  EXPECT_EQ(kv.num_used_blocks(), 0);
}

}  // namespace
}  // namespace origami
