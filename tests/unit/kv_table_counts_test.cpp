// A request's table counts (kv/block_table.h): each table stores a base count, and a decode step
// that needs no page adds its tokens to one number of the request (RequestKV::
// append_to_every_table) instead of to each table's count (288 tables a request with per-head
// pages). Checked against counts kept beside the manager, operation by operation (appends with and
// without new pages, counts set, compactions, prefix hits, retained contexts continued, releases
// and re-admissions, tables reported changed at any time): every count equals the kept one, a step
// within the pages held writes no table, and a change of the tables folds the appended entries
// into the bases.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_layout.h"
#include "kv/kv_sequence.h"
#include "kv/table_summary.h"

namespace origami {
namespace {

constexpr int kBlock = 4;
constexpr int kGroups = 8;

// 2 layers x 4 KV heads, one head a group (per-head pages): 8 groups in one pool of `pages`.
KVCacheManager per_head_manager(int pages, bool prefix_caching = false) {
  Expected<KVLayout> layout =
      KVLayout::grouped(2, 4, 8, kBlock, pages, DType::kF32, KVLayout::adjacent_heads(2, 4, 1));
  EXPECT_TRUE(layout.has_value()) << layout.status().message();
  KVCacheManager kv(layout.value(), prefix_caching);
  kv.set_verify_table_summaries(true);
  return kv;
}

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

std::vector<int> bases_of(const RequestKV& kv) {
  std::vector<int> b;
  for (const BlockTable& t : kv.groups) b.push_back(t.base_entries);
  return b;
}

std::vector<int> counts_of(const RequestKV& kv) {
  std::vector<int> c;
  for (size_t g = 0; g < kv.groups.size(); ++g) c.push_back(kv.num_entries(g));
  return c;
}

TEST(TableCounts, AStepWithinThePagesMovesOneNumberAndAChangeFoldsIt) {
  KVCacheManager kv = per_head_manager(65);
  KVSequence r;
  r.prompt_token_ids = tokens(5, 1);
  ASSERT_TRUE(kv.allocate_slots(r, 5));  // 2 pages a group, room 3
  EXPECT_EQ(r.kv.appended_to_every_table(), 0);
  const std::vector<int> bases = bases_of(r.kv);
  const uint64_t version = r.kv.pages_version;
  ASSERT_TRUE(kv.append_slots(r, 1));
  ASSERT_TRUE(kv.append_slots(r, 2));
  EXPECT_EQ(bases_of(r.kv), bases);  // no table written
  EXPECT_EQ(r.kv.appended_to_every_table(), 3);
  EXPECT_EQ(r.kv.pages_version, version);
  EXPECT_EQ(counts_of(r.kv), std::vector<int>(kGroups, 8));
  // A count set between two changes (a compaction of group 5) is a count, whatever was appended.
  r.kv.set_num_entries(5, 2);
  EXPECT_EQ(r.kv.num_entries(5), 2);
  r.kv.tables_changed();  // the appended entries become the bases
  EXPECT_EQ(r.kv.appended_to_every_table(), 0);
  std::vector<int> want(kGroups, 8);
  want[5] = 2;
  EXPECT_EQ(bases_of(r.kv), want);
  EXPECT_EQ(counts_of(r.kv), want);
  // A step that needs a page (every group but 5 is full) sets the counts: a change, folded too.
  ASSERT_TRUE(kv.append_slots(r, 1));
  ASSERT_TRUE(kv.append_slots(r, 1));  // within the new pages: appended again
  EXPECT_EQ(r.kv.appended_to_every_table(), 1);
  for (int& w : want) w += 2;
  EXPECT_EQ(counts_of(r.kv), want);
  kv.free(r);
  EXPECT_EQ(r.kv.appended_to_every_table(), 0);
}

// A copy of a request's tables (a retained context) counts as the request did, and a
// continuation of it counts from there.
TEST(TableCounts, ARetainedContextKeepsTheCountsAppended) {
  KVCacheManager kv = per_head_manager(200);
  kv.enable_retained_contexts(100);
  KVSequence r;
  r.prompt_token_ids = tokens(6, 1);
  ASSERT_TRUE(kv.allocate_slots(r, 6));
  ASSERT_TRUE(kv.append_slots(r, 1));
  r.output_token_ids.push_back(7);
  ASSERT_EQ(r.kv.appended_to_every_table(), 1);
  ASSERT_TRUE(kv.retain(r, 7, RetainedPolicyState{}));
  kv.free(r);
  KVSequence next;
  next.prompt_token_ids = tokens(6, 1);
  next.prompt_token_ids.push_back(7);
  next.prompt_token_ids.push_back(8);
  const RetainedContext* c = kv.find_retained(next, next.num_tokens(), "");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(counts_of(c->kv), std::vector<int>(kGroups, 7));
  std::vector<BlockCopy> copies;
  ASSERT_EQ(kv.continue_retained(next, *c, &copies), 7);
  EXPECT_EQ(counts_of(next.kv), std::vector<int>(kGroups, 7));
  ASSERT_TRUE(kv.append_slots(next, 1));
  EXPECT_EQ(counts_of(next.kv), std::vector<int>(kGroups, 8));
}

// Randomized, against counts kept beside the manager: requests admitted with and without prefix
// hits or a retained context, appended by steps and chunks, compacted to uneven counts, counts set,
// reported changed at random, released and admitted again.
TEST(TableCounts, EqualTheCountsKeptBesideAfterEveryOperation) {
  int64_t fast_appends = 0, page_appends = 0, compactions = 0, prefix_hits = 0, continued = 0, folds = 0;
  for (int seed = 0; seed < 40; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + 101);
    KVCacheManager kv = per_head_manager(200 + static_cast<int>(rng() % 200), /*prefix_caching=*/seed % 2 == 0);
    if (seed % 3 == 0) kv.enable_retained_contexts(150);
    std::vector<KVSequence> rs(4);
    std::vector<std::vector<int>> want(rs.size());  // per request, per group
    for (size_t i = 0; i < rs.size(); ++i)
      rs[i].prompt_token_ids = tokens(4 + static_cast<int>(rng() % 20), static_cast<int32_t>(i % 2) * 1000);
    for (int op = 0; op < 300; ++op) {
      const size_t i = rng() % rs.size();
      KVSequence& r = rs[i];
      std::vector<int>& w = want[i];
      const uint32_t what = rng() % 12;
      if (r.kv.groups.empty()) {
        int served = 0;
        if (kv.retained_contexts_enabled())
          if (const RetainedContext* c = kv.find_retained(r, r.num_tokens(), "")) {
            const std::vector<int> context_counts = counts_of(c->kv);
            std::vector<BlockCopy> copies;
            served = kv.continue_retained(r, *c, &copies);
            if (served > 0) {
              w = context_counts;
              ++continued;
            }
          }
        if (served == 0) {
          served = kv.acquire_cached_prefix(r);
          w.assign(kGroups, served);
          prefix_hits += served > 0 ? 1 : 0;
        }
        const int n = r.num_tokens() - served;
        if (kv.append_slots(r, n)) {
          for (int& x : w) x += n;
        } else {
          kv.abandon_admission(r);
          w.clear();
        }
      } else if (what < 6) {
        const int n = what < 5 ? 1 : 1 + static_cast<int>(rng() % 9);  // a decode step or a chunk
        const std::vector<int> bases = bases_of(r.kv);
        const bool room = r.kv.summary.room_known() && r.kv.summary.min_room >= n;
        if (kv.append_slots(r, n)) {
          for (int& x : w) x += n;
          r.output_token_ids.insert(r.output_token_ids.end(), static_cast<size_t>(n), 7);
          if (!r.kv.compacted) kv.cache_full_blocks(r, r.kv.num_entries(0));
          if (room) {
            EXPECT_EQ(bases_of(r.kv), bases) << "a step within the pages wrote a table's count";
          }
          (room ? fast_appends : page_appends) += 1;
        }
      } else if (what < 8) {
        // A compaction (the scheduler's switch to the compacted tables): each group keeps its own count.
        std::vector<BlockId> dropped;
        for (size_t g = 0; g < r.kv.groups.size(); ++g) {
          const int keep = static_cast<int>(rng() % static_cast<uint32_t>(r.kv.num_entries(g) + 1));
          BlockTable& t = r.kv.groups[g];
          const size_t pages = static_cast<size_t>((keep + kBlock - 1) / kBlock);
          dropped.insert(dropped.end(), t.blocks.begin() + static_cast<std::ptrdiff_t>(pages), t.blocks.end());
          t.blocks.resize(pages);
          r.kv.set_num_entries(g, keep);
          w[g] = keep;
        }
        r.kv.compacted = true;
        r.kv.tables_changed();
        kv.release_blocks(dropped);
        ++compactions;
      } else if (what < 9) {
        const int longest = r.kv.entries_summary().max_entries;
        if (kv.allocate_slots(r, longest)) w.assign(kGroups, longest);
      } else if (what < 10) {
        r.kv.tables_changed();  // nothing changed, but the report must leave every count as it was
        EXPECT_EQ(r.kv.appended_to_every_table(), 0);
        EXPECT_EQ(bases_of(r.kv), w);
        ++folds;
      } else {
        const int held = r.kv.num_entries(0);
        if (!r.kv.compacted && held > 0) kv.retain(r, held, RetainedPolicyState{});
        kv.free(r);
        w.clear();
        if (r.num_tokens() > 60) r.output_token_ids.clear();
        r.output_token_ids.insert(r.output_token_ids.end(), 1 + rng() % 4, 9);
      }
      ASSERT_EQ(counts_of(r.kv), w) << "seed " << seed << " op " << op;
      ASSERT_TRUE(summary_matches(r.kv.entries_summary(), r.kv, kBlock)) << "seed " << seed << " op " << op;
    }
  }
  EXPECT_GT(fast_appends, 1000);
  EXPECT_GT(page_appends, 300);
  EXPECT_GT(compactions, 300);
  EXPECT_GT(prefix_hits, 30);
  EXPECT_GT(continued, 5);
  EXPECT_GT(folds, 200);
}

}  // namespace
}  // namespace origami
