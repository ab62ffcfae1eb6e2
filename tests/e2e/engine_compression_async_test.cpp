// Async compression in the engine, on a CPU backend whose compressions finish only some steps
// after they start (as on a GPU stream): the jobs run when the backend reports them done, so any
// change the engine made to a compressing request's tables or pages in between would show. The
// outputs must equal synchronous compression token for token, aborts of compressing requests
// wait for the compression, and the compressing requests skip steps while the others decode.
#include <random>

#include "deferred_compression_backend.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

std::vector<BatchItem> items(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 8000 + 3);
  std::vector<BatchItem> out;
  for (int i = 0; i < 10; ++i) {
    BatchItem item;
    const int len = 4 + static_cast<int>(rng() % 70);
    if (i % 2 == 0) item.prompt_token_ids.assign(shared.begin(), shared.begin() + std::min(len, 40));
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 8000 + 3));
    item.sampling = greedy(30 + static_cast<int>(rng() % 50));
    out.push_back(item);
  }
  return out;
}

EngineConfig config(bool async, bool prefix, const std::string& policy = "zipage") {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.kv_policy = policy;
  c.kv_budget = 40;
  c.async_compression = async;
  c.enable_prefix_caching = prefix;
  return c;
}

// Compaction (zipage) and PagedEviction's whole-block eviction, whose result names the block.
TEST(EngineCompressionAsync, DeferredCompressionGivesTheSameTokensAsSynchronous) {
  for (const std::string policy : {"zipage", "pagedeviction"})
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(policy + (prefix ? " with prefix caching" : ""));
    const std::vector<BatchItem> batch = items(3);
    auto sync_engine = make_engine(config(false, prefix, policy));
    ASSERT_NE(sync_engine, nullptr);
    const std::vector<BatchResult> expected = run_batch(*sync_engine, batch);
    for (int delay : {1, 3}) {
      int deferred = 0;
      auto engine = Engine::create(config(true, prefix, policy), std::make_unique<DeferredCompressionBackend>(delay, &deferred));
      ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
      const std::vector<BatchResult> got = run_batch(**engine, batch);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(got[i].ok) << got[i].error;
        EXPECT_EQ(got[i].output_token_ids, expected[i].output_token_ids) << "prefix " << prefix << " delay " << delay << " item " << i;
      }
      EXPECT_GT(deferred, 0);  // compressions really stayed in flight across steps
      EXPECT_EQ((*engine)->metrics().num_compressions, sync_engine->metrics().num_compressions);
    }
  }
}

// Runtime allocations (the backend chooses each head group's count, reported with the result):
// AdaKV per layer at the end of the prompt, and Fast KVzip per layer and with its one global
// threshold under its cache-full trigger, on per-head pages and on the one-group layout. (Prefill
// chunk compression is off: where a chunk ends depends on the batch around it, which async
// compression changes.)
TEST(EngineCompressionAsync, RuntimeAllocationsGiveTheSameTokensAsSynchronous) {
  struct Case {
    std::string policy;
    PolicyOptionMap options;
    int heads_per_group;
  };
  const std::vector<Case> cases = {
      {"adakv", {}, 1},
      {"adakv", {}, 0},
      {"fastkvzip", {{"allocation", "global"}, {"window", "16"}, {"prefill_chunk_compression", "0"}}, 1},
      {"fastkvzip", {{"allocation", "layer"}, {"window", "16"}, {"prefill_chunk_compression", "0"}}, 0},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.policy + " heads per group " + std::to_string(k.heads_per_group));
    auto make_config = [&](bool async) {
      EngineConfig c = config(async, /*prefix=*/true, k.policy);
      c.kv_policy_options = k.options;
      c.heads_per_group = k.heads_per_group;
      if (k.policy == "fastkvzip") c.kv_gates = tiny_qwen3_gates();
      return c;
    };
    const std::vector<BatchItem> batch = items(5);
    auto sync_engine = make_engine(make_config(false));
    ASSERT_NE(sync_engine, nullptr);
    const std::vector<BatchResult> expected = run_batch(*sync_engine, batch);
    for (const BatchResult& r : expected) ASSERT_TRUE(r.ok) << r.error;
    EXPECT_GT(sync_engine->metrics().num_compressions, 0);
    int deferred = 0;
    auto engine = Engine::create(make_config(true), std::make_unique<DeferredCompressionBackend>(2, &deferred));
    ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
    const std::vector<BatchResult> got = run_batch(**engine, batch);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].ok) << got[i].error;
      EXPECT_EQ(got[i].output_token_ids, expected[i].output_token_ids) << "item " << i;
    }
    EXPECT_GT(deferred, 0);
    EXPECT_EQ((*engine)->metrics().num_compressions, sync_engine->metrics().num_compressions);
    EXPECT_EQ((*engine)->num_kv_blocks_used(), 0);
  }
}

TEST(EngineCompressionAsync, AbortWaitsForTheCompressionInFlight) {
  int deferred = 0;
  auto created = Engine::create(config(true, false), std::make_unique<DeferredCompressionBackend>(1000, &deferred));
  ASSERT_TRUE(created.has_value()) << created.status().to_string();
  Engine& engine = **created;
  const RequestId a = *engine.add_request(items(5)[0].prompt_token_ids, greedy(100));
  const RequestId b = *engine.add_request({5, 6, 7}, greedy(100));
  // Step until a is compressing; b keeps decoding meanwhile.
  for (int i = 0; i < 200 && !engine.request(a)->compression.in_flight; ++i) engine.step();
  ASSERT_TRUE(engine.request(a)->compression.in_flight);
  const size_t b_before = engine.request(b)->output_token_ids.size();
  engine.step();
  engine.step();
  EXPECT_TRUE(engine.request(a)->compression.in_flight);
  EXPECT_EQ(engine.request(b)->output_token_ids.size(), b_before + 2);
  engine.abort_request(a);
  std::vector<RequestOutput> outs = engine.step();
  EXPECT_FALSE(engine.request(a)->is_finished());  // its pages are still being compressed
  engine.abort_request(b);
  // Once nothing else can run, the engine waits for the compression and then aborts a.
  const size_t a_tokens = engine.request(a)->output_token_ids.size();
  bool a_aborted = false;
  for (const RequestOutput& o : engine.step())
    if (o.request_id == a && o.finished) a_aborted = o.finish_reason == FinishReason::kAborted;
  EXPECT_TRUE(a_aborted);
  EXPECT_EQ(engine.request(a)->output_token_ids.size(), a_tokens);  // no token after the abort
  EXPECT_FALSE(engine.has_unfinished());
}

}  // namespace
}  // namespace origami::testing
