// Penalties, min_tokens and logit_bias through the engine on the tiny model (CPU backend):
// a penalized greedy decode differs from the plain one and is, token by token, the argmax of the
// model's logits adjusted by vLLM's definitions (tests/unit/logit_adjustments_reference.h) over
// the history so far; the logits come from one teacher-forced prefill of prompt + output, which
// the CPU backend computes bit-identically to the engine's decode steps (backend_cpu_invariance_test).
#include <vector>

#include "backend/backend.h"
#include "engine_test_util.h"
#include "teacher_forced_logits.h"
#include "model/config.h"
#include "model/weights.h"
#include "sampling/sampler.h"
#include "unit/logit_adjustments_reference.h"

namespace origami::testing {
namespace {

const std::vector<int32_t> kPrompt = {463, 4592, 301, 270, 5936, 3001, 77, 1200, 8, 4242, 17, 903, 2500, 61, 3333, 12, 99};

struct Decoded {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
};

Decoded run_one(Engine& engine, const std::vector<int32_t>& prompt, const SamplingParams& sp) {
  Decoded run;
  auto id = engine.add_request(prompt, sp);
  EXPECT_TRUE(id.has_value()) << id.status().to_string();
  if (!id) return run;
  while (engine.has_unfinished())
    for (const RequestOutput& out : engine.step())
      if (out.request_id == *id && out.finished) run.reason = out.finish_reason;
  run.tokens = engine.request(*id)->output_token_ids;
  return run;
}

// Every output token is the reference's greedy choice given the outputs before it.
void expect_reference_greedy(const std::vector<int32_t>& prompt, const SamplingParams& sp,
                             const std::vector<int32_t>& eos, const std::vector<int32_t>& tokens) {
  const std::vector<std::vector<float>> rows = teacher_forced_logits(prompt, tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<int32_t> history(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(i));
    const std::vector<float> adjusted = reference_adjusted(rows[i], sp, prompt, history, eos);
    ASSERT_EQ(tokens[i], greedy_token(adjusted.data(), static_cast<int>(adjusted.size()))) << "output " << i;
  }
}

TEST(EngineSamplingPenalties, PenalizedGreedyDecodeDiffersAndMatchesTheReference) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t>& eos = engine->model_config().eos_token_ids;
  const Decoded plain = run_one(*engine, kPrompt, greedy(24));
  ASSERT_EQ(plain.tokens.size(), 24u);
  SamplingParams repetition = greedy(24);
  repetition.repetition_penalty = 1.5f;
  SamplingParams frequency = greedy(24);
  frequency.frequency_penalty = 1.5f;
  frequency.presence_penalty = 0.5f;
  for (const SamplingParams& sp : {repetition, frequency}) {
    const Decoded penalized = run_one(*engine, kPrompt, sp);
    ASSERT_EQ(penalized.tokens.size(), 24u);
    EXPECT_NE(penalized.tokens, plain.tokens);
    expect_reference_greedy(kPrompt, sp, eos, penalized.tokens);
  }
  // Batched beside an unpenalized request, each keeps its own state.
  SamplingParams both = repetition;
  both.frequency_penalty = 0.75f;
  auto a = engine->add_request(kPrompt, both);
  auto b = engine->add_request(kPrompt, greedy(24));
  ASSERT_TRUE(a.has_value() && b.has_value());
  while (engine->has_unfinished()) engine->step();
  EXPECT_EQ(engine->request(*b)->output_token_ids, plain.tokens);
  expect_reference_greedy(kPrompt, both, eos, engine->request(*a)->output_token_ids);
}

TEST(EngineSamplingPenalties, LogitBiasForcesAToken) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  const Decoded plain = run_one(*engine, kPrompt, greedy(8));
  const int32_t forced = plain.tokens[0] == 1234 ? 1235 : 1234;
  SamplingParams sp = greedy(8);
  sp.logit_bias = {{forced, 100.0f}};
  EXPECT_EQ(run_one(*engine, kPrompt, sp).tokens, std::vector<int32_t>(8, forced));
  // Sampled at temperature 1 too: +100 leaves every other token e^-80 or less.
  sp.temperature = 1.0f;
  sp.seed = 3;
  EXPECT_EQ(run_one(*engine, kPrompt, sp).tokens, std::vector<int32_t>(8, forced));
  // A token id outside the vocabulary is refused by name.
  sp.logit_bias = {{engine->model_config().vocab_size, 1.0f}};
  auto bad = engine->add_request(kPrompt, sp);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("logit_bias"), std::string::npos) << bad.status().message();
}

TEST(EngineSamplingPenalties, MinTokensDelaysEos) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t>& eos = engine->model_config().eos_token_ids;
  ASSERT_FALSE(eos.empty());
  // EOS pushed to the top: without min_tokens the request ends at once.
  SamplingParams sp = greedy(20);
  sp.ignore_eos = false;
  sp.logit_bias = {{eos[0], 100.0f}};
  const Decoded immediate = run_one(*engine, kPrompt, sp);
  EXPECT_EQ(immediate.tokens, std::vector<int32_t>{eos[0]});
  EXPECT_EQ(immediate.reason, FinishReason::kEos);
  // With min_tokens = 5, EOS is masked for five tokens and comes sixth.
  sp.min_tokens = 5;
  const Decoded delayed = run_one(*engine, kPrompt, sp);
  ASSERT_EQ(delayed.tokens.size(), 6u);
  EXPECT_EQ(delayed.tokens.back(), eos[0]);
  EXPECT_EQ(delayed.reason, FinishReason::kEos);
  for (int i = 0; i < 5; ++i)
    for (int32_t e : eos) EXPECT_NE(delayed.tokens[i], e) << i;
  expect_reference_greedy(kPrompt, sp, eos, delayed.tokens);
  // A stop token id is masked the same way.
  SamplingParams stop = greedy(20);
  stop.stop_token_ids = {777};
  stop.logit_bias = {{777, 100.0f}};
  stop.min_tokens = 3;
  const Decoded stopped = run_one(*engine, kPrompt, stop);
  ASSERT_EQ(stopped.tokens.size(), 4u);
  EXPECT_EQ(stopped.tokens.back(), 777);
  EXPECT_EQ(stopped.reason, FinishReason::kStop);
}

}  // namespace
}  // namespace origami::testing
