// A request's table summary (RequestKV::summary, kv/table_summary.h): the entries over its tables,
// the longest and the room left in their pages, kept so that a step need not walk every table
// (288 a request with per-head pages). Checked against a walk over the tables after every
// operation of the KV manager that changes them (appends with and without new pages, counts set,
// compactions that trim groups to different counts, prefix hits, retained contexts continued,
// releases and re-admissions), and the manager's own check (set_verify_table_summaries) on every
// append; a step's append within the pages held must keep the summary known and the page version
// as it was.
#include <gtest/gtest.h>

#include <algorithm>
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

// 2 layers x 4 KV heads, one head a group (per-head pages): 8 groups in one pool of `pages`.
KVLayout per_head_layout(int pages) {
  Expected<KVLayout> layout =
      KVLayout::grouped(2, 4, 8, kBlock, pages, DType::kF32, KVLayout::adjacent_heads(2, 4, 1));
  EXPECT_TRUE(layout.has_value()) << layout.status().message();
  return layout.value();
}

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A manager over per-head pages that checks every request's summary on each append.
KVCacheManager verifying_manager(int pages, bool prefix_caching = false) {
  KVCacheManager kv(per_head_layout(pages), prefix_caching);
  kv.set_verify_table_summaries(true);
  return kv;
}

// A request whose every table holds `entries` entries (a prefilled prompt).
KVSequence prefilled(KVCacheManager& kv, int entries) {
  KVSequence r;
  r.prompt_token_ids = tokens(entries, 1);
  EXPECT_TRUE(kv.allocate_slots(r, entries));
  return r;
}

// The summary written out: every part it knows equals the walk; sum, longest and lead always known
// once asked for.
void expect_summary_of_tables(const KVSequence& r, const char* after) {
  const TableSummary& kept = r.kv.summary;
  EXPECT_TRUE(summary_matches(kept, r.kv, kBlock)) << "after " << after;
  int64_t sum = 0, pages = 0;
  int longest = 0, lead = 0;
  int64_t room = r.kv.groups.empty() ? 0 : INT64_MAX;
  for (size_t g = 0; g < r.kv.groups.size(); ++g) {
    const int entries = r.kv.num_entries(g);
    sum += entries;
    pages += static_cast<int64_t>(r.kv.groups[g].blocks.size());
    if (entries > longest) {
      longest = entries;
      lead = static_cast<int>(g);
    }
    room = std::min(room, static_cast<int64_t>(r.kv.groups[g].blocks.size()) * kBlock - entries);
  }
  if (kept.room_known()) {
    EXPECT_EQ(kept.min_room, room) << "after " << after;
  }
  const TableSummary& entries = r.kv.entries_summary();
  EXPECT_EQ(entries.entries_sum, sum) << "after " << after;
  EXPECT_EQ(entries.max_entries, longest) << "after " << after;
  EXPECT_EQ(entries.lead_table, lead) << "after " << after;
  EXPECT_EQ(entries.pages, pages) << "after " << after;
}

// What a compaction does to the tables (the scheduler's switch to the compacted table): each group
// keeps its own count, the pages past it go back, and the tables are reported changed.
void compact(KVCacheManager& kv, KVSequence& r, std::mt19937& rng) {
  std::vector<BlockId> dropped;
  for (size_t g = 0; g < r.kv.groups.size(); ++g) {
    BlockTable& t = r.kv.groups[g];
    const int keep = static_cast<int>(rng() % static_cast<uint32_t>(r.kv.num_entries(g) + 1));
    const size_t pages = static_cast<size_t>((keep + kBlock - 1) / kBlock);
    dropped.insert(dropped.end(), t.blocks.begin() + static_cast<std::ptrdiff_t>(pages), t.blocks.end());
    t.blocks.resize(pages);
    r.kv.set_num_entries(g, keep);
  }
  r.kv.compacted = true;
  r.kv.tables_changed();
  kv.release_blocks(dropped);
}

TEST(TableSummary, AStepWithinThePagesHeldKeepsItWithoutAWalk) {
  KVCacheManager kv = verifying_manager(65);
  KVSequence r = prefilled(kv, 6);  // 2 pages a group, room 2
  ASSERT_TRUE(r.kv.summary.room_known());
  EXPECT_EQ(r.kv.summary.min_room, 2);
  const uint64_t version = r.kv.pages_version;
  ASSERT_TRUE(kv.append_slots(r, 1));
  ASSERT_TRUE(kv.append_slots(r, 1));
  EXPECT_EQ(r.kv.pages_version, version);  // no page added: the backend's copies stand
  EXPECT_TRUE(r.kv.summary.room_known() && r.kv.summary.entries_known());
  EXPECT_EQ(r.kv.summary.min_room, 0);
  EXPECT_EQ(r.kv.summary.entries_sum, 8 * 8);
  EXPECT_EQ(kv.blocks_to_append(r, 1), 8);  // every group needs its third page
  expect_summary_of_tables(r, "two appends");
  ASSERT_TRUE(kv.append_slots(r, 1));  // the pages come, the version moves, the summary is taken again
  EXPECT_NE(r.kv.pages_version, version);
  EXPECT_TRUE(r.kv.summary.room_known());
  EXPECT_EQ(r.kv.summary.min_room, 3);
  expect_summary_of_tables(r, "a new page");
}

// Groups of different lengths (after a compaction): the room is the fullest group's, the lead the
// first longest, and a step that only the fullest group cannot take adds its page alone.
TEST(TableSummary, UnevenGroupsAfterACompaction) {
  KVCacheManager kv = verifying_manager(65);
  KVSequence r = prefilled(kv, 12);
  std::vector<BlockId> dropped;
  const int keep[8] = {5, 12, 3, 12, 8, 1, 7, 4};
  for (size_t g = 0; g < 8; ++g) {
    BlockTable& t = r.kv.groups[g];
    const size_t pages = static_cast<size_t>((keep[g] + kBlock - 1) / kBlock);
    dropped.insert(dropped.end(), t.blocks.begin() + static_cast<std::ptrdiff_t>(pages), t.blocks.end());
    t.blocks.resize(pages);
    r.kv.set_num_entries(g, keep[g]);
  }
  r.kv.tables_changed();
  kv.release_blocks(dropped);
  EXPECT_FALSE(r.kv.summary.room_known());
  EXPECT_EQ(r.kv.entries_summary().lead_table, 1);
  EXPECT_EQ(r.kv.entries_summary().max_entries, 12);
  EXPECT_EQ(r.kv.entries_summary().entries_sum, 52);
  EXPECT_EQ(kv.num_held_blocks(r), 2 + 3 + 1 + 3 + 2 + 1 + 2 + 1);  // pages of 4: the kept counts' pages
  EXPECT_EQ(kv.blocks_to_append(r, 1), 4);  // groups 1, 3, 4 and 7 are full; not known: walked
  ASSERT_TRUE(kv.append_slots(r, 1));
  expect_summary_of_tables(r, "the step after a compaction");
  EXPECT_EQ(r.kv.summary.min_room, 0);  // group 2 holds 4 entries in its one page
}

// Randomized: requests admitted with and without prefix hits, appended by steps and chunks,
// compacted, released and admitted again (a preemption), some continuing a retained context; after
// every operation the summary equals a walk over the tables.
TEST(TableSummary, EqualsAWalkAfterEveryOperation) {
  int64_t fast_appends = 0, page_appends = 0, compactions = 0, prefix_hits = 0, continued = 0, readmitted = 0;
  for (int seed = 0; seed < 60; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + 11);
    const bool prefix_caching = seed % 2 == 0;
    KVCacheManager kv = verifying_manager(200 + static_cast<int>(rng() % 200), prefix_caching);
    if (seed % 3 == 0) kv.enable_retained_contexts(150);
    std::vector<KVSequence> rs(4);
    for (size_t i = 0; i < rs.size(); ++i)
      rs[i].prompt_token_ids = tokens(4 + static_cast<int>(rng() % 20), static_cast<int32_t>(i % 2) * 1000);
    for (int op = 0; op < 300; ++op) {
      KVSequence& r = rs[rng() % rs.size()];
      const uint32_t what = rng() % 10;
      if (r.kv.groups.empty()) {
        // Admission: a retained context, else the prefix cache, then the prompt's slots.
        int served = 0;
        if (kv.retained_contexts_enabled())
          if (const RetainedContext* c = kv.find_retained(r, r.num_tokens(), "")) {
            std::vector<BlockCopy> copies;
            served = kv.continue_retained(r, *c, &copies);
            continued += served > 0 ? 1 : 0;
          }
        if (served == 0) served = kv.acquire_cached_prefix(r);
        prefix_hits += served > 0 ? 1 : 0;
        expect_summary_of_tables(r, "an admission");
        if (!kv.append_slots(r, r.num_tokens() - served)) kv.abandon_admission(r);
        expect_summary_of_tables(r, "the prompt's slots");
        continue;
      }
      if (what < 5) {
        const int n = what < 4 ? 1 : 1 + static_cast<int>(rng() % 9);  // a decode step or a chunk
        const uint64_t version = r.kv.pages_version;
        const bool room = r.kv.summary.room_known() && r.kv.summary.min_room >= n;
        if (kv.append_slots(r, n)) {
          r.output_token_ids.insert(r.output_token_ids.end(), static_cast<size_t>(n), 7);
          if (!r.kv.compacted) kv.cache_full_blocks(r, r.kv.num_entries(0));
          (room ? fast_appends : page_appends) += 1;
          if (room) {
            EXPECT_EQ(r.kv.pages_version, version) << "seed " << seed;
          }
        }
        expect_summary_of_tables(r, "an append");
      } else if (what < 7) {
        compact(kv, r, rng);
        ++compactions;
        expect_summary_of_tables(r, "a compaction");
      } else if (what < 8) {
        kv.allocate_slots(r, r.kv.entries_summary().max_entries);  // every count set to the longest
        expect_summary_of_tables(r, "counts set");
      } else {
        // Finished (its tables kept as a context) or preempted: tables released, admitted later
        // with a few more tokens (the next turn of a conversation, which may continue the context),
        // or as a new conversation once long.
        const int held = r.kv.num_entries(0);
        if (!r.kv.compacted && held > 0) kv.retain(r, held, RetainedPolicyState{});
        kv.free(r);
        EXPECT_TRUE(r.kv.groups.empty());
        EXPECT_FALSE(r.kv.summary.entries_known() || r.kv.summary.room_known());
        if (r.num_tokens() > 60) r.output_token_ids.clear();
        r.output_token_ids.insert(r.output_token_ids.end(), 1 + rng() % 4, 9);
        ++readmitted;
      }
      if (::testing::Test::HasFailure()) {
        ADD_FAILURE() << "seed " << seed << " op " << op;
        return;
      }
    }
  }
  EXPECT_GT(fast_appends, 2000);
  EXPECT_GT(page_appends, 500);
  EXPECT_GT(compactions, 1000);
  EXPECT_GT(prefix_hits, 50);
  EXPECT_GT(continued, 5);
  EXPECT_GT(readmitted, 500);
}

// A table changed by hand without tables_changed(): the manager's check finds the stale summary.
TEST(TableSummaryDeathTest, AChangeNotReportedFailsTheCheck) {
  KVCacheManager kv = verifying_manager(65);
  KVSequence r = prefilled(kv, 6);
  r.kv.set_num_entries(3, 8);  // its pages are full now; the summary still says room 2
  EXPECT_DEATH(kv.append_slots(r, 1), "table summary differs from a walk over its tables");
}

}  // namespace
}  // namespace origami
