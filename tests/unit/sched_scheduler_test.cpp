// Scheduler: token budget, chunked prefill, decode-first ordering, running-request limit,
// preemption by recompute, rejection of requests that can never fit, prefix-cache savings, and
// randomized runs on tiny pools that must always drain. A fake engine drives the steps: it
// "computes" each scheduled token by writing a value that identifies the token's whole prefix
// into a fake KV store, and checks before every step that the KV a request reads (its own or
// served by the prefix cache) holds exactly its own prefix.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "sched_fake_model.h"

namespace origami {
namespace {

using testing::fake_prefix_value;
using testing::fake_sampled_token;

constexpr int kBlock = 4;

std::vector<int32_t> iota_tokens(int n, int32_t first) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

uint64_t constant_hash(uint64_t, std::span<const int32_t>) { return 99; }

struct Harness {
  KVCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Request>> requests;
  std::vector<uint64_t> fake_kv;  // [num_blocks * block_size]: which prefix each slot holds
  std::vector<Request*> rejected;
  int64_t num_scheduled_tokens = 0;
  int64_t num_preemptions = 0;
  int num_steps = 0;

  Harness(int num_blocks, bool prefix_caching, SchedulerConfig config)
      : kv(KVLayout::full(1, 1, 4, kBlock, num_blocks, DType::kF32), prefix_caching),
        sched(config, &kv),
        fake_kv(static_cast<size_t>(num_blocks) * kBlock, 0) {}

  Request* add(std::vector<int32_t> prompt, int max_tokens) {
    auto r = std::make_unique<Request>();
    r->id = requests.size() + 1;
    r->prompt_token_ids = std::move(prompt);
    r->sampling.max_tokens = max_tokens;
    sched.add_request(r.get());
    requests.push_back(std::move(r));
    return requests.back().get();
  }

  size_t slot(const Request& r, int pos) const {
    return static_cast<size_t>(r.kv.groups[0].blocks[static_cast<size_t>(pos / kBlock)]) * kBlock + pos % kBlock;
  }

  void check_invariants(const SchedulerOutput& out) {
    const SchedulerConfig& c = sched.config();
    int sum = 0;
    std::set<Request*> seen;
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      ASSERT_TRUE(seen.insert(&r).second) << "scheduled twice";
      ASSERT_EQ(r.status, RequestStatus::kRunning);
      ASSERT_GE(s.num_new_tokens, 1);
      ASSERT_LE(r.num_computed_tokens + s.num_new_tokens, r.num_tokens());
      if (!c.enable_chunked_prefill) {
        ASSERT_EQ(r.num_computed_tokens + s.num_new_tokens, r.num_tokens());
      }
      ASSERT_EQ(r.kv.num_entries(0), r.num_computed_tokens + s.num_new_tokens);
      ASSERT_GE(static_cast<int>(r.kv.groups[0].blocks.size()), kv.blocks_needed(r.kv.num_entries(0)));
      sum += s.num_new_tokens;
    }
    ASSERT_EQ(sum, out.num_batched_tokens);
    ASSERT_LE(out.num_batched_tokens, c.max_num_batched_tokens);
    ASSERT_LE(static_cast<int>(sched.num_running()), c.max_num_seqs);
    // Reference counts equal the number of running tables holding each block.
    std::vector<int> refs(static_cast<size_t>(kv.pool().num_blocks()), 0);
    for (Request* r : sched.running())
      for (BlockId b : r->kv.groups.at(0).blocks) ++refs[static_cast<size_t>(b)];
    for (Request* r : sched.waiting()) ASSERT_TRUE(r->kv.groups.empty()) << "a waiting request holds blocks";
    int num_free = 0;
    for (BlockId b = 1; b < kv.pool().num_blocks(); ++b) {
      ASSERT_EQ(kv.pool().ref_count(b), refs[static_cast<size_t>(b)]) << "block " << b;
      num_free += refs[static_cast<size_t>(b)] == 0;
    }
    ASSERT_EQ(num_free, kv.num_free_blocks());
  }

  // Reads and writes of the fake KV store, as the model would do them this step.
  void run_model(const SchedulerOutput& out) {
    for (const ScheduledSequence& s : out.sequences) {
      const Request& r = *s.request;
      for (int p = 0; p < r.num_computed_tokens; ++p)
        ASSERT_EQ(fake_kv[slot(r, p)], fake_prefix_value(r, p)) << "request " << r.id << " reads wrong KV at " << p;
      for (int p = r.num_computed_tokens; p < r.num_computed_tokens + s.num_new_tokens; ++p) {
        const BlockId b = r.kv.groups[0].blocks[static_cast<size_t>(p / kBlock)];
        ASSERT_EQ(kv.pool().ref_count(b), 1) << "writing into a shared block";
        fake_kv[slot(r, p)] = fake_prefix_value(r, p);
      }
    }
  }

  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    ++num_steps;
    check_invariants(out);
    run_model(out);
    num_scheduled_tokens += out.num_batched_tokens;
    num_preemptions += static_cast<int64_t>(out.preempted.size());
    for (Request* r : out.rejected) {
      rejected.push_back(r);
      sched.finish_request(r, FinishReason::kError);
    }
    sched.update_from_output(out, {});
    for (const ScheduledSequence& s : out.sequences) {
      Request& r = *s.request;
      if (r.num_computed_tokens < r.num_tokens()) continue;  // mid-prompt chunk: no logits
      r.output_token_ids.push_back(fake_sampled_token(r));
      if (static_cast<int>(r.output_token_ids.size()) >= r.sampling.max_tokens)
        sched.finish_request(&r, FinishReason::kLength);
    }
    return out;
  }

  void run_to_completion(int max_steps = 100000) {
    while (sched.has_unfinished() && num_steps < max_steps) {
      const SchedulerOutput out = step();
      if (::testing::Test::HasFatalFailure()) return;
      ASSERT_TRUE(!out.empty() || !out.rejected.empty() || !out.preempted.empty()) << "no progress: deadlock";
    }
    ASSERT_FALSE(sched.has_unfinished()) << "did not drain in " << max_steps << " steps";
  }
};

std::vector<int> chunk_sizes(const SchedulerOutput& out) {
  std::vector<int> v;
  for (const ScheduledSequence& s : out.sequences) v.push_back(s.num_new_tokens);
  return v;
}

std::vector<RequestId> ids(const SchedulerOutput& out) {
  std::vector<RequestId> v;
  for (const ScheduledSequence& s : out.sequences) v.push_back(s.request->id);
  return v;
}

SchedulerConfig config(int max_num_seqs, int budget, bool chunked = true) {
  SchedulerConfig c;
  c.max_num_seqs = max_num_seqs;
  c.max_num_batched_tokens = budget;
  c.enable_chunked_prefill = chunked;
  return c;
}

TEST(Scheduler, BudgetIsRespectedExactly) {
  Harness h(64, false, config(8, 10));
  for (int i = 0; i < 3; ++i) h.add(iota_tokens(7, 10 * i), 5);
  SchedulerOutput s1 = h.step();
  EXPECT_EQ(ids(s1), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(chunk_sizes(s1), (std::vector<int>{7, 3}));
  EXPECT_EQ(s1.num_batched_tokens, 10);
  EXPECT_EQ(h.sched.num_waiting(), 1u);
  SchedulerOutput s2 = h.step();
  EXPECT_EQ(ids(s2), (std::vector<RequestId>{1, 2, 3}));
  EXPECT_EQ(chunk_sizes(s2), (std::vector<int>{1, 4, 5}));
  SchedulerOutput s3 = h.step();
  EXPECT_EQ(chunk_sizes(s3), (std::vector<int>{1, 1, 2}));
  h.run_to_completion();
  for (auto& r : h.requests) EXPECT_EQ(r->output_token_ids.size(), 5u);
}

TEST(Scheduler, ChunkedPrefillSplitsALongPromptIntoBudgetChunks) {
  Harness h(64, false, config(8, 16));
  Request* r = h.add(iota_tokens(50, 0), 3);
  std::vector<int> chunks;
  std::vector<size_t> outputs;
  while (h.sched.has_unfinished()) {
    SchedulerOutput out = h.step();
    ASSERT_EQ(out.sequences.size(), 1u);
    chunks.push_back(out.sequences[0].num_new_tokens);
    outputs.push_back(r->output_token_ids.size());
  }
  EXPECT_EQ(chunks, (std::vector<int>{16, 16, 16, 2, 1, 1}));
  EXPECT_EQ(outputs, (std::vector<size_t>{0, 0, 0, 1, 2, 3}));  // a token only once the prompt is done
  EXPECT_EQ(r->finish_reason, FinishReason::kLength);
}

TEST(Scheduler, DecodesComeBeforePrefills) {
  Harness h(64, false, config(8, 8));
  h.add(iota_tokens(3, 0), 10);
  EXPECT_EQ(chunk_sizes(h.step()), (std::vector<int>{3}));
  h.add(iota_tokens(20, 100), 10);
  SchedulerOutput s2 = h.step();
  EXPECT_EQ(ids(s2), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(chunk_sizes(s2), (std::vector<int>{1, 7}));
  h.add(iota_tokens(5, 200), 10);
  SchedulerOutput s3 = h.step();
  EXPECT_EQ(ids(s3), (std::vector<RequestId>{1, 2}));  // no budget left for the newcomer
  EXPECT_EQ(chunk_sizes(s3), (std::vector<int>{1, 7}));
  // Every step: once a prefill chunk appears, no decode follows it.
  while (h.sched.has_unfinished()) {
    SchedulerOutput out = h.step();
    bool seen_prefill = false;
    for (const ScheduledSequence& s : out.sequences) {
      const bool decode = s.num_new_tokens == 1 && s.request->num_computed_tokens == s.request->num_tokens() - 1 &&
                          s.request->num_computed_tokens > s.request->num_prompt_tokens() - 1;
      if (!decode) seen_prefill = true;
      EXPECT_FALSE(decode && seen_prefill) << "decode scheduled after a prefill chunk";
    }
  }
}

TEST(Scheduler, MaxNumSeqsIsRespected) {
  Harness h(64, false, config(2, 100));
  for (int i = 0; i < 5; ++i) h.add(iota_tokens(4, 10 * i), 3 + i);
  SchedulerOutput s1 = h.step();
  EXPECT_EQ(ids(s1), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(h.sched.num_running(), 2u);
  h.step();
  SchedulerOutput s3 = h.step();  // request 1 finished (3 tokens) after step 3
  EXPECT_EQ(ids(s3), (std::vector<RequestId>{1, 2}));
  EXPECT_TRUE(h.requests[0]->is_finished());
  SchedulerOutput s4 = h.step();
  EXPECT_EQ(ids(s4), (std::vector<RequestId>{2, 3}));
  h.run_to_completion();
  for (auto& r : h.requests) EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens);
}

// 5 usable blocks of 4 tokens. A and B take 2 blocks each, C one; when A and B both need a
// third block, C (admitted last) is preempted for A, then B preempts itself.
class PreemptionTest : public ::testing::TestWithParam<bool> {};

TEST_P(PreemptionTest, PicksTheLastAdmittedFreesItsBlocksAndRecomputes) {
  const bool caching = GetParam();
  Harness h(6, caching, config(8, 64));
  Request* a = h.add(iota_tokens(8, 0), 4);
  Request* b = h.add(iota_tokens(8, 100), 4);
  Request* c = h.add(iota_tokens(3, 200), 4);
  SchedulerOutput s1 = h.step();
  EXPECT_EQ(a->kv.groups[0].blocks, (std::vector<BlockId>{1, 2}));
  EXPECT_EQ(b->kv.groups[0].blocks, (std::vector<BlockId>{3, 4}));
  EXPECT_EQ(c->kv.groups[0].blocks, (std::vector<BlockId>{5}));
  EXPECT_EQ(h.kv.num_free_blocks(), 0);

  SchedulerOutput s2 = h.step();
  ASSERT_EQ(s2.preempted.size(), 2u);
  EXPECT_EQ(s2.preempted[0], c);
  EXPECT_EQ(s2.preempted[1], b);
  EXPECT_EQ(ids(s2), (std::vector<RequestId>{1}));
  EXPECT_EQ(a->kv.groups[0].blocks, (std::vector<BlockId>{1, 2, 5}));  // C's block went to A
  EXPECT_TRUE(b->kv.groups.empty());
  EXPECT_TRUE(c->kv.groups.empty());
  EXPECT_EQ(h.kv.num_free_blocks(), 2);
  for (Request* r : {b, c}) {
    EXPECT_EQ(r->status, RequestStatus::kPreempted);
    EXPECT_EQ(r->num_computed_tokens, 0);
    EXPECT_EQ(r->num_preemptions, 1);
    EXPECT_EQ(r->output_token_ids.size(), 1u);  // outputs survive preemption
  }
  ASSERT_EQ(h.sched.waiting().size(), 2u);
  EXPECT_EQ(h.sched.waiting()[0], b);  // original order kept, at the front
  EXPECT_EQ(h.sched.waiting()[1], c);

  Request* d = h.add(iota_tokens(3, 300), 2);  // arrives later: must not overtake B or C
  std::vector<RequestId> admission_order;
  std::set<RequestId> admitted{1};
  while (h.sched.has_unfinished()) {
    SchedulerOutput out = h.step();
    for (const ScheduledSequence& s : out.sequences) {
      if (admitted.insert(s.request->id).second) {
        admission_order.push_back(s.request->id);
        if (s.request == b && caching) {
          EXPECT_EQ(b->num_cached_prefix_tokens, 8);  // its own prompt blocks were still cached
        }
        if (s.request == b) {  // recomputes prompt + its output in one step, minus cache hits
          EXPECT_EQ(b->num_cached_prefix_tokens + s.num_new_tokens, 9);
          EXPECT_EQ(b->output_token_ids.size(), 2u);
        }
      }
    }
  }
  EXPECT_EQ(admission_order, (std::vector<RequestId>{2, 3, 4}));
  for (Request* r : {a, b, c}) EXPECT_EQ(r->output_token_ids.size(), 4u);
  EXPECT_EQ(d->output_token_ids.size(), 2u);
  EXPECT_EQ(h.kv.num_free_blocks(), 5);
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, PreemptionTest, ::testing::Bool());

TEST(Scheduler, ChunkedPrefillOffAdmitsWholePromptsOnly) {
  Harness h(64, false, config(8, 10, /*chunked=*/false));
  h.add(iota_tokens(6, 0), 3);
  h.add(iota_tokens(6, 50), 3);
  Request* too_long = h.add(iota_tokens(11, 100), 3);
  SchedulerOutput s1 = h.step();
  EXPECT_EQ(ids(s1), (std::vector<RequestId>{1}));  // 6 + 6 > 10: the second waits whole
  SchedulerOutput s2 = h.step();
  EXPECT_EQ(ids(s2), (std::vector<RequestId>{1, 2}));
  EXPECT_EQ(chunk_sizes(s2), (std::vector<int>{1, 6}));
  EXPECT_EQ(s2.rejected, std::vector<Request*>{too_long});  // can never fit one step
  EXPECT_NE(too_long->error.find("max_num_batched_tokens"), std::string::npos);
  h.run_to_completion();
  EXPECT_EQ(h.requests[0]->output_token_ids.size(), 3u);
  EXPECT_EQ(h.requests[1]->output_token_ids.size(), 3u);
}

TEST(Scheduler, RequestsThatCanNeverFitAreRejectedNotLooped) {
  Harness h(4, false, config(8, 64));  // 3 usable blocks: 12 tokens
  Request* huge = h.add(iota_tokens(13, 0), 2);
  Request* grows = h.add(iota_tokens(10, 100), 10);
  SchedulerOutput s1 = h.step();
  EXPECT_EQ(s1.rejected, std::vector<Request*>{huge});
  EXPECT_NE(huge->error.find("KV blocks"), std::string::npos);
  EXPECT_TRUE(huge->kv.groups.empty());
  EXPECT_EQ(ids(s1), (std::vector<RequestId>{2}));
  h.step();
  h.step();
  SchedulerOutput s4 = h.step();  // would need a 13th entry
  EXPECT_EQ(s4.rejected, std::vector<Request*>{grows});
  EXPECT_TRUE(s4.preempted.empty());
  EXPECT_EQ(grows->output_token_ids.size(), 3u);
  EXPECT_EQ(h.kv.num_free_blocks(), 3);
  EXPECT_FALSE(h.sched.has_unfinished());
  EXPECT_EQ(h.rejected.size(), 2u);
  EXPECT_EQ(grows->finish_reason, FinishReason::kError);
}

TEST(Scheduler, FinishingAWaitingRequestRemovesIt) {
  Harness h(64, false, config(1, 64));
  h.add(iota_tokens(4, 0), 2);
  Request* b = h.add(iota_tokens(4, 10), 2);
  h.step();
  h.sched.finish_request(b, FinishReason::kAborted);
  EXPECT_EQ(h.sched.num_waiting(), 0u);
  EXPECT_EQ(b->status, RequestStatus::kFinished);
  h.run_to_completion();
  EXPECT_TRUE(b->output_token_ids.empty());
}

TEST(Scheduler, PrefixCachingReducesComputedTokens) {
  const std::vector<int32_t> system = iota_tokens(32, 1000);
  int64_t scheduled[2] = {0, 0};
  for (int caching = 0; caching < 2; ++caching) {
    Harness h(64, caching == 1, config(8, 64));
    auto prompt = [&](int i) {
      std::vector<int32_t> p = system;
      for (int k = 0; k < 5; ++k) p.push_back(10 * i + k);
      return p;
    };
    h.add(prompt(0), 4);
    h.step();  // the shared prefix is computed and cached by the first request
    for (int i = 1; i < 6; ++i) h.add(prompt(i), 4);
    h.run_to_completion();
    for (size_t i = 1; i < h.requests.size(); ++i)
      EXPECT_EQ(h.requests[i]->num_cached_prefix_tokens, caching ? 32 : 0);
    for (auto& r : h.requests) EXPECT_EQ(r->output_token_ids.size(), 4u);
    scheduled[caching] = h.num_scheduled_tokens;
    if (caching) {
      EXPECT_EQ(h.kv.prefix_cache_stats().num_hit_tokens, 5 * 32);
      EXPECT_EQ(h.kv.prefix_cache_stats().num_queried_tokens, 6 * 37);
    }
  }
  EXPECT_EQ(scheduled[0], 6 * (37 + 3));
  EXPECT_EQ(scheduled[1], scheduled[0] - 5 * 32);
}

// Randomized runs on a pool that holds only a few requests: every request must finish with
// exactly max_tokens outputs, whatever the preemptions, and never read wrong KV.
struct StressCase {
  bool prefix_caching;
  bool chunked;
  bool colliding_hash;
  uint32_t seed;
  int vocab = 50;  // small: equal blocks recur at different positions and after other prefixes
};

class TinyPoolTest : public ::testing::TestWithParam<StressCase> {};

TEST_P(TinyPoolTest, NeverDeadlocksAndEveryRequestCompletes) {
  const StressCase p = GetParam();
  // 8 usable blocks = 32 tokens; without chunking a recomputed prompt+output fits one step.
  Harness h(9, p.prefix_caching, config(6, p.chunked ? 12 : 32, p.chunked));
  if (p.colliding_hash) h.kv.set_block_hasher_for_testing(&constant_hash);
  std::mt19937 rng(p.seed);
  std::vector<std::vector<int32_t>> bases;
  for (int i = 0; i < 3; ++i) {
    bases.push_back(iota_tokens(16, 1000 * (i + 1)));
    if (p.vocab < 50)
      for (auto& t : bases.back()) t %= p.vocab;
  }
  auto random_prompt = [&]() {
    std::uniform_int_distribution<int> len(1, 16);
    const int n = len(rng);
    std::vector<int32_t> prompt;
    if (p.prefix_caching && rng() % 4 != 0) {  // mostly shared prefixes, then a random tail
      const auto& base = bases[rng() % bases.size()];
      const int shared = std::uniform_int_distribution<int>(0, n)(rng);
      prompt.assign(base.begin(), base.begin() + shared);
    }
    while (static_cast<int>(prompt.size()) < n) prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(p.vocab)));
    return prompt;
  };
  const int num_requests = 40;
  int added = 0;
  auto add_one = [&]() {
    std::vector<int32_t> prompt = random_prompt();
    const int room = 32 - static_cast<int>(prompt.size());
    h.add(prompt, std::uniform_int_distribution<int>(1, std::min(room, 16))(rng));
    ++added;
  };
  for (; added < 5;) add_one();
  while (h.sched.has_unfinished() || added < num_requests) {
    for (int k = 0; k < 2 && added < num_requests; ++k) add_one();
    const SchedulerOutput out = h.step();
    if (HasFatalFailure()) return;
    ASSERT_TRUE(!out.empty() || !out.rejected.empty() || !out.preempted.empty()) << "deadlock at step " << h.num_steps;
    ASSERT_LT(h.num_steps, 20000);
  }
  EXPECT_TRUE(h.rejected.empty());
  for (auto& r : h.requests) {
    EXPECT_TRUE(r->is_finished());
    EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), r->sampling.max_tokens) << "request " << r->id;
  }
  EXPECT_EQ(h.kv.num_free_blocks(), 8);
  EXPECT_GT(h.num_preemptions, 0) << "the pool was meant to be too small";
}

// Full-KV reservation (GUARANTEED_NO_EVICT): on a pool that holds three requests' whole lengths
// but five prompts, admission stops at what the whole lengths allow, nothing is ever preempted,
// and every request still completes; without it the same workload preempts.
TEST(Scheduler, FullKvReservationNeverPreempts) {
  for (bool reserve : {false, true}) {
    SchedulerConfig c = config(8, 64);
    c.reserve_full_kv = reserve;
    Harness h(13, false, c);  // 12 usable blocks = 48 tokens: three requests of 4 + 12 tokens
    for (int i = 0; i < 5; ++i) h.add(iota_tokens(4, 100 * (i + 1)), 12);
    size_t max_running = 0;
    while (h.sched.has_unfinished() && h.num_steps < 1000) {
      h.step();
      if (HasFatalFailure()) return;
      max_running = std::max(max_running, h.sched.num_running());
    }
    ASSERT_FALSE(h.sched.has_unfinished());
    for (auto& r : h.requests) EXPECT_EQ(static_cast<int>(r->output_token_ids.size()), 12);
    EXPECT_EQ(h.kv.num_free_blocks(), 12);
    if (reserve) {
      EXPECT_EQ(h.num_preemptions, 0);
      EXPECT_EQ(max_running, 3u) << "the pool holds three whole requests";
    } else {
      EXPECT_GT(h.num_preemptions, 0) << "five prompts fit, five whole requests do not";
      EXPECT_EQ(max_running, 5u);
    }
  }
}

std::vector<StressCase> stress_cases() {
  std::vector<StressCase> cases;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    cases.push_back({false, true, false, seed});
    cases.push_back({false, false, false, seed});
    cases.push_back({true, true, false, seed});
    cases.push_back({true, false, false, seed});
    cases.push_back({true, true, true, seed});
    cases.push_back({true, true, false, seed, 2});
    cases.push_back({true, true, true, seed, 2});
    cases.push_back({true, false, true, seed, 2});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Seeds, TinyPoolTest, ::testing::ValuesIn(stress_cases()));

}  // namespace
}  // namespace origami
