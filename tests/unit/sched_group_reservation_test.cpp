// Budget reservation per head group (TANGRAM §4.1) on a grouped layout: 2 layers x 2 groups of 2
// KV heads, sharing one pool. A `tangram` request (prefill-end compression, chunk by chunk) has
// every group's peak known at admission: its own keep plus one chunk while the prompt is
// prefilled, its keep plus the outputs afterwards. The scheduler must admit a request only when
// every group's own peak fits (not the largest group's for all of them), and then:
//   - no group of a request ever holds more blocks than it was reserved at admission;
//   - the reservations of the running requests are always covered by the free blocks (nothing is
//     over-committed), so nothing is ever preempted (nothing reclaimed);
//   - every request completes (no deadlock) and every block comes back.
// The reservation is compared with the bound written out independently below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "sched_group_harness.h"

namespace origami::testing {
namespace {

// The reservation written out: group g keeps k_g (its share of the budget) after the prompt and
// c_g (its share of the chunk count, the budget x (1 + chunk_slack)) after each chunk; while
// prefilling (no prefix cache here) it holds at most min(P, max(c_g, w) + chunk) entries, then
// min(P, k_g) + outputs, never more than the whole sequence.
int expected_reservation(const Request& r, int group, int chunk) {
  const RequestCompression& c = r.compression;
  const int keep = group_keep_of(c, group, c.budget);
  const int chunk_kept = group_keep_of(c, group, std::max(c.budget, c.chunk_threshold));
  const int p = r.num_prompt_tokens();
  const int prefill = std::min(p, std::max(chunk_kept, c.window) + chunk);
  const int decode = std::min(p, keep) + r.sampling.max_tokens;
  return std::min(blocks(p + r.sampling.max_tokens), blocks(std::max(prefill, decode)));
}

// Shares 1/4 and 1 in each layer: average 40 -> the larger groups keep 64, the smaller 16. A
// prompt of 80 tokens chunked by 16 with 40 outputs reserves per group
// blocks(max(min(80, 16 + 16), 16 + 40)) = 14 and blocks(max(min(80, 64 + 16), 64 + 40)) = 26:
// 2 x (14 + 26) = 80 pages a request, where the largest group's 26 for every group would be 104.
// With 240 usable pages three requests run at once (240), not two (208).
TEST(SchedGroupReservation, AdmitsByEachGroupsOwnBudget) {
  const std::vector<float> shares = {0.25f, 1.0f, 0.25f, 1.0f};
  GroupHarness h(241, config(8, 16));
  std::vector<Request*> rs;
  for (int i = 0; i < 5; ++i) rs.push_back(h.add(tokens(80, i), 40, tangram(40, shares, 4)));
  ASSERT_EQ(group_num_keep(rs[0]->compression, 0), 16);
  ASSERT_EQ(group_num_keep(rs[0]->compression, 1), 64);
  h.step();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(rs[0]->compression.reserved_blocks, (std::vector<int>{14, 26, 14, 26}));
  for (Request* r : rs) {
    if (r->status == RequestStatus::kRunning) {
      for (int g = 0; g < 4; ++g) EXPECT_EQ(r->compression.reserved_blocks[g], expected_reservation(*r, g, 16));
    }
  }
  h.run_to_completion();
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  EXPECT_EQ(h.peak_running, 3u);
  EXPECT_EQ(h.num_preemptions, 0);
  EXPECT_GT(h.num_chunk_compressions, 0) << "prompts must be compressed chunk by chunk";
  for (Request* r : rs) EXPECT_EQ(r->output_token_ids.size(), 40u) << r->id;
}

// A long prompt with few outputs needs a chunk's room only while it is prefilled: prompt 80,
// chunk 64, 4 outputs, keeps 16 and 64. Admission reserves per group blocks(min(80, 16 + 64)) =
// 20 and blocks(min(80, 64 + 64)) = 20, 80 pages a request; once the prompt is compressed the
// request needs blocks(16 + 4) = 5 and blocks(64 + 4) = 17, 44 pages, and the reservation shrinks
// to that. With 130 usable pages a second request is admitted while the first decodes (86 free),
// where holding the prefill reservation through decoding would run them one at a time (50 free).
TEST(SchedGroupReservation, ReservationShrinksOnceThePromptIsCompressed) {
  const std::vector<float> shares = {0.25f, 1.0f, 0.25f, 1.0f};
  for (const bool async : {false, true}) {
    GroupHarness h(131, config(8, 64));
    h.async = async;
    h.sched.set_compress_before_forward(!async);
    std::vector<Request*> rs;
    for (int i = 0; i < 4; ++i) rs.push_back(h.add(tokens(80, i), 4, tangram(40, shares, 4)));
    h.step();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_EQ(rs[0]->compression.reserved_blocks, (std::vector<int>{20, 20, 20, 20}));
    bool shrunk = false;
    while (h.sched.has_unfinished() && h.num_steps < 500) {
      h.step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "async " << async;
      shrunk = shrunk || rs[0]->compression.reserved_blocks == std::vector<int>{5, 17, 5, 17};
    }
    h.run_to_completion();
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "async " << async;
    EXPECT_TRUE(shrunk) << "async " << async;
    EXPECT_EQ(h.peak_running, 2u) << "async " << async;
    EXPECT_EQ(h.num_preemptions, 0) << "async " << async;
    for (Request* r : rs) EXPECT_EQ(r->output_token_ids.size(), 4u) << r->id;
  }
}

// Randomized tiny pools: shares, prompts, outputs, chunk sizes, sync and async compression, with
// and without prefix caching. No group ever exceeds its reservation, nothing is over-committed or
// preempted, everything drains and every block returns; reservations equal the bound above
// (without prefix caching, where no cached prefix delays a compression).
TEST(SchedGroupReservation, RandomizedPoolsNeverExceedTheReservation) {
  int64_t compressions = 0, jobs = 0, chunk_compressions = 0;
  for (int seed = 0; seed < 150; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const int chunk = 4 + static_cast<int>(rng() % 20);
    const bool prefix = seed % 3 == 0;
    SchedulerConfig sc = config(1 + static_cast<int>(rng() % 6), chunk);
    // At least one request's largest possible peak, so that a lone request always fits.
    GroupHarness h(4 * blocks(60 + 20) + 1 + static_cast<int>(rng() % 200), sc, prefix);
    h.async = seed % 2 == 1;
    h.sched.set_compress_before_forward(!h.async);
    std::vector<float> shares;
    for (int g = 0; g < 4; ++g) shares.push_back(0.1f + 0.9f * static_cast<float>(rng() % 10) / 9.0f);
    const float largest = *std::max_element(shares.begin(), shares.end());
    for (float& s : shares) s /= largest;
    std::vector<Request*> rs;
    for (int i = 0; i < 10; ++i) {
      const std::vector<int32_t> prompt = random_prompt(rng, prefix, seed * 100 + i);
      const int window = 1 + static_cast<int>(rng() % 3);
      const char* slack = (i % 3 == 0) ? "0" : (i % 3 == 1) ? "0.5" : "1";
      rs.push_back(h.add(prompt, 1 + static_cast<int>(rng() % 20),
                         tangram(window + 2 + static_cast<int>(rng() % 12), shares, window, slack)));
    }
    const bool drained = drain(h, seed, [&] {
      if (!prefix) {
        for (Request* r : h.sched.running()) {
          for (int g = 0; g < 4 && !r->compression.reserved_blocks.empty(); ++g) {
            ASSERT_LE(r->compression.reserved_blocks[static_cast<size_t>(g)], expected_reservation(*r, g, chunk))
                << "seed " << seed << " request " << r->id << " group " << g;
          }
        }
      }
    });
    if (!drained) return;
    EXPECT_EQ(h.num_preemptions, 0) << "seed " << seed;
    for (Request* r : rs) EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "seed " << seed;
    compressions += h.num_compressions;
    jobs += h.num_jobs;
    chunk_compressions += h.num_chunk_compressions;
  }
  // The runs exercise what they are meant to: chunk compressions, and groups compressed apart.
  EXPECT_GT(chunk_compressions, 200);
  EXPECT_GT(jobs, compressions);
  EXPECT_LT(jobs, 4 * compressions) << "groups within their keep must be left alone";
}

// The pages a runtime-allocated prefill-end request may hold, written out: its groups' lengths
// sum to at most the kept head-entries T = average x 8 heads after each compression, plus a chunk
// (or the outputs) per group; ceil of each group's pages adds at most one page per group; no group
// holds more than the whole sequence.
int runtime_prefill_end_bound(const Request& r, int chunk) {
  const RequestCompression& c = r.compression;
  const int groups = 4, total = c.num_keep * 8;
  const int cap = groups * blocks(r.num_prompt_tokens() + r.sampling.max_tokens);
  const int prefill = std::max(total, groups * c.window) + groups * std::min(chunk, r.num_tokens());
  const int decode = total + groups * r.sampling.max_tokens;
  return std::min(cap, (std::max(prefill, decode) + kB - 1) / kB + groups);
}

// The same for a runtime-allocated cache-full request (Fast KVzip): a compression leaves the groups
// an average of at most a = ceil(T / groups) entries; the next one comes when the rounded-up
// average reaches the level max(N_max b, (ceil(a / b) + 1) b), the groups growing together, so they
// hold at most level + 1 entries on average (the step the trigger fires in), or the prompt's chunk
// threshold (N_max b - 1) plus one chunk while it is prefilled; ceil adds a page per group.
int runtime_cache_full_bound(const Request& r, int chunk, int groups = 4) {
  const RequestCompression& c = r.compression;
  const int total = c.num_keep * 8;
  const int cap = groups * blocks(r.num_prompt_tokens() + r.sampling.max_tokens);
  const int mean_after = (total + groups - 1) / groups;
  const int level = std::max(c.max_blocks, blocks(mean_after) + 1) * kB;
  const int per_group = std::max(level + 1, c.max_blocks * kB - 1 + chunk);
  return std::min(cap, blocks(groups * per_group) + groups);
}

// Page-aligned counts with pages of one head (8 groups): a prompt within the trigger level is
// first compressed at N_max b entries a head, after which every head holds whole pages, P =
// 8 x budget pages in all (the budget a whole number of pages), and the next trigger comes once each
// has grown by N_max - budget / b pages: at most 8 x N_max pages, uniform's. Otherwise the bound above.
int runtime_page_aligned_bound(const Request& r, int chunk) {
  const RequestCompression& c = r.compression;
  const int loose = runtime_cache_full_bound(r, chunk, 8);
  if (r.num_prompt_tokens() > c.max_blocks * kB || r.num_preemptions > 0) return loose;  // recomputed: outputs prefilled too
  return std::min(loose, 8 * c.max_blocks);
}

// Every group's table of a compressed request holds exactly the pages of its entries (trimmed to
// the reported count).
void expect_trimmed(const Request& r, int seed) {
  for (size_t g = 0; g < r.kv.groups.size(); ++g) {
    if (r.compression.compressed() && !r.compression.in_flight && !r.compression.pending && !r.compression.switched_early) {
      ASSERT_EQ(static_cast<int>(r.kv.groups[g].blocks.size()), blocks(r.kv.num_entries(g))) << "seed " << seed;
    }
  }
}

// Runtime allocations (the backend chooses each group's count and reports it) on randomized tiny
// grouped pools, sync and async, with and without prefix caching: the reservation counts a bound
// the backend's choice cannot exceed, so nothing is ever preempted, no request holds more pages
// than the bounds written out above, every group is trimmed to its reported count,
// and everything drains with every block back.
TEST(SchedGroupReservation, RuntimeAllocationsNeverOverCommit) {
  int64_t compressions = 0, chunk_compressions = 0, trimmed = 0;
  for (int seed = 0; seed < 120; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + 500);
    const int chunk = 4 + static_cast<int>(rng() % 20);
    const bool prefix = seed % 3 == 0;
    const bool cache_full = seed % 4 >= 2;
    SchedulerConfig sc = config(1 + static_cast<int>(rng() % 6), chunk);
    GroupHarness h(4 * blocks(60 + 20) + 1 + static_cast<int>(rng() % 60), sc, prefix);
    h.async = seed % 2 == 1;
    h.sched.set_compress_before_forward(!h.async);
    std::vector<Request*> rs;
    for (int i = 0; i < 10; ++i) {
      const std::vector<int32_t> prompt = random_prompt(rng, prefix, seed * 100 + i);
      const int window = 1 + static_cast<int>(rng() % 3);
      const int budget = cache_full ? kB * (1 + static_cast<int>(rng() % 4)) : window + 2 + static_cast<int>(rng() % 12);
      rs.push_back(h.add(prompt, 1 + static_cast<int>(rng() % 20),
                         runtime_allocated(cache_full ? "fastkvzip" : "adakv", budget, cache_full ? 1 : window)));
    }
    const bool drained = drain(h, seed, [&] {
      for (Request* r : h.sched.running()) {
        expect_trimmed(*r, seed);
        if (::testing::Test::HasFatalFailure()) return;
        if (!prefix) {
          ASSERT_LE(h.kv.num_held_blocks(*r),
                    cache_full ? runtime_cache_full_bound(*r, chunk) : runtime_prefill_end_bound(*r, chunk))
              << "seed " << seed << " request " << r->id;
        }
      }
    });
    if (!drained) return;
    EXPECT_EQ(h.num_preemptions, 0) << "seed " << seed;
    for (Request* r : rs) {
      EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "seed " << seed;
      trimmed += r->compression.compressed() ? 1 : 0;
    }
    compressions += h.num_compressions;
    chunk_compressions += h.num_chunk_compressions;
  }
  EXPECT_GT(compressions, 300);
  EXPECT_GT(chunk_compressions, 100);
  EXPECT_GT(trimmed, 300);
}

// Page-aligned runtime counts (Fast KVzip, allocation global, page_aligned) on per-head pages,
// randomized as above: the reservation is uniform's 8 x N_max pages for prompts within the trigger
// level, so nothing is preempted, no request holds more than the bound written out above, every
// group holds exactly its reported count's pages, and everything drains.
TEST(SchedGroupReservation, PageAlignedRuntimeAllocationsNeverOverCommit) {
  int64_t compressions = 0, tight = 0;
  for (int seed = 0; seed < 120; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed) + 900);
    const int chunk = 4 + static_cast<int>(rng() % 20);
    const bool prefix = seed % 3 == 0;
    SchedulerConfig sc = config(1 + static_cast<int>(rng() % 6), chunk);
    // Pools of a few requests' peaks (a lone request needs at most 8 x blocks(24 + 40) = 128 pages
    // and reserves at most 8 x (max(N_max 5 x 4, 24 + chunk) + 1) / 4 + 8), so reservations matter.
    GroupHarness h(130 + static_cast<int>(rng() % 100), sc, prefix, /*heads_per_group=*/1);
    h.async = seed % 2 == 1;
    h.sched.set_compress_before_forward(!h.async);
    std::vector<Request*> rs;
    for (int i = 0; i < 10; ++i) {
      const int budget = kB * (1 + static_cast<int>(rng() % 4));
      std::vector<int32_t> prompt = random_prompt(rng, prefix, seed * 100 + i);
      // Most prompts within the trigger level (N_max b = budget + b), some beyond it.
      prompt.resize(std::min(prompt.size(), static_cast<size_t>(rng() % 4 != 0 ? budget + kB : 24)));
      rs.push_back(h.add(prompt, 1 + static_cast<int>(rng() % 40), runtime_allocated("fastkvzip", budget, 1, true)));
    }
    const bool drained = drain(h, seed, [&] {
      for (Request* r : h.sched.running()) {
        expect_trimmed(*r, seed);
        if (::testing::Test::HasFatalFailure()) return;
        if (!prefix) {
          const int bound = runtime_page_aligned_bound(*r, chunk);
          ASSERT_LE(h.kv.num_held_blocks(*r), bound) << "seed " << seed << " request " << r->id;
          tight += bound < runtime_cache_full_bound(*r, chunk, 8) && r->compression.compressed() ? 1 : 0;
        }
      }
    });
    if (!drained) return;
    EXPECT_EQ(h.num_preemptions, 0) << "seed " << seed;
    for (Request* r : rs) EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "seed " << seed;
    compressions += h.num_compressions;
  }
  EXPECT_GT(compressions, 300);
  EXPECT_GT(tight, 1000);  // steps of compressed requests under the tighter bound
}

}  // namespace
}  // namespace origami::testing
