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
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "policy/kv_budget.h"
#include "policy/policy_registry.h"
#include "sched/compression_state.h"
#include "sched/scheduler.h"
#include "sched_fake_model.h"

namespace origami::testing {
namespace {

constexpr int kB = 4;  // block size

// 2 layers, 4 KV heads, groups {0,1} {2,3} per layer: 4 groups sharing `num_pages` pages (or
// groups of `heads_per_group` heads).
KVLayout grouped_layout(int num_pages, int heads_per_group = 2) {
  auto layout = KVLayout::grouped(2, 4, 4, kB, num_pages, DType::kF32, KVLayout::adjacent_heads(2, 4, heads_per_group));
  EXPECT_TRUE(layout.has_value()) << layout.status().to_string();
  return *layout;
}

// A tangram request as the engine's resolver builds it: the budget is the average per head, the
// group keeping most keeps lead_budget_for_average() of it, each group its share.
// `slack`: chunk_slack (each chunk keeps the budget x (1 + slack), the prompt's end the budget).
RequestCompression tangram(int average, const std::vector<float>& shares, int window, const std::string& slack = "0") {
  auto p = PolicyRegistry::builtin().create("tangram",
                                            {{"window", std::to_string(window)}, {"kernel", "1"}, {"chunk_slack", slack}});
  EXPECT_TRUE(p.has_value()) << p.status().to_string();
  RequestCompression c;
  c.policy = *p;
  c.trigger = c.policy->trigger();
  c.window = window;
  c.group_ratios = shares;
  c.budget = lead_budget_for_average(average, shares);
  c.num_keep = c.budget;
  c.chunk_threshold = c.policy->prefill_chunk_threshold(c.budget, 0, kB);
  EXPECT_GE(c.chunk_threshold, 0);
  return c;
}

int blocks(int entries) { return (entries + kB - 1) / kB; }

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

struct GroupHarness {
  KVCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> requests;
  std::vector<Request*> in_flight;
  bool async = false;  // compressions reported one step after they start
  int num_steps = 0;
  int64_t num_preemptions = 0, num_compressions = 0, num_jobs = 0, num_chunk_compressions = 0;
  size_t peak_running = 0;

  GroupHarness(int num_pages, SchedulerConfig config, bool prefix_caching = false, int heads_per_group = 2)
      : kv(grouped_layout(num_pages, heads_per_group), prefix_caching), sched(config, &kv) {}

  Request* add(std::vector<int32_t> prompt, int max_tokens, RequestCompression c) {
    auto r = std::make_unique<Request>();
    r->id = requests.size() + 1;
    r->prompt_token_ids = std::move(prompt);
    r->sampling.max_tokens = max_tokens;
    r->compression = std::move(c);
    sched.add_request(r.get());
    requests.push_back(std::move(r));
    return requests.back().get();
  }

  std::mt19937 kept_rng{17};
  // One result per compressed group's job. Under a runtime allocation each group reports a count
  // as a backend would choose it: every head h of the layout (2 per group here) keeps c_h entries,
  // random, summing to the request's average keep x heads, at most its group's entries; a group
  // keeps its heads' largest count.
  std::vector<CompressionResult> results(const std::vector<Request*>& rs) {
    std::vector<CompressionResult> done;
    for (Request* r : rs) {
      const RequestCompression& c = r->compression;
      if (!c.runtime_allocated()) {
        for (int j = 0; j < c.jobs_in_flight; ++j) done.push_back({r->id, Status::ok()});
        continue;
      }
      const int groups = static_cast<int>(r->kv.groups.size()), heads = 8;
      if (c.policy->score_recipe().page_aligned) {
        // Page-aligned, pages of one head: P = floor(average x heads / b) pages handed out at
        // random, a page at a time, to heads with entries left; each keeps its pages' worth or
        // all its entries (P pages in all unless every entry fits).
        EXPECT_EQ(groups, heads);
        std::vector<int> entries(static_cast<size_t>(groups)), pages(static_cast<size_t>(groups), 0);
        for (int g = 0; g < groups; ++g)
          entries[static_cast<size_t>(g)] = c.groups.empty() ? c.src_entries : c.groups[static_cast<size_t>(g)].src_entries;
        for (int p = 0; p < c.num_keep * heads / kB; ++p) {
          std::vector<int> open;
          for (int g = 0; g < groups; ++g)
            if (pages[static_cast<size_t>(g)] * kB < entries[static_cast<size_t>(g)]) open.push_back(g);
          if (open.empty()) break;
          ++pages[static_cast<size_t>(open[kept_rng() % open.size()])];
        }
        for (int g = 0; g < groups; ++g) {
          CompressionResult res{r->id, Status::ok(), g};
          res.num_kept = std::min(entries[static_cast<size_t>(g)], pages[static_cast<size_t>(g)] * kB);
          done.push_back(res);
        }
        continue;
      }
      std::vector<int> weight(static_cast<size_t>(heads));
      int sum = 0;
      for (int& w : weight) sum += (w = 1 + static_cast<int>(kept_rng() % 8));
      for (int g = 0; g < groups; ++g) {
        const int entries = c.groups.empty() ? c.src_entries : c.groups[static_cast<size_t>(g)].src_entries;
        int keep = 0;
        for (int h = 2 * g; h < 2 * g + 2; ++h)
          keep = std::max(keep, std::min(entries, c.num_keep * heads * weight[static_cast<size_t>(h)] / sum));
        CompressionResult res{r->id, Status::ok(), g};
        res.num_kept = keep;
        done.push_back(res);
      }
    }
    return done;
  }

  void check_reservations() {
    int promised = 0;
    for (Request* r : sched.running()) {
      if (r->compression.runtime_allocated()) continue;  // no per-group reservation (checked below)
      const std::vector<int>& reserved = r->compression.reserved_blocks;
      ASSERT_EQ(reserved.size(), r->kv.groups.size()) << "request " << r->id << " was admitted without a reservation";
      for (size_t g = 0; g < r->kv.groups.size(); ++g) {
        const int held = static_cast<int>(r->kv.groups[g].blocks.size());
        ASSERT_LE(held, reserved[g]) << "request " << r->id << " group " << g << " holds more than it was reserved";
        promised += reserved[g] - held;
      }
    }
    // What the running requests were promised is still there for them.
    ASSERT_LE(promised, kv.num_free_blocks()) << "reservations over-committed";
  }

  void step() {
    ++num_steps;
    // Async: the batch in flight is reported before this step's plan (a wait-only step's report).
    std::vector<CompressionResult> early;
    if (async && !in_flight.empty()) {
      early = results(in_flight);
      in_flight.clear();
      sched.update_from_output(SchedulerOutput{}, early);
    }
    SchedulerOutput out = sched.schedule();
    num_preemptions += static_cast<int64_t>(out.preempted.size());
    ASSERT_TRUE(out.rejected.empty()) << out.rejected.front()->error;
    for (Request* r : out.compressions) {
      num_jobs += r->compression.jobs_in_flight;
      num_chunk_compressions += r->is_prefilling() ? 1 : 0;
    }
    num_compressions += static_cast<int64_t>(out.compressions.size());
    peak_running = std::max(peak_running, sched.running().size());
    check_reservations();
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<CompressionResult> done;
    if (async && !out.wait_for_compressions) {
      in_flight = out.compressions;
    } else {
      done = results(out.compressions);
    }
    sched.update_from_output(out, done);
    check_reservations();
    if (::testing::Test::HasFatalFailure()) return;
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      if (r.status != RequestStatus::kRunning || r.num_computed_tokens < r.num_tokens()) continue;
      r.output_token_ids.push_back(fake_sampled_token(r));
      if (static_cast<int>(r.output_token_ids.size()) >= r.sampling.max_tokens) sched.finish_request(&r, FinishReason::kLength);
    }
  }

  void run_to_completion(int max_steps = 5000) {
    while (sched.has_unfinished() && num_steps < max_steps) {
      step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(sched.has_unfinished()) << "no progress in " << max_steps << " steps: deadlock";
    ASSERT_EQ(kv.num_free_blocks(), kv.pool(0).num_usable_blocks()) << "blocks leaked";
  }
};

std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(1 + (seed * 31 + i * 7) % 200);
  return t;
}

// A prompt of 1..60 tokens; with prefix caching, half of them start with up to 24 shared tokens.
std::vector<int32_t> random_prompt(std::mt19937& rng, bool prefix, int seed) {
  const int len = 1 + static_cast<int>(rng() % 60);
  std::vector<int32_t> prompt;
  if (prefix && rng() % 2 == 0) {
    const std::vector<int32_t> shared = tokens(24, 999);
    prompt.assign(shared.begin(), shared.begin() + std::min(len, 24));
  }
  const std::vector<int32_t> rest = tokens(len, seed);
  prompt.insert(prompt.end(), rest.begin() + static_cast<std::ptrdiff_t>(prompt.size()), rest.end());
  return prompt;
}

// Steps the harness until every request is done, calling `each_step` after every step; false (the
// seed named) on a fatal failure.
bool drain(GroupHarness& h, int seed, const std::function<void()>& each_step) {
  for (int s = 0; s < 5000 && h.sched.has_unfinished() && !::testing::Test::HasFatalFailure(); ++s) {
    h.step();
    if (!::testing::Test::HasFatalFailure()) each_step();
  }
  if (!::testing::Test::HasFatalFailure()) h.run_to_completion();
  if (!::testing::Test::HasFatalFailure()) return true;
  ADD_FAILURE() << "seed " << seed;
  return false;
}


SchedulerConfig config(int max_seqs, int chunk) {
  SchedulerConfig c;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = chunk;
  c.max_model_len = 4096;
  c.num_query_slots = max_seqs;
  c.reserve_bounded_kv = true;
  c.compress_before_forward = true;
  return c;
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
  for (Request* r : rs)
    if (r->status == RequestStatus::kRunning)
      for (int g = 0; g < 4; ++g) EXPECT_EQ(r->compression.reserved_blocks[g], expected_reservation(*r, g, 16));
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
      if (!prefix)
        for (Request* r : h.sched.running())
          for (int g = 0; g < 4 && !r->compression.reserved_blocks.empty(); ++g)
            ASSERT_LE(r->compression.reserved_blocks[static_cast<size_t>(g)], expected_reservation(*r, g, chunk))
                << "seed " << seed << " request " << r->id << " group " << g;
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

// An `adakv`-like request (SnapKV's score, the kept counts chosen by the backend per layer)
// compressing every prefill chunk, or a Fast KVzip request under one global threshold and its
// cache-full trigger, as the resolver builds them.
RequestCompression runtime_allocated(const std::string& policy, int budget, int window, bool page_aligned = false) {
  PolicyOptionMap options = {{"window", std::to_string(window)}};
  options["page_aligned"] = page_aligned ? "1" : "0";
  if (policy == "adakv") {
    options["kernel"] = "1";
    options["prefill_chunk_compression"] = "1";
  } else {
    options["allocation"] = "global";
    options["sinks"] = "0";
  }
  auto p = PolicyRegistry::builtin().create(policy, options);
  EXPECT_TRUE(p.has_value()) << p.status().to_string();
  RequestCompression c;
  c.policy = *p;
  c.trigger = c.policy->trigger();
  c.window = c.policy->needs().window_queries ? window : 0;
  c.budget = budget;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    c.max_blocks = max_blocks_for_budget(budget, kB);
    c.num_keep = entries_kept_for_budget(budget, kB);
  } else {
    c.num_keep = budget;
  }
  c.chunk_threshold = c.policy->prefill_chunk_threshold(c.budget, c.max_blocks, kB);
  EXPECT_TRUE(c.runtime_allocated());
  return c;
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
  for (const BlockTable& t : r.kv.groups)
    if (r.compression.compressed() && !r.compression.in_flight && !r.compression.pending && !r.compression.switched_early)
      ASSERT_EQ(static_cast<int>(t.blocks.size()), blocks(t.num_entries)) << "seed " << seed;
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
