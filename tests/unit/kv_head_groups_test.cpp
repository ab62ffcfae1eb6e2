// Ragged head-group paging (TANGRAM §4.2): the grouped layout's helpers and errors, and the KV
// cache manager over one shared pool: allocation all-or-nothing across a request's groups, pages
// one group frees reused by another, per-group lengths, and prefix-cache hits per group.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_layout.h"
#include "kv/kv_sequence.h"

namespace origami {
namespace {

constexpr int kBlock = 4;

// 2 layers x 4 KV heads, 2 heads per group: 4 groups, `pages` pages (null page included).
KVLayout grouped_layout(int pages, int heads_per_group = 2) {
  Expected<KVLayout> layout = KVLayout::grouped(2, 4, 8, kBlock, pages, DType::kF32,
                                                KVLayout::adjacent_heads(2, 4, heads_per_group));
  EXPECT_TRUE(layout.has_value()) << layout.status().message();
  return layout.value();
}

KVSequence make_request(std::vector<int32_t> prompt) {
  KVSequence r;
  r.prompt_token_ids = std::move(prompt);
  return r;
}

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST(KVHeadGroups, AdjacentLayoutHelpers) {
  const KVLayout layout = grouped_layout(33);
  EXPECT_TRUE(layout.shared_pool);
  ASSERT_EQ(layout.num_groups(), 4);
  EXPECT_EQ(layout.heads_per_group(), 2);
  EXPECT_EQ(layout.groups[0].layers, (std::vector<int>{0}));
  EXPECT_EQ(layout.groups[0].kv_heads, (std::vector<int>{0, 1}));
  EXPECT_EQ(layout.groups[3].layers, (std::vector<int>{1}));
  EXPECT_EQ(layout.groups[3].kv_heads, (std::vector<int>{2, 3}));
  for (const HeadGroup& g : layout.groups) EXPECT_EQ(g.num_blocks, 33);
  // (layer, head) -> group and slot.
  EXPECT_EQ(layout.group_of(0, 0).group, 0);
  EXPECT_EQ(layout.group_of(0, 3).group, 1);
  EXPECT_EQ(layout.group_of(0, 3).slot, 1);
  EXPECT_EQ(layout.group_of(1, 2).group, 3);
  EXPECT_EQ(layout.group_of(1, 2).slot, 0);
  EXPECT_EQ(layout.group_of(2, 0).group, -1);  // no such layer
  // A group page: K and V of 2 heads x 4 tokens x 8 dims, fp32; a full block spans 4 of them.
  EXPECT_EQ(layout.page_bytes(0), size_t{2 * 2 * 4 * 8 * 4});
  EXPECT_EQ(layout.groups_per_full_block(), 4);
  EXPECT_EQ(KVLayout::full(2, 4, 8, kBlock, 9, DType::kF32).page_bytes(0), 4 * layout.page_bytes(0));
}

TEST(KVHeadGroups, ClusteredHeadListsKeepTheirOrder) {
  // Budget-aware clustering hands non-adjacent heads; slots follow the order given.
  Expected<KVLayout> layout = KVLayout::grouped(1, 4, 8, kBlock, 9, DType::kF32, {{{3, 0}, {2, 1}}});
  ASSERT_TRUE(layout.has_value()) << layout.status().message();
  EXPECT_EQ(layout.value().group_of(0, 3).group, 0);
  EXPECT_EQ(layout.value().group_of(0, 3).slot, 0);
  EXPECT_EQ(layout.value().group_of(0, 0).slot, 1);
  EXPECT_EQ(layout.value().group_of(0, 1).group, 1);
  EXPECT_EQ(layout.value().group_of(0, 1).slot, 1);
}

TEST(KVHeadGroups, BadHeadListsAreRejectedWithTheReason) {
  auto error = [](const std::vector<std::vector<std::vector<int>>>& heads) {
    Expected<KVLayout> l = KVLayout::grouped(2, 4, 8, kBlock, 9, DType::kF32, heads);
    EXPECT_FALSE(l.has_value());
    return l.has_value() ? std::string() : l.status().message();
  };
  EXPECT_NE(error({{{0, 1, 2, 3}}}).find("expected the groups of 2 layers"), std::string::npos);
  EXPECT_NE(error({{{0, 1}, {2, 3}}, {{0, 1, 2}, {3}}}).find("same number of heads"), std::string::npos);
  EXPECT_NE(error({{{0, 1}, {1, 3}}, {{0, 1}, {2, 3}}}).find("lists KV head 1 twice"), std::string::npos);
  EXPECT_NE(error({{{0, 1}, {2, 7}}, {{0, 1}, {2, 3}}}).find("names KV head 7"), std::string::npos);
  EXPECT_NE(error({{{0, 1}}, {{0, 1}, {2, 3}}}).find("leaves KV head 2 in no group"), std::string::npos);
}

TEST(KVHeadGroups, OneSharedPoolServesEveryGroup) {
  KVCacheManager kv(grouped_layout(17), false);  // 16 usable pages
  EXPECT_EQ(kv.num_groups(), 4);
  EXPECT_EQ(kv.num_usable_blocks(), 4);  // per group, split evenly
  KVSequence a = make_request(iota_tokens(8, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));  // 2 pages in each of 4 groups
  ASSERT_EQ(a.kv.groups.size(), 4u);
  std::set<BlockId> distinct;
  for (size_t g = 0; g < a.kv.groups.size(); ++g) {
    const BlockTable& t = a.kv.groups[g];
    EXPECT_EQ(t.blocks.size(), 2u);
    EXPECT_EQ(a.kv.num_entries(g), 8);
    distinct.insert(t.blocks.begin(), t.blocks.end());
  }
  EXPECT_EQ(distinct.size(), 8u);  // no page is handed to two groups
  EXPECT_EQ(kv.num_used_blocks(), 8);
  EXPECT_EQ(kv.total_used_blocks(), 8);
  EXPECT_EQ(kv.num_held_blocks(a), 8);
  EXPECT_EQ(kv.num_free_blocks(3), 8);  // the same pool whichever group asks
}

TEST(KVHeadGroups, AllocationIsAllOrNothingAcrossGroups) {
  KVCacheManager kv(grouped_layout(11), false);  // 10 usable pages
  KVSequence a = make_request(iota_tokens(12, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));  // 8 pages
  const RequestKV before = a.kv;
  // One more token needs a page in each of the 4 groups; only 2 are free: nothing changes.
  EXPECT_EQ(kv.blocks_to_append(a, 1), 4);
  EXPECT_FALSE(kv.append_slots(a, 1));
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ(a.kv.groups[g].blocks, before.groups[g].blocks);
    EXPECT_EQ(a.kv.num_entries(g), 8);
  }
  EXPECT_EQ(kv.num_free_blocks(), 2);
}

TEST(KVHeadGroups, GroupsGrowFromTheirOwnLengths) {
  KVCacheManager kv(grouped_layout(33), false);
  KVSequence a = make_request(iota_tokens(20, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));
  // As after a compression that kept 2 entries in group 1 and dropped its second page.
  kv.release_blocks(std::vector<BlockId>{a.kv.groups[1].blocks[1]}, 1);
  a.kv.groups[1].blocks.resize(1);
  a.kv.set_num_entries(1, 2);
  a.kv.tables_changed();  // as whoever changes a table tells its RequestKV (its summary is gone)
  // Groups 0, 2, 3 need a third page (11 entries); group 1 a second one (5 entries).
  EXPECT_EQ(kv.blocks_to_append(a, 3), 4);
  ASSERT_TRUE(kv.append_slots(a, 3));
  EXPECT_EQ(a.kv.num_entries(0), 11);
  EXPECT_EQ(a.kv.num_entries(1), 5);
  EXPECT_EQ(a.kv.groups[1].blocks.size(), 2u);
  EXPECT_EQ(a.kv.groups[2].blocks.size(), 3u);
  EXPECT_EQ(kv.num_held_blocks(a), 11);
}

// Leading groups with room in their last page and a later one that needs a page (per-head pages
// after a joint compaction): each group grows once, and when the page is not there every count
// is as before.
TEST(KVHeadGroups, ALaterGroupThatNeedsAPageGrowsEveryGroupOnceOrNone) {
  KVCacheManager kv(grouped_layout(11), false);  // 10 usable pages
  KVSequence a = make_request(iota_tokens(20, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 6));  // 2 pages per group, 8 in all
  a.kv.set_num_entries(2, 8);        // group 2's pages are full
  a.kv.tables_changed();
  EXPECT_EQ(kv.blocks_to_append(a, 1), 1);
  ASSERT_TRUE(kv.append_slots(a, 1));
  EXPECT_EQ(a.kv.num_entries(0), 7);
  EXPECT_EQ(a.kv.num_entries(1), 7);
  EXPECT_EQ(a.kv.num_entries(2), 9);
  EXPECT_EQ(a.kv.groups[2].blocks.size(), 3u);
  EXPECT_EQ(a.kv.num_entries(3), 7);
  EXPECT_EQ(kv.num_free_blocks(), 1);

  // Group 3 full as well, group 1 now too: 2 pages needed, 1 free; nothing moves.
  a.kv.set_num_entries(1, 8);
  a.kv.set_num_entries(3, 8);
  a.kv.tables_changed();
  const RequestKV before = a.kv;
  EXPECT_EQ(kv.blocks_to_append(a, 1), 2);
  EXPECT_FALSE(kv.append_slots(a, 1));
  for (size_t g = 0; g < 4; ++g) {
    EXPECT_EQ(a.kv.groups[g].blocks, before.groups[g].blocks);
    EXPECT_EQ(a.kv.num_entries(g), before.num_entries(g)) << "group " << g;
  }
  EXPECT_EQ(kv.num_free_blocks(), 1);
}

TEST(KVHeadGroups, PagesFreedByOneGroupServeAnother) {
  KVCacheManager kv(grouped_layout(9), false);  // 8 usable pages
  KVSequence a = make_request(iota_tokens(8, 0));
  ASSERT_TRUE(kv.allocate_slots(a, 8));  // all 8 pages
  EXPECT_EQ(kv.num_free_blocks(), 0);
  // Group 2 gives up a page (its budget is smaller) ...
  const BlockId freed = a.kv.groups[2].blocks.back();
  a.kv.groups[2].blocks.pop_back();
  a.kv.set_num_entries(2, 4);
  a.kv.tables_changed();
  kv.release_blocks(std::vector<BlockId>{freed}, 2);
  // ... and another request's group 0 gets it.
  KVSequence b = make_request(iota_tokens(4, 100));
  b.kv.groups.resize(4);
  EXPECT_FALSE(kv.allocate_slots(b, 1));  // a page in each of its 4 groups: only 1 free
  std::vector<BlockId> got;
  ASSERT_TRUE(kv.allocate_blocks(1, &got, 0));
  EXPECT_EQ(got, (std::vector<BlockId>{freed}));
}

TEST(KVHeadGroups, PrefixHitsArePerGroup) {
  KVCacheManager kv(grouped_layout(33), true);
  KVSequence a = make_request(iota_tokens(9, 0));
  kv.acquire_cached_prefix(a);
  ASSERT_TRUE(kv.allocate_slots(a, 9));
  kv.cache_full_blocks(a, 9);
  const RequestKV held = a.kv;
  kv.free(a);
  KVSequence b = make_request(iota_tokens(10, 0));
  EXPECT_EQ(kv.acquire_cached_prefix(b), 8);
  // Every group finds its own blocks again (same tokens, a chain keyed by its group).
  for (size_t g = 0; g < 4; ++g) {
    ASSERT_EQ(b.kv.groups[g].blocks.size(), 2u);
    EXPECT_EQ(b.kv.groups[g].blocks[0], held.groups[g].blocks[0]) << "group " << g;
    EXPECT_EQ(b.kv.groups[g].blocks[1], held.groups[g].blocks[1]) << "group " << g;
    EXPECT_EQ(b.kv.num_entries(g), 8);
  }
  kv.free(b);
  // Under a degenerate hash (every block collides) a group still never gets another group's
  // page: the chain's root entry differs per group.
  KVCacheManager collide(grouped_layout(33), true);
  collide.set_block_hasher_for_testing([](uint64_t, std::span<const int32_t>) { return uint64_t{42}; });
  KVSequence c = make_request(iota_tokens(9, 0));
  collide.acquire_cached_prefix(c);
  ASSERT_TRUE(collide.allocate_slots(c, 9));
  collide.cache_full_blocks(c, 9);
  const RequestKV c_held = c.kv;
  collide.free(c);
  KVSequence d = make_request(iota_tokens(9, 0));
  const int hit = collide.acquire_cached_prefix(d);
  for (size_t g = 0; g < 4; ++g)
    for (size_t i = 0; i < d.kv.groups[g].blocks.size(); ++i)
      EXPECT_EQ(d.kv.groups[g].blocks[i], c_held.groups[g].blocks[i]) << "group " << g << " block " << i;
  EXPECT_LE(hit, 8);
}

TEST(KVHeadGroups, UniformGroupsUseTheSameMemoryAsTheFullLayout) {
  // The same memory as 10 full blocks: 40 pages of 4 groups. A request of 4 blocks takes 16.
  KVCacheManager full(KVLayout::full(2, 4, 8, kBlock, 11, DType::kF32), false);
  KVCacheManager grouped(grouped_layout(41), false);
  EXPECT_EQ(full.num_usable_blocks(), grouped.num_usable_blocks());
  KVSequence a = make_request(iota_tokens(16, 0)), b = make_request(iota_tokens(16, 0));
  ASSERT_TRUE(full.allocate_slots(a, 16));
  ASSERT_TRUE(grouped.allocate_slots(b, 16));
  EXPECT_EQ(grouped.total_used_blocks(), 4 * full.total_used_blocks());
  EXPECT_EQ(full.blocks_needed(16), grouped.blocks_needed(16));
}

}  // namespace
}  // namespace origami
