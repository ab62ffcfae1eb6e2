// The scheduler reads a request's entries (num_cache_entries, lead_group) and room from its table
// summary (RequestKV::summary) instead of walking its head groups' tables every step. Here the
// scheduler runs per-head and grouped layouts on small pools with nothing reserved, so that
// requests are preempted, compacted (uniform, non-uniform group budgets, and counts the backend
// chooses per group), hit the prefix cache and take new pages, synchronously and with compressions
// reported a step later; after every schedule() and update_from_output() each request's summary
// must equal a walk over its tables, and the counts read from it the counts written out from the
// tables. The KV manager checks the summary on every append as well (set_verify_table_summaries).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "kv/table_summary.h"
#include "sched_compression_harness.h"
#include "sched_group_harness.h"

namespace origami::testing {
namespace {

// The counts written out from the tables.
int walked_lead_group(const Request& r) {
  int lead = 0;
  for (size_t g = 1; g < r.kv.groups.size(); ++g)
    if (r.kv.num_entries(g) > r.kv.num_entries(static_cast<size_t>(lead))) lead = static_cast<int>(g);
  return lead;
}
int walked_cache_entries(const Request& r) {
  if (r.kv.groups.empty()) return 0;
  if (!r.compression.runtime_allocated()) return r.kv.num_entries(static_cast<size_t>(walked_lead_group(r)));
  int64_t sum = 0;
  for (size_t g = 0; g < r.kv.groups.size(); ++g) sum += r.kv.num_entries(g);
  const int64_t n = static_cast<int64_t>(r.kv.groups.size());
  return static_cast<int>((sum + n - 1) / n);
}

TEST(SchedTableSummary, EqualsAWalkThroughPreemptionsCompactionsAndPrefixHits) {
  int64_t preemptions = 0, compressions = 0, checked = 0;
  for (int seed = 0; seed < 80; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + 3);
    const bool prefix = seed % 3 == 0;
    const bool per_head = seed % 2 == 0;
    const int groups = per_head ? 8 : 4;
    SchedulerConfig sc = config(2 + static_cast<int>(rng() % 6), 4 + static_cast<int>(rng() % 20));
    sc.reserve_bounded_kv = false;  // admitted on their prompts' pages: the pool runs out, requests are preempted
    // A lone request always fits (60 + 20 tokens); a few at once do not.
    GroupHarness h(groups * (blocks(60 + 20) + static_cast<int>(rng() % 20)) + 1, sc, prefix, per_head ? 1 : 2);
    h.kv.set_verify_table_summaries(true);
    h.check_reserved = false;
    h.async = seed % 4 >= 2;
    h.sched.set_compress_before_forward(!h.async);
    h.after_each_change = [&](const SchedulerOutput& plan, const char* after) {
      std::vector<Request*> live = h.sched.running();
      live.insert(live.end(), h.sched.compressing().begin(), h.sched.compressing().end());
      for (Request* r : live) {
        ASSERT_TRUE(summary_matches(r->kv.summary, r->kv, kB)) << "request " << r->id << " after " << after;
        ASSERT_EQ(num_cache_entries(*r), walked_cache_entries(*r)) << "request " << r->id << " after " << after;
        ASSERT_EQ(lead_group(*r), walked_lead_group(*r)) << "request " << r->id << " after " << after;
        ++checked;
      }
      // A step's appends keep the summary: nothing is left for the next reader to walk.
      for (const ScheduledSequence& s : plan.sequences) {
        if (s.request->status != RequestStatus::kRunning || s.request->kv.groups.empty()) continue;
        ASSERT_TRUE(s.request->kv.summary.entries_known() && s.request->kv.summary.room_known())
            << "request " << s.request->id << " after " << after;
      }
    };
    for (int i = 0; i < 10; ++i) {
      const int budget = kB * (1 + static_cast<int>(rng() % 3));
      RequestCompression c;
      switch (rng() % 4) {
        // Per-head pages take page-aligned counts (the fake backend's joint choice for them).
        case 0: c = runtime_allocated("fastkvzip", budget, 1, per_head); break;
        case 1: c = make_compression("knorm", budget, kB, {{"window", "1"}, {"sinks", "0"}}); break;
        case 2: c = per_head ? make_compression("full", 0, kB) : tangram(budget + 2, {0.25f, 1.0f, 1.0f, 0.5f}, 1); break;
        default: c = make_compression("full", 0, kB); break;
      }
      std::vector<int32_t> prompt = random_prompt(rng, prefix, seed * 100 + i);
      h.add(std::move(prompt), 1 + static_cast<int>(rng() % 20), std::move(c));
    }
    h.run_to_completion();
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
    preemptions += h.num_preemptions;
    compressions += h.num_compressions;
  }
  EXPECT_GT(preemptions, 100);
  EXPECT_GT(compressions, 300);
  EXPECT_GT(checked, 20000);
}

}  // namespace
}  // namespace origami::testing
