#pragma once
// A fake engine for scheduler tests with compression. It "computes" each scheduled token by
// writing a value naming the token's whole prefix into a fake KV store, and "compresses" a
// request by compacting a chosen subset of its entries (its window always included) into its
// destination blocks, the way the backend kernels do. Before every step it checks that each
// request reads exactly the entries it should hold, that nothing writes into a block another
// request holds (shared prefix blocks stay bit-identical), that every window entry's query was
// captured into the request's slot, that bounded requests stay within N_max blocks, and that
// reference counts match the tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "policy/kv_budget.h"
#include "policy/policy_registry.h"
#include "sched_fake_model.h"
#include "sched/compression_state.h"
#include "sched/scheduler.h"

namespace origami::testing {

inline RequestCompression make_compression(const std::string& policy, int budget, int block_size,
                                           const PolicyOptionMap& options = {}) {
  auto p = PolicyRegistry::builtin().create(policy, options);
  EXPECT_TRUE(p.has_value()) << p.status().to_string();
  RequestCompression c;
  c.policy = *p;
  c.trigger = c.policy->trigger();
  if (!c.policy->compresses()) return c;
  c.budget = budget;
  EXPECT_TRUE(c.policy->check_budget(budget, block_size).is_ok()) << c.policy->check_budget(budget, block_size).message();
  c.window = c.policy->needs().window_queries ? c.policy->needs().window : 0;
  if (c.trigger == CompressionTrigger::kCacheFull) {
    c.max_blocks = max_blocks_for_budget(budget, block_size);
    c.num_keep = entries_kept_for_budget(budget, block_size);
  } else {
    c.num_keep = budget;
  }
  c.chunk_threshold = c.policy->prefill_chunk_threshold(budget, c.max_blocks, block_size);
  return c;
}

struct CompressionHarness {
  int block_size;
  KVCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> requests;
  std::vector<uint64_t> fake_kv;  // [num_blocks * block_size]
  // Per request: what each cache entry must hold once it has been compressed.
  std::map<RequestId, std::vector<uint64_t>> compressed_entries;
  // Per request: entry index -> slot its query was captured into (since the last compaction).
  std::map<RequestId, std::map<int, int>> captured;
  std::vector<Request*> in_flight;
  int flight_delay = 0;  // steps a compression stays in flight (async emulation)
  int flight_age = 0;
  std::vector<Request*> rejected;
  int64_t num_preemptions = 0;
  int64_t num_compressions = 0;
  int64_t num_slot_waits = 0;
  int64_t num_fresh_targets = 0;  // destination blocks that replaced shared prefix blocks
  int64_t num_prefill_chunk_compressions = 0;  // started before the request's prompt was prefilled
  int num_steps = 0;
  // Every batch of compressions started, for exact assertions.
  struct CompressionPlan {
    std::vector<Request*> requests;
  };
  std::vector<CompressionPlan> plans;

  CompressionHarness(int block, int num_blocks, bool prefix_caching, SchedulerConfig config)
      : block_size(block),
        kv(KVLayout::full(1, 1, 4, block, num_blocks, DType::kF32), prefix_caching),
        sched(config, &kv),
        fake_kv(static_cast<size_t>(num_blocks) * block, 0) {}

  Request* add(std::vector<int32_t> prompt, int max_tokens, RequestCompression compression) {
    auto r = std::make_unique<Request>();
    r->id = requests.size() + 1;
    r->prompt_token_ids = std::move(prompt);
    r->sampling.max_tokens = max_tokens;
    r->compression = std::move(compression);
    sched.add_request(r.get());
    requests.push_back(std::move(r));
    return requests.back().get();
  }

  size_t slot(const Request& r, int entry) const {
    return static_cast<size_t>(r.kv.groups[0].blocks[static_cast<size_t>(entry / block_size)]) * block_size +
           entry % block_size;
  }
  uint64_t expected_entry(const Request& r, int entry) const {
    if (!r.compression.compressed()) return fake_prefix_value(r, entry);
    return compressed_entries.at(r.id).at(static_cast<size_t>(entry));
  }

  // The backend's job: keep the window and a pseudo-random choice of the rest, in order. It reads
  // the table the compression started from (the request may already have switched to its
  // compacted table, ahead of a synchronous backend).
  void compress(Request* r) {
    const RequestCompression& c = r->compression;
    const int n = c.src_entries;
    const int k = c.num_keep;
    ASSERT_LT(k, n);
    std::vector<uint64_t> values(static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      const size_t at = static_cast<size_t>(c.src_blocks.at(static_cast<size_t>(e / block_size))) * block_size + e % block_size;
      values[static_cast<size_t>(e)] = fake_kv[at];
      const uint64_t expected =
          c.src_first_compression ? fake_prefix_value(*r, e) : compressed_entries.at(r->id).at(static_cast<size_t>(e));
      ASSERT_EQ(values[static_cast<size_t>(e)], expected) << "request " << r->id << " entry " << e;
    }
    // The window's queries must all have been captured into the slot the job uses.
    if (c.window > 0) {
      ASSERT_GE(c.src_query_slot, 0) << "request " << r->id << " compresses without a query slot";
      for (int e = n - c.window; e < n; ++e) {
        auto it = captured[r->id].find(e);
        ASSERT_TRUE(it != captured[r->id].end()) << "request " << r->id << ": query of window entry " << e << " not captured";
        ASSERT_EQ(it->second, c.src_query_slot) << "request " << r->id << " entry " << e;
      }
    }
    const int protect = c.trigger == CompressionTrigger::kCacheFull && c.window == 0 ? 0 : c.window;
    std::vector<int> keep;
    for (int e = 0; e < n - protect; ++e) keep.push_back(e);
    // Drop a deterministic pseudo-random subset of the unprotected entries.
    const uint64_t done_before = static_cast<uint64_t>(c.num_compressions - (c.switched_early ? 1 : 0));
    uint64_t state = r->id * 7919 + done_before * 104729 + 1;
    while (static_cast<int>(keep.size()) > k - protect) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      keep.erase(keep.begin() + static_cast<std::ptrdiff_t>((state >> 33) % keep.size()));
    }
    for (int e = n - protect; e < n; ++e) keep.push_back(e);
    ASSERT_EQ(static_cast<int>(keep.size()), k);
    for (BlockId dst : c.dst_blocks) {
      const auto& src = c.src_blocks;
      if (std::find(src.begin(), src.end(), dst) == src.end()) ++num_fresh_targets;
    }
    std::vector<uint64_t> kept;
    for (int i = 0; i < k; ++i) {
      const BlockId dst = c.dst_blocks.at(static_cast<size_t>(i / block_size));
      ASSERT_EQ(kv.pool().ref_count(dst), 1) << "compaction writes into shared block " << dst;
      fake_kv[static_cast<size_t>(dst) * block_size + i % block_size] = values[static_cast<size_t>(keep[static_cast<size_t>(i)])];
      kept.push_back(values[static_cast<size_t>(keep[static_cast<size_t>(i)])]);
    }
    pending_results[r->id] = std::move(kept);
    std::map<int, int> carried;
    for (int e = n - c.window; e < n && c.window > 0; ++e) carried[k - c.window + (e - (n - c.window))] = captured[r->id][e];
    pending_captured[r->id] = std::move(carried);
  }
  std::map<RequestId, std::vector<uint64_t>> pending_results;
  std::map<RequestId, std::map<int, int>> pending_captured;

  // The backend's report of the whole batch in flight.
  std::vector<CompressionResult> report_in_flight() const {
    std::vector<CompressionResult> done;
    for (Request* r : in_flight) done.push_back({r->id, Status::ok()});
    return done;
  }

  void record_completions(const std::vector<CompressionResult>& done) {
    for (const CompressionResult& c : done) {
      take_result(c.request_id);
      ++num_compressions;
    }
    if (!done.empty()) in_flight.clear();
  }

  // The request's cache now holds what its compression kept (once per compression).
  void take_result(RequestId id) {
    auto it = pending_results.find(id);
    if (it == pending_results.end()) return;
    compressed_entries[id] = std::move(it->second);
    pending_results.erase(it);
    // The window was kept verbatim at the end: its captured queries stay valid (rows are keyed by
    // position), at the window's new entry indices; a later window may reach back into it.
    captured[id] = std::move(pending_captured[id]);
    pending_captured.erase(id);
  }

  // The step's new compressions, as the backend runs them before the forward pass.
  void start_compressions(const SchedulerOutput& out) {
    for (Request* r : out.preempted) forget(r);
    for (Request* r : out.compressions) {
      num_prefill_chunk_compressions += r->is_prefilling() ? 1 : 0;
      compress(r);
      if (::testing::Test::HasFatalFailure()) return;
      // Switched to its compacted table already: it computes on it in this very step.
      if (r->compression.switched_early) take_result(r->id);
    }
    if (!out.compressions.empty()) {
      ASSERT_TRUE(in_flight.empty()) << "a second compression batch while one is in flight";
      in_flight = out.compressions;
      flight_age = 0;
      CompressionPlan plan;
      plan.requests = out.compressions;
      plans.push_back(plan);
    }
  }

  void forget(Request* r) {
    compressed_entries.erase(r->id);
    captured[r->id].clear();
  }

  void check_invariants(const SchedulerOutput& out) {
    std::set<Request*> seen;
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      ASSERT_TRUE(seen.insert(&r).second) << "scheduled twice";
      ASSERT_EQ(r.status, RequestStatus::kRunning);
      ASSERT_FALSE(r.compression.in_flight || r.compression.pending) << "request " << r.id << " runs while compressing";
      ASSERT_GE(s.num_new_tokens, 1);
    }
    std::vector<int> refs(static_cast<size_t>(kv.pool().num_blocks()), 0);
    for (Request* r : sched.running()) {
      for (BlockId b : r->kv.groups.at(0).blocks) ++refs[static_cast<size_t>(b)];
      // Fresh compression targets are held outside the table until the compression completes.
      if (r->compression.in_flight)
        for (BlockId b : r->compression.next_table)
          if (std::find(r->kv.groups[0].blocks.begin(), r->kv.groups[0].blocks.end(), b) == r->kv.groups[0].blocks.end())
            ++refs[static_cast<size_t>(b)];
      const RequestCompression& c = r->compression;
      if (r->memory_bounded() && !c.in_flight && !c.pending) {
        ASSERT_LE(static_cast<int>(r->kv.groups[0].blocks.size()), c.max_blocks) << "request " << r->id;
        ASSERT_LE(r->kv.num_entries(0), c.max_blocks * block_size) << "request " << r->id;
      }
    }
    for (Request* r : sched.waiting()) ASSERT_TRUE(r->kv.groups.empty()) << "a waiting request holds blocks";
    int num_free = 0;
    for (BlockId b = 1; b < kv.pool().num_blocks(); ++b) {
      ASSERT_EQ(kv.pool().ref_count(b), refs[static_cast<size_t>(b)]) << "block " << b;
      num_free += refs[static_cast<size_t>(b)] == 0;
    }
    ASSERT_EQ(num_free, kv.num_free_blocks());
    // Query slots: each held by at most one request.
    std::set<int> held;
    for (Request* r : sched.running()) {
      if (r->compression.query_slot >= 0) {
        ASSERT_TRUE(held.insert(r->compression.query_slot).second);
      }
    }
    ASSERT_EQ(static_cast<int>(held.size()), sched.query_slots().num_slots() - sched.query_slots().num_free());
  }

  void run_model(const SchedulerOutput& out) {
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      const int entries_before = r.kv.num_entries(0) - s.num_new_tokens;
      for (int e = 0; e < entries_before; ++e)
        ASSERT_EQ(fake_kv[slot(r, e)], expected_entry(r, e)) << "request " << r.id << " reads wrong KV at entry " << e;
      const int capture_from = query_capture_from(r, block_size, entries_before, s.num_new_tokens);
      for (int i = 0; i < s.num_new_tokens; ++i) {
        const int e = entries_before + i;
        const BlockId b = r.kv.groups[0].blocks[static_cast<size_t>(e / block_size)];
        ASSERT_EQ(kv.pool().ref_count(b), 1) << "writing into a shared block";
        const uint64_t value = fake_prefix_value(r, r.num_computed_tokens + i);
        fake_kv[slot(r, e)] = value;
        if (r.compression.compressed()) {
          std::vector<uint64_t>& v = compressed_entries[r.id];
          ASSERT_EQ(static_cast<int>(v.size()), e);
          v.push_back(value);
        }
        if (capture_from >= 0 && e >= capture_from) {
          ASSERT_GE(r.compression.query_slot, 0) << "request " << r.id << " computes window entry " << e << " without a slot";
          captured[r.id][e] = r.compression.query_slot;
        }
      }
    }
  }

  // Requests compressed under a bounded policy are never preempted by schedule() or
  // when schedule() starts compressions (only its last-resort preemption may).
  std::set<Request*> bounded_requests() const {
    std::set<Request*> s;
    for (Request* r : sched.running())
      if (r->memory_bounded()) s.insert(r);
    return s;
  }
  void check_not_bounded(const std::set<Request*>& bounded, const std::vector<Request*>& preempted) {
    for (Request* r : preempted) ASSERT_EQ(bounded.count(r), 0u) << "compressed request " << r->id << " preempted";
  }

  // A backend whose compressions run `flight_delay` steps: with 0 it compacts before the step's
  // forward pass (the request computes in that same step); with d > 0 the request runs again d
  // steps after its compression started (reported between steps, as a wait-only step would).
  SchedulerOutput step() {
    ++num_steps;
    if (!in_flight.empty() && ++flight_age >= flight_delay) {
      const std::vector<CompressionResult> done = report_in_flight();
      const SchedulerUpdate update = sched.update_from_output(SchedulerOutput{}, done);
      EXPECT_TRUE(update.failed_compressions.empty());
      record_completions(done);
    }
    const std::set<Request*> bounded = bounded_requests();
    if (in_flight.empty()) sched.set_compress_before_forward(flight_delay == 0);
    SchedulerOutput out = sched.schedule();
    check_not_bounded(bounded, out.preempted);
    num_preemptions += static_cast<int64_t>(out.preempted.size());
    num_slot_waits += out.num_query_slot_waits;
    start_compressions(out);
    if (::testing::Test::HasFatalFailure()) return out;
    for (Request* r : out.rejected) {
      rejected.push_back(r);
      sched.finish_request(r, FinishReason::kError);
    }
    check_invariants(out);
    if (::testing::Test::HasFatalFailure()) return out;
    run_model(out);
    if (::testing::Test::HasFatalFailure()) return out;
    // A synchronous backend reports the step's compressions with it; a wait step blocks until
    // the batch in flight is done.
    std::vector<CompressionResult> done;
    if (flight_delay == 0 || out.wait_for_compressions) done = report_in_flight();
    const SchedulerUpdate update = sched.update_from_output(out, done);
    EXPECT_TRUE(update.failed_compressions.empty());
    record_completions(done);
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      if (r.num_computed_tokens < r.num_tokens()) continue;
      r.output_token_ids.push_back(fake_sampled_token(r));
      if (static_cast<int>(r.output_token_ids.size()) >= r.sampling.max_tokens)
        sched.finish_request(&r, FinishReason::kLength);
    }
    return out;
  }

  void run_to_completion(int max_steps = 20000) {
    while (sched.has_unfinished() && num_steps < max_steps) {
      const SchedulerOutput out = step();
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_TRUE(!out.empty() || !out.rejected.empty() || !sched.has_unfinished()) << "no progress: deadlock";
    }
    ASSERT_FALSE(sched.has_unfinished()) << "did not drain in " << max_steps << " steps";
    ASSERT_TRUE(in_flight.empty());
    ASSERT_EQ(kv.num_free_blocks(), kv.num_usable_blocks()) << "blocks leaked";
    ASSERT_EQ(sched.query_slots().num_free(), sched.query_slots().num_slots()) << "query slots leaked";
  }
};

}  // namespace origami::testing
