#pragma once
// The scheduler on a grouped layout (2 layers x 4 KV heads, groups of 2 heads or per-head pages,
// one shared pool), driven the way the engine drives it: requests as the resolver builds them
// (tangram, runtime allocations), a fake backend that reports every compressed group's job (with
// the counts a joint selection would choose), synchronous or one step late, and the fake model's
// tokens. Shared by the reservation and table-summary tests.
#include <gtest/gtest.h>

#include <algorithm>
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

constexpr int kB = 4;  // block size

// 2 layers, 4 KV heads, groups {0,1} {2,3} per layer: 4 groups sharing `num_pages` pages (or
// groups of `heads_per_group` heads).
inline KVLayout grouped_layout(int num_pages, int heads_per_group = 2) {
  auto layout = KVLayout::grouped(2, 4, 4, kB, num_pages, DType::kF32, KVLayout::adjacent_heads(2, 4, heads_per_group));
  EXPECT_TRUE(layout.has_value()) << layout.status().to_string();
  return *layout;
}

// A tangram request as the engine's resolver builds it: the budget is the average per head, the
// group keeping most keeps lead_budget_for_average() of it, each group its share.
// `slack`: chunk_slack (each chunk keeps the budget x (1 + slack), the prompt's end the budget).
inline RequestCompression tangram(int average, const std::vector<float>& shares, int window, const std::string& slack = "0") {
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

inline int blocks(int entries) { return (entries + kB - 1) / kB; }

struct GroupHarness {
  KVCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> requests;
  std::vector<Request*> in_flight;
  bool async = false;  // compressions reported one step after they start
  int num_steps = 0;
  int64_t num_preemptions = 0, num_compressions = 0, num_jobs = 0, num_chunk_compressions = 0;
  size_t peak_running = 0;
  // The scheduler reserves every request's peak (SchedulerConfig::reserve_bounded_kv): checked
  // after every schedule() and update_from_output().
  bool check_reserved = true;
  // Called after every schedule() and update_from_output() with the step's plan (an empty one for
  // a report between steps) and which of them ran.
  std::function<void(const SchedulerOutput& plan, const char* after)> after_each_change;

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
    if (!check_reserved) return;
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
      if (after_each_change) after_each_change(SchedulerOutput{}, "a report between steps");
      if (::testing::Test::HasFatalFailure()) return;
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
    if (after_each_change && !::testing::Test::HasFatalFailure()) after_each_change(out, "schedule()");
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<CompressionResult> done;
    if (async && !out.wait_for_compressions) {
      in_flight = out.compressions;
    } else {
      done = results(out.compressions);
    }
    sched.update_from_output(out, done);
    check_reservations();
    if (after_each_change && !::testing::Test::HasFatalFailure()) after_each_change(out, "update_from_output()");
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

inline std::vector<int32_t> tokens(int n, int seed) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(1 + (seed * 31 + i * 7) % 200);
  return t;
}

// A prompt of 1..60 tokens; with prefix caching, half of them start with up to 24 shared tokens.
inline std::vector<int32_t> random_prompt(std::mt19937& rng, bool prefix, int seed) {
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
inline bool drain(GroupHarness& h, int seed, const std::function<void()>& each_step) {
  for (int s = 0; s < 5000 && h.sched.has_unfinished() && !::testing::Test::HasFatalFailure(); ++s) {
    h.step();
    if (!::testing::Test::HasFatalFailure()) each_step();
  }
  if (!::testing::Test::HasFatalFailure()) h.run_to_completion();
  if (!::testing::Test::HasFatalFailure()) return true;
  ADD_FAILURE() << "seed " << seed;
  return false;
}


inline SchedulerConfig config(int max_seqs, int chunk) {
  SchedulerConfig c;
  c.max_num_seqs = max_seqs;
  c.max_num_batched_tokens = chunk;
  c.max_model_len = 4096;
  c.num_query_slots = max_seqs;
  c.reserve_bounded_kv = true;
  c.compress_before_forward = true;
  return c;
}

// An `adakv`-like request (SnapKV's score, the kept counts chosen by the backend per layer)
// compressing every prefill chunk, or a Fast KVzip request under one global threshold and its
// cache-full trigger, as the resolver builds them.
inline RequestCompression runtime_allocated(const std::string& policy, int budget, int window, bool page_aligned = false) {
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

}  // namespace origami::testing
