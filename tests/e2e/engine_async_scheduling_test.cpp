// Asynchronous scheduling (EngineConfig::async_scheduling) against the engine's one step at a
// time, on the CPU backend: step N+1 is planned and launched before step N's tokens are known,
// reads them as pending tokens, and a request's end is seen a step late. Each request's tokens,
// text and finish reason must equal the synchronous engine's (the CPU backend computes each
// sequence alone, so the one-step shift in the schedule changes no result), across sampling,
// stop tokens and strings, preemption, prefix caching, retained contexts, aborts and compression
// (whose batches may also finish steps after they start: DeferredCompressionBackend).
#include <map>
#include <random>

#include "async_launch_backend.h"
#include "deferred_compression_backend.h"
#include "engine/batch_runner.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

// Prompts of 4-80 tokens, half of them sharing a 40-token prefix; greedy and seeded sampling.
std::vector<BatchItem> items(uint32_t seed, int n, bool sampled) {
  std::mt19937 rng(seed);
  std::vector<int32_t> shared(40);
  for (auto& t : shared) t = static_cast<int32_t>(rng() % 8000 + 3);
  std::vector<BatchItem> out;
  for (int i = 0; i < n; ++i) {
    BatchItem item;
    const int len = 4 + static_cast<int>(rng() % 76);
    if (i % 2 == 0) item.prompt_token_ids.assign(shared.begin(), shared.begin() + std::min(len, 40));
    while (static_cast<int>(item.prompt_token_ids.size()) < len) item.prompt_token_ids.push_back(static_cast<int32_t>(rng() % 8000 + 3));
    item.sampling = greedy(10 + static_cast<int>(rng() % 60));
    if (sampled && i % 3 != 0) {
      item.sampling.temperature = 0.8f;
      item.sampling.top_p = 0.9f;
      item.sampling.seed = 1000 + i;
    }
    out.push_back(item);
  }
  return out;
}

void expect_same_results(const std::vector<BatchResult>& got, const std::vector<BatchResult>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got[i].ok, expected[i].ok) << got[i].error;
    EXPECT_EQ(got[i].output_token_ids, expected[i].output_token_ids);
    EXPECT_EQ(got[i].text, expected[i].text);
    EXPECT_EQ(got[i].finish_reason, expected[i].finish_reason);
  }
}

struct EngineRun {
  std::vector<BatchResult> results;
  EngineMetrics metrics;
};

EngineRun run(EngineConfig config, bool async, const std::vector<BatchItem>& batch, std::unique_ptr<Backend> backend = nullptr) {
  config.async_scheduling = async;
  auto engine = backend ? Engine::create(config, std::move(backend)) : Engine::create(config);
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  if (!engine) return {};
  EngineRun r{run_batch(**engine, batch), (*engine)->metrics()};
  EXPECT_FALSE((*engine)->has_unfinished());
  return r;
}

TEST(EngineAsyncScheduling, GreedyAndSampledTokensEqualOneStepAtATime) {
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "prefix caching" : "no prefix caching");
    EngineConfig c = cpu_config(tiny_qwen3_dir());
    c.enable_prefix_caching = prefix;
    c.max_num_batched_tokens = 64;  // prompts in chunks: decodes and prefill chunks share steps
    const std::vector<BatchItem> batch = items(7, 12, /*sampled=*/true);
    const EngineRun sync = run(c, false, batch);
    const EngineRun async = run(c, true, batch);
    expect_same_results(async.results, sync.results);
    EXPECT_EQ(sync.metrics.num_pipelined_steps, 0);
    // Nearly every step is launched before the last one's tokens are known.
    EXPECT_GT(async.metrics.num_pipelined_steps, async.metrics.num_steps * 9 / 10);
    EXPECT_EQ(async.metrics.num_generated_tokens, sync.metrics.num_generated_tokens);
  }
}

// A request whose last token is on its way leaves its place among max_num_seqs to a waiting
// request at once, as one step at a time: waves of requests take the same number of steps.
TEST(EngineAsyncScheduling, AFinishingRequestLeavesItsPlaceAtOnce) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_num_seqs = 2;
  std::vector<BatchItem> batch = items(29, 7, /*sampled=*/false);
  for (size_t i = 0; i < batch.size(); ++i) batch[i].sampling.max_tokens = 8 + 3 * static_cast<int>(i);  // staggered ends
  const EngineRun sync = run(c, false, batch);
  const EngineRun async = run(c, true, batch);
  expect_same_results(async.results, sync.results);
  EXPECT_EQ(async.metrics.num_steps, sync.metrics.num_steps);
  EXPECT_GT(async.metrics.num_pipelined_steps, sync.metrics.num_steps / 2);
}

// EOS, stop tokens and stop strings end requests a step late: the token sampled after the end is
// dropped, and the text and finish reason are the synchronous engine's.
TEST(EngineAsyncScheduling, RequestsEndingByEosStopTokensAndStringsEqualOneStepAtATime) {
  EngineConfig c = cpu_config(stories_dir());
  std::vector<BatchItem> batch = items(11, 12, /*sampled=*/true);
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  const int vocab = engine->model_config().vocab_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (int32_t& t : batch[i].prompt_token_ids) t %= vocab;
    SamplingParams& p = batch[i].sampling;
    p.max_tokens = 80;
    p.ignore_eos = false;
    if (i % 4 == 1) p.stop_token_ids = {13};  // a newline in stories260k's vocabulary
    if (i % 4 == 2) p.stop = {"the", "."};
  }
  const EngineRun sync = run(c, false, batch);
  const EngineRun async = run(c, true, batch);
  expect_same_results(async.results, sync.results);
  int ended_early = 0;
  for (const BatchResult& r : sync.results) ended_early += r.finish_reason != FinishReason::kLength;
  EXPECT_GE(ended_early, 3) << "the workload should end requests by EOS or stops";
}

// A pool too small for every request at once: requests are preempted (with a token pending) and
// recomputed, and a request readmitted in the step that preempted it reads its pending token.
TEST(EngineAsyncScheduling, PreemptionsGiveTheSameTokens) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.num_kv_blocks = 24;
  const std::vector<BatchItem> batch = items(5, 10, /*sampled=*/true);
  const EngineRun sync = run(c, false, batch);
  const EngineRun async = run(c, true, batch);
  expect_same_results(async.results, sync.results);
  EXPECT_GT(async.metrics.num_preemptions, 0);
  EXPECT_GT(async.metrics.num_pipelined_steps, 0);
}

// Compression under every kind of trigger and selection, its batches finishing at once or steps
// after they start: a token sampled before a compression that starts after its step is held until
// the compression is done (it may end the request, whose pages the compression reads).
TEST(EngineAsyncScheduling, CompressedRequestsGiveTheSameTokens) {
  struct Case {
    std::string policy;
    PolicyOptionMap options;
    int heads_per_group;
  };
  const std::vector<Case> cases = {
      {"zipage", {}, 0},
      {"pagedeviction", {}, 0},
      {"snapkv", {}, 0},
      {"fastkvzip", {{"allocation", "global"}, {"window", "16"}, {"prefill_chunk_compression", "0"}}, 1},
  };
  for (const Case& k : cases) {
    for (int delay : {0, 2}) {
      SCOPED_TRACE(k.policy + " compression reported " + std::to_string(delay) + " polls late");
      EngineConfig c = cpu_config(tiny_qwen3_dir());
      c.kv_policy = k.policy;
      c.kv_budget = 40;
      c.kv_policy_options = k.options;
      c.heads_per_group = k.heads_per_group;
      c.async_compression = delay > 0;
      if (k.policy == "fastkvzip") c.kv_gates = tiny_qwen3_gates();
      std::vector<BatchItem> batch = items(3, 10, /*sampled=*/false);
      for (size_t i = 0; i < batch.size(); ++i) {
        batch[i].sampling.max_tokens = 40 + static_cast<int>(i) * 5;
        if (i % 3 == 1) batch[i].sampling.ignore_eos = false;
      }
      auto backend = [&]() -> std::unique_ptr<Backend> {
        if (delay == 0) return nullptr;
        static int deferred = 0;
        return std::make_unique<DeferredCompressionBackend>(delay, &deferred);
      };
      const EngineRun sync = run(c, false, batch, backend());
      const EngineRun async = run(c, true, batch, backend());
      expect_same_results(async.results, sync.results);
      // A request that ends by EOS may start one more compression in the step launched after its
      // end (which the synchronous engine never schedules); otherwise the same compressions.
      int ended_by_eos = 0;
      for (const BatchResult& r : sync.results) ended_by_eos += r.finish_reason == FinishReason::kEos;
      EXPECT_GE(async.metrics.num_compressions, sync.metrics.num_compressions);
      EXPECT_LE(async.metrics.num_compressions, sync.metrics.num_compressions + ended_by_eos);
      EXPECT_GT(sync.metrics.num_compressions, 0);
      EXPECT_GT(async.metrics.num_pipelined_steps, 0);
    }
  }
}

// A request's second turn continues its retained context: the first turn's KV (its computed
// tokens) is what the synchronous engine keeps, whatever a step launched after its end wrote. One
// first turn only retains its prompt (the token sampled at its end is not wanted).
TEST(EngineAsyncScheduling, RetainedContextsContinueTheSame) {
  for (const std::string policy : {"full", "snapkv"}) {
    SCOPED_TRACE(policy);
    EngineConfig c = cpu_config(tiny_qwen3_dir());
    c.retain_contexts = true;
    c.enable_prefix_caching = true;
    c.kv_policy = policy;
    c.kv_budget = 48;

    std::vector<std::vector<BatchResult>> turns[2];
    for (bool async : {false, true}) {
      c.async_scheduling = async;
      auto engine = make_engine(c);
      ASSERT_NE(engine, nullptr);
      std::vector<BatchItem> first = items(13, 4, /*sampled=*/false);
      for (BatchItem& item : first) item.sampling.ignore_eos = false;
      first[0].options.retain_only = true;  // its prompt retained, nothing generated
      const std::vector<BatchResult> a = run_batch(*engine, first);
      std::vector<BatchItem> second = first;
      for (size_t i = 0; i < second.size(); ++i) {
        std::vector<int32_t>& p = second[i].prompt_token_ids;
        p.insert(p.end(), a[i].output_token_ids.begin(), a[i].output_token_ids.end());
        for (int32_t t : {101, 202, 303}) p.push_back(t);
      }
      const std::vector<BatchResult> b = run_batch(*engine, second);
      EXPECT_GT(engine->metrics().num_retained_hits, 0);
      turns[async ? 1 : 0] = {a, b};
    }
    expect_same_results(turns[1][0], turns[0][0]);
    expect_same_results(turns[1][1], turns[0][1]);
  }
}

// Penalties, logit_bias and forced tokens need each token on the host before the next step:
// while such a request runs, steps run one at a time, and the results are the synchronous ones.
TEST(EngineAsyncScheduling, RequestsNeedingTheirTokensRunStepsOneAtATime) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  std::vector<BatchItem> batch = items(17, 6, /*sampled=*/true);
  batch[1].sampling.repetition_penalty = 1.3f;
  batch[3].options.forced_output_tokens = {5, 6, 7, 8};
  const EngineRun sync = run(c, false, batch);
  const EngineRun async = run(c, true, batch);
  expect_same_results(async.results, sync.results);
  // Pipelined only after both have finished.
  EXPECT_LT(async.metrics.num_pipelined_steps, async.metrics.num_steps / 2);
  // With neither, every step but the last few is pipelined.
  std::vector<BatchItem> plain = items(17, 6, /*sampled=*/true);
  EXPECT_GT(run(c, true, plain).metrics.num_pipelined_steps, 10);
  // A min_tokens mask stops adjusting once reached; the engine pipelines again once the request
  // that had it is done.
  c.async_scheduling = true;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  std::vector<BatchItem> masked = items(17, 2, /*sampled=*/false);
  masked[0].sampling.min_tokens = 3;
  masked[0].sampling.ignore_eos = false;  // EOS masked for its first 3 tokens
  for (const BatchResult& r : run_batch(*engine, masked)) EXPECT_TRUE(r.ok) << r.error;
  const int64_t before = engine->metrics().num_pipelined_steps;
  run_batch(*engine, plain);
  EXPECT_GT(engine->metrics().num_pipelined_steps, before + 10);
}

// Aborts while a step is launched: the aborted request ends "aborted" with the tokens it had,
// the others are unaffected, and the engine drains.
TEST(EngineAsyncScheduling, AbortsWhileAStepIsLaunched) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.async_scheduling = true;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  std::vector<RequestId> ids;
  for (const BatchItem& item : items(19, 6, /*sampled=*/false)) {
    SamplingParams p = item.sampling;
    p.max_tokens = 50;
    auto id = engine->add_request(item.prompt_token_ids, p);
    ASSERT_TRUE(id.has_value());
    ids.push_back(*id);
  }
  std::map<RequestId, FinishReason> finished;
  std::map<RequestId, int> tokens;
  for (int step = 0; engine->has_unfinished(); ++step) {
    ASSERT_LT(step, 1000);
    if (step == 8) {
      engine->abort_request(ids[1]);
      engine->abort_request(ids[4]);
    }
    for (const RequestOutput& out : engine->step()) {
      tokens[out.request_id] += static_cast<int>(out.new_token_ids.size());
      if (out.finished) finished[out.request_id] = out.finish_reason;
    }
  }
  ASSERT_EQ(finished.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool aborted = i == 1 || i == 4;
    EXPECT_EQ(finished[ids[i]], aborted ? FinishReason::kAborted : FinishReason::kLength) << i;
    if (aborted) EXPECT_LT(tokens[ids[i]], 50);
    else EXPECT_EQ(tokens[ids[i]], 50);
    EXPECT_EQ(static_cast<int>(engine->request(ids[i])->output_token_ids.size()), tokens[ids[i]]);
  }
  EXPECT_EQ(engine->num_kv_blocks_used(), 0);
}

// A request aborted while its compression is in flight and a token of it is held: the abort waits
// for the compression, the held token is dropped, and the engine drains with every page back.
TEST(EngineAsyncScheduling, AbortOfACompressingRequestWithAHeldToken) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.kv_policy = "zipage";
  c.kv_budget = 40;
  c.async_compression = true;
  c.async_scheduling = true;
  int deferred = 0;
  auto created = Engine::create(c, std::make_unique<DeferredCompressionBackend>(1000, &deferred));
  ASSERT_TRUE(created.has_value()) << created.status().to_string();
  Engine& engine = **created;
  const RequestId a = *engine.add_request(items(5, 1, false)[0].prompt_token_ids, greedy(100));
  const RequestId b = *engine.add_request({5, 6, 7}, greedy(100));
  for (int i = 0; i < 200 && !engine.request(a)->compression.in_flight; ++i) engine.step();
  ASSERT_TRUE(engine.request(a)->compression.in_flight);
  engine.step();  // takes the token a sampled before its compression started: held
  EXPECT_FALSE(engine.request(a)->is_finished());
  engine.abort_request(a);
  engine.abort_request(b);
  std::map<RequestId, FinishReason> finished;
  for (int i = 0; i < 50 && engine.has_unfinished(); ++i)
    for (const RequestOutput& out : engine.step())
      if (out.finished) finished[out.request_id] = out.finish_reason;
  EXPECT_FALSE(engine.has_unfinished());
  EXPECT_EQ(finished[a], FinishReason::kAborted);
  EXPECT_EQ(finished[b], FinishReason::kAborted);
  EXPECT_EQ(engine.num_kv_blocks_used(), 0);
  EXPECT_GT(deferred, 0);
}

// A step with prompt tokens is long, and a GPU backend's launch of it can hold the host for most of
// it: the step in flight finishes before such a step is launched, so its tokens (often a first
// token) do not wait for the prefill. Decode steps stay launched ahead.
TEST(EngineAsyncScheduling, StepsWithPromptTokensLaunchOnceTheStepInFlightIsDone) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_num_seqs = 3;               // waves: prompts join while others decode
  c.max_num_batched_tokens = 48;    // and longer prompts take several chunks
  const std::vector<BatchItem> batch = items(41, 10, /*sampled=*/true);
  const EngineRun sync = run(c, false, batch);
  auto backend = std::make_unique<AsyncLaunchCpuBackend>();
  const AsyncLaunchCpuBackend* launches = backend.get();
  c.async_scheduling = true;
  auto engine = Engine::create(c, std::move(backend));
  ASSERT_TRUE(engine.has_value()) << engine.status().to_string();
  expect_same_results(run_batch(**engine, batch), sync.results);
  int prompt_steps = 0, decode_steps_ahead = 0;
  for (const AsyncLaunchCpuBackend::LaunchRecord& l : launches->launches()) {
    if (!l.decode_only) {
      ++prompt_steps;
      EXPECT_EQ(l.unfinished, 0) << "a step with prompt tokens was launched behind an unfinished one";
    } else {
      decode_steps_ahead += l.unfinished == 1;
    }
    EXPECT_LE(l.unfinished, 1);
  }
  EXPECT_GE(prompt_steps, 10) << "the workload should mix prompts into decoding";
  EXPECT_GT(decode_steps_ahead, static_cast<int>(launches->launches().size()) / 2);
  EXPECT_GT((*engine)->metrics().num_pipelined_steps, 0);
}

}  // namespace
}  // namespace origami::testing
