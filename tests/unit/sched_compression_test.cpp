// Scheduler with compression (Zipage §4): trigger points and query-capture windows, exact block
// ids and reference counts through a compression (in place, and with shared prefix blocks
// replaced by fresh targets, Figure 3), query-slot waits and hand-over, preemption order, the
// prefix-cache limit in front of a window, SnapKV's one-off prefill compression, and randomized
// runs on tiny pools with prefix sharing that must always drain (no deadlock, no lost request).
#include <random>

#include "sched_compression_harness.h"

namespace origami::testing {
namespace {

constexpr int kB = 4;  // block size

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

SchedulerConfig config(int max_num_seqs, int budget, int slots) {
  SchedulerConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = budget;
  c.num_query_slots = slots;
  return c;
}

// zipage with w = 2, budget 8 at b = 4: N_max = 3, k = 8, compress at 12 entries.
RequestCompression zipage8() { return make_compression("zipage", 8, kB, {{"window", "2"}}); }

TEST(SchedCompression, CaptureWindowAndTrigger) {
  Request r;
  r.prompt_token_ids = tokens(5, 1);
  r.compression = zipage8();
  // Nothing computed: the next compression happens at N_max * b = 12 entries; window 10, 11.
  EXPECT_EQ(query_capture_from(r, kB), 10);
  // A prompt overshooting N_max blocks compresses right after its prefill: window = its end.
  r.prompt_token_ids = tokens(30, 1);
  EXPECT_EQ(query_capture_from(r, kB), 28);
  RequestCompression snap = make_compression("snapkv", 6, kB, {{"window", "3"}});
  r.compression = snap;
  EXPECT_EQ(query_capture_from(r, kB), 27);  // the last 3 of 30 prompt entries
  r.prompt_token_ids = tokens(6, 1);
  EXPECT_EQ(query_capture_from(r, kB), -1);  // prompt within the budget: never compressed
  r.compression = make_compression("streaming", 8, kB);
  EXPECT_EQ(query_capture_from(r, kB), -1);  // no queries needed
  r.compression = make_compression("full", 0, kB);
  EXPECT_EQ(query_capture_from(r, kB), -1);
}

TEST(SchedCompression, InPlaceCompressionExactBlocks) {
  CompressionHarness h(kB, 16, false, config(8, 64, 2));
  Request* r = h.add(tokens(5, 1), 20, zipage8());
  h.step();  // prefill 5: entries 0..4 in blocks 1, 2
  EXPECT_EQ(r->kv.groups[0].blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(r->compression.query_slot, -1);
  // Decode entries 5..9 without a slot; entry 10 is the first of the window.
  for (int e = 5; e <= 9; ++e) {
    h.step();
    EXPECT_EQ(r->compression.query_slot, -1) << e;
  }
  h.step();  // entry 10
  EXPECT_EQ(r->compression.query_slot, 0);
  h.step();  // entry 11: 12 entries = N_max full blocks -> pending
  EXPECT_TRUE(r->compression.pending);
  EXPECT_EQ(r->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 3}));
  h.step();  // compresses (in place: dst = blocks 1, 2; block 3 kept empty), then decodes entry 8
  ASSERT_EQ(h.plans.size(), 1u);
  EXPECT_EQ(h.num_compressions, 1);
  EXPECT_EQ(r->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(r->kv.num_entries(0), 9);
  EXPECT_EQ(r->num_computed_tokens, 13);  // positions stay logical
  EXPECT_EQ(r->compression.num_compressions, 1);
  EXPECT_EQ(r->compression.query_slot, -1);  // w < b: the next window is not due yet
  EXPECT_EQ(h.kv.num_free_blocks(), 15 - 3);
  h.run_to_completion();
  EXPECT_EQ(r->output_token_ids.size(), 20u);
  // 5 + 20 tokens, 24 of them computed: compressions when entry 11, 15, 19 complete (8 -> 12
  // entries each time); after entry 23 the request has finished.
  EXPECT_EQ(h.num_compressions, 3);
}

TEST(SchedCompression, SharedPrefixGoesToFreshTargets) {
  CompressionHarness h(kB, 20, true, config(8, 64, 2));
  // A first request leaves the prompt's two full blocks (1, 2) in the prefix cache.
  Request* first = h.add(tokens(9, 100), 1, make_compression("full", 0, kB));
  h.run_to_completion();
  ASSERT_EQ(first->output_token_ids.size(), 1u);
  Request* a = h.add(tokens(9, 100), 8, zipage8());
  Request* b = h.add(tokens(9, 100), 8, zipage8());
  // Keeps a step runnable while a and b are in flight (block 5, and 6 from its entry 4 on).
  Request* other = h.add(tokens(3, 900), 20, make_compression("full", 0, kB));
  h.step();  // both hit blocks 1, 2 (their window starts at entry 10, after them)
  EXPECT_EQ(a->num_cached_prefix_tokens, 8);
  EXPECT_EQ(b->num_cached_prefix_tokens, 8);
  EXPECT_EQ(a->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(b->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 4}));
  EXPECT_EQ(h.kv.ref_count(1), 2);
  EXPECT_EQ(h.kv.ref_count(2), 2);
  while (!a->compression.pending) h.step();
  ASSERT_TRUE(b->compression.pending);  // both reach 12 entries in the same step
  EXPECT_EQ(a->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 3}));
  EXPECT_EQ(b->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 4}));
  h.flight_delay = 1;
  h.step();  // both start; shared blocks 1, 2 are replaced by fresh targets
  ASSERT_EQ(h.plans.size(), 1u);
  ASSERT_EQ(h.plans[0].requests.size(), 2u);
  // Fresh blocks come from the free queue's front: 7..10 were never used.
  EXPECT_EQ(a->compression.dst_blocks, (std::vector<BlockId>{7, 8}));
  EXPECT_EQ(a->compression.next_table, (std::vector<BlockId>{7, 8, 3}));
  EXPECT_EQ(b->compression.dst_blocks, (std::vector<BlockId>{9, 10}));
  EXPECT_EQ(b->compression.next_table, (std::vector<BlockId>{9, 10, 4}));
  EXPECT_EQ(other->kv.groups[0].blocks, (std::vector<BlockId>{5, 6}));
  EXPECT_EQ(h.kv.ref_count(1), 2);  // sources stay held while in flight
  h.step();  // both complete; their references to 1, 2 are dropped
  EXPECT_EQ(a->kv.groups[0].blocks, (std::vector<BlockId>{7, 8, 3}));
  EXPECT_EQ(b->kv.groups[0].blocks, (std::vector<BlockId>{9, 10, 4}));
  EXPECT_EQ(h.kv.ref_count(1), 0);
  EXPECT_EQ(h.kv.ref_count(2), 0);
  // Blocks 1, 2 still hold the prompt's KV: a third request is served from them (the harness
  // checks it reads exactly its own prefix).
  EXPECT_TRUE(h.kv.pool().is_cached(1));
  EXPECT_TRUE(h.kv.pool().is_cached(2));
  Request* c = h.add(tokens(9, 100), 3, make_compression("full", 0, kB));
  h.step();
  EXPECT_EQ(c->num_cached_prefix_tokens, 8);
  EXPECT_EQ(c->kv.groups[0].blocks[0], 1);
  h.run_to_completion();
  EXPECT_EQ(a->output_token_ids.size(), 8u);
  EXPECT_EQ(b->output_token_ids.size(), 8u);
}

TEST(SchedCompression, PrefixHitStopsBeforeTheWindow) {
  CompressionHarness h(kB, 20, true, config(8, 64, 2));
  Request* a = h.add(tokens(13, 100), 2, make_compression("full", 0, kB));
  h.run_to_completion();
  ASSERT_EQ(a->output_token_ids.size(), 2u);
  // 12 tokens are cached, but a zipage request's window starts at entry 13 - 2 = 11: only the
  // two blocks before it are served.
  Request* b = h.add(tokens(13, 100), 4, zipage8());
  h.step();
  EXPECT_EQ(b->num_cached_prefix_tokens, 8);
  h.run_to_completion();
  EXPECT_GE(b->compression.num_compressions, 1);
}

TEST(SchedCompression, QuerySlotWaitAndHandOver) {
  CompressionHarness h(kB, 32, false, config(8, 64, 1));
  Request* a = h.add(tokens(9, 1), 12, zipage8());
  Request* b = h.add(tokens(9, 50), 12, zipage8());
  h.step();  // both prefill 9 entries
  h.step();  // entry 9 each
  h.step();  // entry 10: a (earlier) takes the only slot; b waits
  EXPECT_EQ(a->compression.query_slot, 0);
  EXPECT_EQ(b->compression.query_slot, -1);
  EXPECT_EQ(b->kv.num_entries(0), 10);
  EXPECT_EQ(h.num_slot_waits, 1);
  h.step();  // a: entry 11 -> pending; b waits again
  EXPECT_TRUE(a->compression.pending);
  EXPECT_EQ(h.num_slot_waits, 2);
  h.step();  // a compresses and releases the slot, which b takes in the same step
  EXPECT_EQ(a->compression.num_compressions, 1);
  EXPECT_EQ(a->compression.query_slot, -1);
  EXPECT_EQ(b->compression.query_slot, 0);
  EXPECT_EQ(b->kv.num_entries(0), 11);
  h.run_to_completion();
  EXPECT_EQ(a->output_token_ids.size(), 12u);
  EXPECT_EQ(b->output_token_ids.size(), 12u);
}

TEST(SchedCompression, PreemptsTheLastRequestWithoutASlotAndNeverACompressedOne) {
  // 7 usable blocks, one slot. a overshoots N_max with its prompt and is compressed right after
  // its prefill: 3 blocks, bounded from then on.
  CompressionHarness h(kB, 8, false, config(8, 64, 1));
  Request* a = h.add(tokens(13, 1), 30, zipage8());
  h.step();
  h.step();
  ASSERT_EQ(a->compression.num_compressions, 1);
  EXPECT_EQ(a->kv.groups[0].blocks.size(), 3u);
  Request* b = h.add(tokens(4, 100), 30, zipage8());
  Request* c = h.add(tokens(4, 200), 30, zipage8());
  // Steps 3..7: a decodes entries 9..13 (compressing again at 12), b and c fill 2 blocks each.
  std::vector<Request*> victims;
  while (victims.empty() && h.num_steps < 50) {
    SchedulerOutput out = h.step();
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    victims = out.preempted;
  }
  // b needs its third block with none free: c, the last running request without a slot, goes;
  // a (compressed, bounded) and b (asking) stay.
  ASSERT_EQ(victims.size(), 1u);
  EXPECT_EQ(victims[0], c);
  EXPECT_EQ(h.num_steps, 8);
  EXPECT_EQ(b->kv.groups[0].blocks.size(), 3u);
  EXPECT_EQ(a->status, RequestStatus::kRunning);
  h.run_to_completion();
  for (Request* r : {a, b, c}) EXPECT_EQ(r->output_token_ids.size(), 30u) << r->id;
}

// Budget reservation: 12 usable blocks, bounded requests peaking at N_max = 3 blocks. Without
// reservation all six short prompts are admitted and growing into their third block preempts;
// with it at most four run at once (4 x 3 = 12), none is ever preempted, and all complete.
TEST(SchedCompression, ReservationAdmitsOnlyWhatFitsAtPeakAndNeverPreempts) {
  for (bool reserve : {false, true}) {
    SchedulerConfig c = config(8, 64, 8);
    c.reserve_bounded_kv = reserve;
    CompressionHarness h(kB, 13, false, c);
    std::vector<Request*> rs;
    for (int i = 0; i < 6; ++i) rs.push_back(h.add(tokens(3, 100 * i + 1), 40, zipage8()));
    size_t peak_running = 0;
    while (h.sched.has_unfinished() && h.num_steps < 2000) {
      h.step();
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
      peak_running = std::max(peak_running, h.sched.running().size());
    }
    for (Request* r : rs) EXPECT_EQ(r->output_token_ids.size(), 40u) << "reserve " << reserve << " request " << r->id;
    if (reserve) {
      EXPECT_EQ(h.num_preemptions, 0);
      EXPECT_EQ(peak_running, 4u);
    } else {
      EXPECT_GT(h.num_preemptions, 0);
      EXPECT_EQ(peak_running, 6u);
    }
  }
}

// Reservation only holds blocks back for bounded requests: a full-KV request is admitted into
// the blocks that the running bounded ones will not need, and a bounded request whose peak is
// covered is admitted next to it.
TEST(SchedCompression, ReservationLeavesUnreservedBlocksToFullKv) {
  SchedulerConfig c = config(8, 64, 8);
  c.reserve_bounded_kv = true;
  CompressionHarness h(kB, 9, false, c);  // 8 usable blocks
  Request* a = h.add(tokens(3, 1), 40, zipage8());                      // peak 3 blocks
  Request* b = h.add(tokens(3, 100), 4, make_compression("full", 0, kB));  // 7 tokens: 2 blocks
  Request* d = h.add(tokens(3, 200), 40, zipage8());                    // peak 3 blocks
  h.step();
  EXPECT_EQ(h.sched.running().size(), 3u);  // 3 (a's peak) + 2 (b) + 3 (d's peak) = 8
  Request* e = h.add(tokens(3, 300), 40, zipage8());
  h.step();
  EXPECT_EQ(e->status, RequestStatus::kWaiting) << "no room for e's peak";
  h.run_to_completion();
  EXPECT_EQ(h.num_preemptions, 0);
  for (Request* r : {a, b, d, e}) EXPECT_EQ(r->status, RequestStatus::kFinished) << r->id;
}

// Reservation with prefix sharing: requests sharing prompt blocks need fresh target blocks when
// they compress (the shared ones are never written). The reservation counts them, so with every
// request bounded nothing is ever preempted, yet the shared blocks are replaced by fresh targets
// and all requests complete.
TEST(SchedCompression, ReservationCountsFreshTargetsOfSharedPrefixes) {
  int64_t targets = 0, compressions = 0;
  for (int seed = 0; seed < 200; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    SchedulerConfig sc = config(2 + seed % 7, 8 + static_cast<int>(rng() % 24), 8);
    sc.reserve_bounded_kv = true;
    // N_max = 3 for zipage8: a request peaks at 3 blocks plus up to 2 fresh targets.
    CompressionHarness h(kB, 6 + static_cast<int>(rng() % 12), /*prefix_caching=*/true, sc);
    h.flight_delay = seed % 3;
    const std::vector<int32_t> shared = tokens(12, 900);
    std::vector<Request*> reqs;
    for (int i = 0; i < 10; ++i) {
      std::vector<int32_t> prompt(shared.begin(), shared.begin() + 5 + static_cast<int>(rng() % 6));
      if (rng() % 3 == 0) prompt.push_back(static_cast<int32_t>(rng() % 50 + 1));
      reqs.push_back(h.add(prompt, 10 + static_cast<int>(rng() % 20), zipage8()));
    }
    h.run_to_completion();
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
    EXPECT_EQ(h.num_preemptions, 0) << "seed " << seed;
    for (Request* r : reqs)
      EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "seed " << seed;
    targets += h.num_fresh_targets;
    compressions += h.num_compressions;
  }
  EXPECT_GT(targets, 200);  // the runs do share blocks at compression time
  EXPECT_GT(compressions, 1000);
}

TEST(SchedCompression, SnapKVCompressesOnceAfterThePrompt) {
  CompressionHarness h(kB, 32, false, config(8, 64, 1));
  Request* r = h.add(tokens(10, 1), 9, make_compression("snapkv", 6, kB, {{"window", "3"}}));
  h.step();  // the whole prompt in one chunk, capturing entries 7..9 into slot 0
  EXPECT_EQ(r->compression.query_slot, 0);
  EXPECT_TRUE(r->compression.pending);
  h.step();  // compress to 6 entries in 2 blocks, slot released, decode one entry
  EXPECT_EQ(r->compression.num_compressions, 1);
  EXPECT_EQ(r->compression.query_slot, -1);
  EXPECT_EQ(r->kv.groups[0].blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(r->kv.num_entries(0), 7);
  EXPECT_EQ(h.kv.num_free_blocks(), 31 - 2);
  h.run_to_completion();
  EXPECT_EQ(h.num_compressions, 1);  // decoding grows the cache uncompressed
  EXPECT_EQ(r->output_token_ids.size(), 9u);
  // A prompt within the budget is never compressed.
  Request* s = h.add(tokens(5, 1), 9, make_compression("snapkv", 6, kB, {{"window", "3"}}));
  h.run_to_completion();
  EXPECT_EQ(s->compression.num_compressions, 0);
  EXPECT_EQ(h.num_compressions, 1);
}

TEST(SchedCompression, StreamingNeedsNoSlots) {
  CompressionHarness h(kB, 32, false, config(8, 64, 0));
  Request* r = h.add(tokens(3, 1), 30, make_compression("streaming", 8, kB));
  h.run_to_completion();
  EXPECT_EQ(r->output_token_ids.size(), 30u);
  EXPECT_EQ(h.num_compressions, 5);  // 32 computed entries: at 12, 16, 20, 24, 28 (not after the last)
  EXPECT_EQ(h.num_slot_waits, 0);
}

// Many requests, mixed policies (prefill chunk compression included), tiny pools, few slots,
// prefix sharing, async delays: every
// request completes with all its tokens and the harness's invariants hold at every step.
TEST(SchedCompression, RandomizedTinyPoolsAlwaysDrain) {
  int64_t compressions = 0, preemptions = 0, slot_waits = 0, shared_targets = 0, chunk_compressions = 0;
  for (int seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    const bool prefix = seed % 2 == 0;
    const int slots = 1 + seed % 3;
    const int num_blocks = 10 + static_cast<int>(rng() % 14);
    SchedulerConfig sc = config(2 + seed % 6, 6 + static_cast<int>(rng() % 20), slots);
    sc.reserve_bounded_kv = seed % 4 >= 2;  // budget reservation on for half the runs
    CompressionHarness h(kB, num_blocks, prefix, sc);
    h.flight_delay = seed % 3;
    const std::vector<int32_t> shared = tokens(11, 700);
    std::vector<Request*> reqs;
    for (int i = 0; i < 12; ++i) {
      std::vector<int32_t> prompt;
      const int len = 1 + static_cast<int>(rng() % 14);
      if (rng() % 2 == 0) prompt.assign(shared.begin(), shared.begin() + std::min(len, 11));
      while (static_cast<int>(prompt.size()) < len) prompt.push_back(static_cast<int32_t>(rng() % 50 + 1));
      RequestCompression c;
      switch (rng() % 7) {
        case 0: c = make_compression("full", 0, kB); break;
        case 1: c = make_compression("streaming", 8, kB); break;
        case 2: c = make_compression("snapkv", 5, kB, {{"window", "2"}}); break;
        case 3: c = make_compression("zipage", 8, kB, {{"window", "4"}}); break;  // w = b: keeps its slot
        // Prefill chunk compression: long prompts compress after chunks, windows spanning chunks.
        case 4: c = make_compression("snapkv", 5, kB, {{"window", "2"}, {"prefill_chunk_compression", "1"}}); break;
        case 5: c = make_compression("zipage", 8, kB, {{"window", "3"}, {"prefill_chunk_compression", "1"}}); break;
        default: c = zipage8(); break;
      }
      reqs.push_back(h.add(prompt, 1 + static_cast<int>(rng() % 25), c));
    }
    h.run_to_completion();
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "seed " << seed;
      return;
    }
    compressions += h.num_compressions;
    preemptions += h.num_preemptions;
    slot_waits += h.num_slot_waits;
    shared_targets += h.num_fresh_targets;
    chunk_compressions += h.num_prefill_chunk_compressions;
    for (Request* r : reqs) {
      if (r->finish_reason == FinishReason::kError) {
        // Only a full-KV request longer than the pool may be rejected.
        EXPECT_FALSE(r->compression.enabled()) << "seed " << seed << " request " << r->id << ": " << r->error;
        continue;
      }
      EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "seed " << seed;
    }
  }
  // The runs must actually exercise what they are meant to.
  EXPECT_GT(compressions, 1000);
  EXPECT_GT(preemptions, 100);
  EXPECT_GT(slot_waits, 100);
  EXPECT_GT(shared_targets, 50);  // shared prefix blocks replaced by fresh targets
  EXPECT_GT(chunk_compressions, 50);  // prompts compressed before their last chunk
  std::printf("randomized: %lld compressions (%lld before a prompt's end), %lld preemptions, %lld slot waits, %lld fresh "
              "targets\n",
              static_cast<long long>(compressions), static_cast<long long>(chunk_compressions),
              static_cast<long long>(preemptions), static_cast<long long>(slot_waits),
              static_cast<long long>(shared_targets));
}

}  // namespace
}  // namespace origami::testing
