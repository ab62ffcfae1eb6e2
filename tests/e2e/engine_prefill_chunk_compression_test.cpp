// Prefill chunk compression (`prefill_chunk_compression`, policy/triggers.h): a long prompt
// prefilled in chunks is compressed after every chunk once it holds more entries than its
// threshold, so its KV never exceeds the threshold plus one chunk (plus block rounding):
//   - peak KV blocks of a 320-token prompt in chunks of 32 stay within ceil((T + 32) / 16) + 1,
//     where without the option the whole prompt is held, with synchronous and with deferred
//     (async) compression, which give the same tokens;
//   - a prompt longer than the whole KV pool completes with the option (with and without budget
//     reservation) and is refused without it.
#include <random>

#include "deferred_compression_backend.h"
#include "engine_test_util.h"
#include "policy/kv_budget.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;
constexpr int kBudget = 64;
constexpr int kChunk = 32;
constexpr int kPromptLength = 320;

std::vector<int32_t> long_prompt(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(kPromptLength);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % 8000 + 3);
  return tokens;
}

EngineConfig chunk_config(const std::string& policy, bool chunk_compression, bool async) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.block_size = kBlock;
  c.kv_policy = policy;
  c.kv_budget = kBudget;
  c.kv_policy_options = {{"prefill_chunk_compression", chunk_compression ? "1" : "0"}};
  c.max_num_batched_tokens = kChunk;
  c.async_compression = async;
  return c;
}

// The entry count above which a chunk's end compresses (KVPolicy::prefill_chunk_threshold).
int threshold(const std::string& policy) {
  return policy == "snapkv" ? kBudget : max_blocks_for_budget(kBudget, kBlock) * kBlock - 1;
}

struct ChunkRun {
  int peak_blocks = 0;             // KV blocks in use, at most, over the run
  int mid_prompt_compressions = 0; // compressions reported while the prompt was still prefilling
  std::vector<int32_t> output;
  FinishReason finish = FinishReason::kNone;
};

ChunkRun run_one(Engine& engine, const std::vector<int32_t>& prompt, int max_tokens) {
  ChunkRun run;
  auto id = engine.add_request(prompt, greedy(max_tokens));
  EXPECT_TRUE(id.has_value()) << id.status().to_string();
  if (!id) return run;
  int compressions = 0;
  for (int step = 0; engine.has_unfinished(); ++step) {
    EXPECT_LT(step, 1000) << "no progress";
    if (step >= 1000) break;
    for (const RequestOutput& out : engine.step()) EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
    run.peak_blocks = std::max(run.peak_blocks, engine.num_kv_blocks_used());
    const Request* r = engine.request(*id);
    if (r->compression.num_compressions > compressions && r->is_prefilling()) ++run.mid_prompt_compressions;
    compressions = r->compression.num_compressions;
  }
  const Request* r = engine.request(*id);
  run.output = r->output_token_ids;
  run.finish = r->finish_reason;
  return run;
}

TEST(EnginePrefillChunkCompression, PeakKvIsTheThresholdPlusOneChunk) {
  const std::vector<int32_t> prompt = long_prompt(5);
  for (const std::string policy : {"keydiff", "snapkv", "zipage"}) {
    SCOPED_TRACE(policy);
    // Without the option the whole prompt is held before it is compressed.
    auto whole = make_engine(chunk_config(policy, false, false));
    ASSERT_NE(whole, nullptr);
    const ChunkRun without = run_one(*whole, prompt, 8);
    EXPECT_EQ(without.mid_prompt_compressions, 0);
    EXPECT_GE(without.peak_blocks, kPromptLength / kBlock);

    auto sync_engine = make_engine(chunk_config(policy, true, false));
    ASSERT_NE(sync_engine, nullptr);
    const ChunkRun synced = run_one(*sync_engine, prompt, 8);
    // Chunks of 32 ending above T compress: one every chunk after the first T entries (the
    // compressions seen while prefilling; the last one starts with the prompt's last chunk).
    EXPECT_GE(synced.mid_prompt_compressions, (kPromptLength - threshold(policy)) / kChunk - 2);
    const int bound = (threshold(policy) + kChunk + kBlock - 1) / kBlock + 1;  // + 1: a spare block
    EXPECT_LE(synced.peak_blocks, bound);
    EXPECT_EQ(synced.finish, FinishReason::kLength);
    EXPECT_EQ(synced.output.size(), 8u);

    // Deferred compression: the request waits for each chunk's compression, same tokens.
    int deferred = 0;
    auto async_engine = Engine::create(chunk_config(policy, true, true), std::make_unique<DeferredCompressionBackend>(2, &deferred));
    ASSERT_TRUE(async_engine.has_value()) << async_engine.status().to_string();
    const ChunkRun deferred_run = run_one(**async_engine, prompt, 8);
    EXPECT_LE(deferred_run.peak_blocks, bound);
    EXPECT_GT(deferred_run.mid_prompt_compressions, 0);
    EXPECT_EQ(deferred_run.output, synced.output);
    EXPECT_EQ((*async_engine)->metrics().num_compressions, sync_engine->metrics().num_compressions);
  }
}

// chunk_slack (prefill-end policies): each chunk keeps budget x (1 + slack) entries, the prompt's end
// the budget, chosen by the prompt's last window among what the chunks kept.
TEST(EnginePrefillChunkCompression, ChunkSlackBoundsThePeakAndEndsAtTheBudget) {
  const std::vector<int32_t> prompt = long_prompt(5);
  auto whole = make_engine(chunk_config("snapkv", false, false));
  ASSERT_NE(whole, nullptr);
  const ChunkRun reference = run_one(*whole, prompt, 8);
  for (const std::string slack : {"1", "8"}) {
    SCOPED_TRACE("chunk_slack=" + slack);
    EngineConfig c = chunk_config("snapkv", true, false);
    c.kv_policy_options["chunk_slack"] = slack;
    auto engine = make_engine(c);
    ASSERT_NE(engine, nullptr);
    auto id = engine->add_request(prompt, greedy(8));
    ASSERT_TRUE(id.has_value()) << id.status().to_string();
    const int chunk_keep = kBudget * (1 + std::stoi(slack));
    int peak = 0, mid_prompt = 0, compressions = 0, most_after_prompt = 0;
    for (int step = 0; engine->has_unfinished() && step < 1000; ++step) {
      for (const RequestOutput& out : engine->step()) EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
      peak = std::max(peak, engine->num_kv_blocks_used());
      const Request* r = engine->request(*id);
      if (r->compression.num_compressions > compressions && r->is_prefilling()) ++mid_prompt;
      compressions = r->compression.num_compressions;
      // Once the prompt's compression is done the cache holds the budget, plus what was decoded.
      if (!r->is_prefilling() && r->compression.prefill_checked && !r->compression.pending && !r->compression.in_flight &&
          r->status == RequestStatus::kRunning)
        most_after_prompt = std::max(most_after_prompt, r->kv.num_entries(0) - static_cast<int>(r->output_token_ids.size()));
    }
    const Request* r = engine->request(*id);
    EXPECT_EQ(r->finish_reason, FinishReason::kLength);
    EXPECT_LE(most_after_prompt, kBudget);
    EXPECT_GT(most_after_prompt, 0);
    EXPECT_LE(peak, (std::min(chunk_keep, kPromptLength) + kChunk + kBlock - 1) / kBlock + 1);  // + 1: a spare block
    if (chunk_keep >= kPromptLength) {
      // No chunk drops anything: the prompt's end compresses the whole prompt, as without chunks.
      EXPECT_EQ(mid_prompt, 0);
      EXPECT_EQ(r->output_token_ids, reference.output);
      EXPECT_EQ(engine->metrics().num_compressions, whole->metrics().num_compressions);
    } else {
      EXPECT_GT(mid_prompt, 0);
      EXPECT_GT(peak, (kBudget + kChunk) / kBlock);  // it does hold more than the budget + one chunk
    }
  }
}

TEST(EnginePrefillChunkCompression, PromptLongerThanThePoolCompletes) {
  const std::vector<int32_t> prompt = long_prompt(9);
  for (bool reserve : {false, true}) {
    SCOPED_TRACE(reserve ? "reserving" : "not reserving");
    EngineConfig c = chunk_config("keydiff", true, false);
    c.num_kv_blocks = 12;  // 192 tokens: the prompt's 320 never fit, 79 + 32 do
    c.reserve_bounded_kv = reserve;
    auto engine = make_engine(c);
    ASSERT_NE(engine, nullptr);
    const ChunkRun run = run_one(*engine, prompt, 16);
    EXPECT_EQ(run.finish, FinishReason::kLength);
    EXPECT_EQ(run.output.size(), 16u);
    EXPECT_GT(run.mid_prompt_compressions, 0);
    EXPECT_EQ(engine->num_kv_blocks_used(), 0);
  }
  // Without chunk compression the whole prompt must fit: refused.
  EngineConfig c = chunk_config("keydiff", false, false);
  c.num_kv_blocks = 12;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  auto id = engine->add_request(prompt, greedy(16));
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().to_string().find("KV blocks"), std::string::npos) << id.status().to_string();
}

}  // namespace
}  // namespace origami::testing
