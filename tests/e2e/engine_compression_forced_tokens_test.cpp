// Teacher forcing (RequestOptions::forced_output_tokens): forced outputs replace sampled ones,
// ignore EOS and stop conditions, count towards max_tokens, and their reported log-probabilities
// equal the log-softmax of the logits a single teacher-forced prefill (LogitsMode::kAll) gives.
// Also per-request option validation (unknown policy, bad forced ids, bad budgets).
#include <cmath>

#include "backend/backend.h"
#include "engine_test_util.h"
#include "teacher_forced_logits.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami::testing {
namespace {

const std::vector<int32_t> kPrompt = {463, 4592, 301, 270, 5936, 3001, 77, 1200, 8, 4242, 17, 903, 2500, 61, 3333, 12, 99};

struct ForcedRun {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kNone;
};

ForcedRun run_one(Engine& engine, const std::vector<int32_t>& prompt, const SamplingParams& sp, const RequestOptions& opts) {
  ForcedRun run;
  auto id = engine.add_request(prompt, sp, opts);
  EXPECT_TRUE(id.has_value()) << id.status().to_string();
  if (!id) return run;
  while (engine.has_unfinished()) {
    for (const RequestOutput& out : engine.step()) {
      if (out.request_id != *id) continue;
      EXPECT_TRUE(out.forced_logprobs.empty() || out.forced_logprobs.size() == out.new_token_ids.size());
      run.logprobs.insert(run.logprobs.end(), out.forced_logprobs.begin(), out.forced_logprobs.end());
      if (out.finished) run.reason = out.finish_reason;
    }
  }
  run.tokens = engine.request(*id)->output_token_ids;
  return run;
}

// log p(tokens[i] | prompt + tokens[:i]) from one kAll prefill of prompt + tokens[:-1].
std::vector<double> teacher_forced_logprobs(const std::vector<int32_t>& prompt, const std::vector<int32_t>& tokens) {
  std::vector<double> lp;
  const std::vector<std::vector<float>> rows = teacher_forced_logits(prompt, tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float>& row = rows[i];
    double m = row[0];
    for (float x : row) m = std::max<double>(m, x);
    double sum = 0;
    for (float x : row) sum += std::exp(x - m);
    lp.push_back(row[tokens[i]] - m - std::log(sum));
  }
  return lp;
}

TEST(EngineForcedTokens, ForcingTheGreedyContinuationReproducesIt) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  const ForcedRun greedy_run = run_one(*engine, kPrompt, greedy(12), {});
  ASSERT_EQ(greedy_run.tokens.size(), 12u);
  // Sampled at temperature 1, but every output is forced: the tokens are the forced ones.
  SamplingParams hot;
  hot.temperature = 1.0f;
  hot.seed = 7;
  hot.max_tokens = 12;
  RequestOptions opts;
  opts.forced_output_tokens = greedy_run.tokens;
  opts.return_forced_logprobs = true;
  const ForcedRun forced = run_one(*engine, kPrompt, hot, opts);
  EXPECT_EQ(forced.tokens, greedy_run.tokens);
  ASSERT_EQ(forced.logprobs.size(), 12u);
  const std::vector<double> expected = teacher_forced_logprobs(kPrompt, greedy_run.tokens);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(forced.logprobs[i], expected[i], 2e-4) << i;
    EXPECT_LE(forced.logprobs[i], 0.0f);
  }
}

TEST(EngineForcedTokens, LogprobsOfArbitraryTokensMatchTeacherForcing) {
  // Forcing tokens the model would not choose, under a small pool and prefill chunks, with other
  // requests in the batch: the log-probabilities are still exactly teacher forcing's.
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_num_batched_tokens = 7;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  const std::vector<int32_t> forced = {11, 4000, 5, 8191, 300, 300, 300, 2};
  RequestOptions opts;
  opts.forced_output_tokens = forced;
  opts.return_forced_logprobs = true;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->add_request({5, 6, 7, 8, 9}, greedy(10)).has_value());
  const ForcedRun run = run_one(*engine, kPrompt, greedy(8), opts);
  EXPECT_EQ(run.tokens, forced);
  ASSERT_EQ(run.logprobs.size(), forced.size());
  const std::vector<double> expected = teacher_forced_logprobs(kPrompt, forced);
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(run.logprobs[i], expected[i], 2e-4) << i;
}

TEST(EngineForcedTokens, ForcedTokensIgnoreStopsAndCountTowardsMaxTokens) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  const int32_t eos = engine->model_config().eos_token_ids.at(0);
  SamplingParams sp = greedy(3);
  sp.ignore_eos = false;
  sp.stop_token_ids = {42};
  RequestOptions opts;
  opts.forced_output_tokens = {eos, 42, eos, 42, 42};
  ForcedRun run = run_one(*engine, kPrompt, sp, opts);
  EXPECT_EQ(run.tokens, (std::vector<int32_t>{eos, 42, eos}));
  EXPECT_EQ(run.reason, FinishReason::kLength);
  EXPECT_TRUE(run.logprobs.empty());  // not asked for

  // After the forced tokens, sampling resumes from the forced context: the greedy continuation
  // of prompt + forced.
  std::vector<int32_t> extended = kPrompt;
  extended.insert(extended.end(), {100, 200, 300});
  const ForcedRun reference = run_one(*engine, extended, greedy(5), {});
  RequestOptions three;
  three.forced_output_tokens = {100, 200, 300};
  const ForcedRun continued = run_one(*engine, kPrompt, greedy(8), three);
  ASSERT_EQ(continued.tokens.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(continued.tokens.begin() + 3, continued.tokens.end()), reference.tokens);
}

TEST(EngineForcedTokens, InvalidOptionsAreErrorsNamingThem) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  RequestOptions bad_token;
  bad_token.forced_output_tokens = {1, 2, 999999};
  auto r = engine->add_request(kPrompt, greedy(4), bad_token);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("forced_output_tokens[2]"), std::string::npos) << r.status().message();

  RequestOptions unknown;
  unknown.kv_policy = "no-such-policy";
  r = engine->add_request(kPrompt, greedy(4), unknown);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("'no-such-policy'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("zipage"), std::string::npos) << r.status().message();

  RequestOptions bad_opt;
  bad_opt.kv_policy = "zipage";
  bad_opt.kv_policy_options = {{"redundancy", "fast"}};
  r = engine->add_request(kPrompt, greedy(4), bad_opt);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("redundancy=fast"), std::string::npos) << r.status().message();

  RequestOptions bad_budget;
  bad_budget.kv_policy = "zipage";
  bad_budget.kv_budget = -3;
  r = engine->add_request(kPrompt, greedy(4), bad_budget);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("kv_budget"), std::string::npos) << r.status().message();

  bad_budget.kv_budget = 8;  // less than one block of 16
  r = engine->add_request(kPrompt, greedy(4), bad_budget);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("budget 8"), std::string::npos) << r.status().message();

  // `full` with options it does not take, and an accepted full request.
  RequestOptions full_opt;
  full_opt.kv_policy = "full";
  EXPECT_TRUE(engine->add_request(kPrompt, greedy(1), full_opt).has_value());
  full_opt.kv_policy_options = {{"window", "3"}};
  r = engine->add_request(kPrompt, greedy(1), full_opt);
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("unknown option 'window'"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace origami::testing
