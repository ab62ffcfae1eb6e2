// Penalties, min_tokens and logit_bias on the GPU against the CPU:
//   - the sampling kernel with logit adjustments picks the CPU's token (LogitAdjustments::apply
//     then the sampler; greedy exactly, sampled with at most one rounding-edge mismatch per
//     configuration as in cuda_kernels_test) and leaves the raw logits in place afterwards;
//   - the CUDA engine honours them: CUDA graphs on and off give the same tokens, logit_bias +100
//     forces its token, min_tokens delays a forced EOS, penalties change the greedy output.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "backend/cuda/sampling_kernels.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "sampling/logit_adjustments.h"
#include "sampling/sampler.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;

struct RowCase {
  SamplingParams params;
  LogitAdjustments adjustments;
};

// Random penalties, bias, min_tokens and histories for `rows` rows over `vocab` tokens.
std::vector<RowCase> random_rows(std::mt19937& rng, int rows, int vocab, const SamplingParams& sampling) {
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  auto token = [&] { return static_cast<int32_t>(rng() % std::min(vocab, 300)); };
  std::vector<RowCase> out;
  for (int r = 0; r < rows; ++r) {
    SamplingParams p = sampling;
    p.max_tokens = 64;
    if (r % 5 != 4) {  // every fifth row has no adjustments
      p.repetition_penalty = r % 3 == 0 ? 1.0f : 0.3f + 1.7f * unit(rng);
      p.frequency_penalty = -2.0f + 4.0f * unit(rng);
      p.presence_penalty = -2.0f + 4.0f * unit(rng);
      p.min_tokens = static_cast<int>(rng() % 8);
      p.stop_token_ids = {token()};
      for (int i = 0; i < 4; ++i) {
        const int32_t t = token();
        bool seen = false;
        for (const auto& e : p.logit_bias) seen = seen || e.first == t;
        if (!seen) p.logit_bias.emplace_back(t, -10.0f + 20.0f * unit(rng));
      }
    }
    std::vector<int32_t> prompt(1 + rng() % 200);
    for (int32_t& t : prompt) t = token();
    const std::vector<int32_t> eos = {token()};
    RowCase c{p, LogitAdjustments(p, prompt, eos, vocab)};
    const int outputs = static_cast<int>(rng() % 40);
    for (int i = 0; i < outputs; ++i) c.adjustments.add_output_token(token());
    out.push_back(std::move(c));
  }
  return out;
}

TEST(CudaSamplingPenalties, KernelMatchesCpuAndRestoresLogits) {
  std::mt19937 rng(77);
  struct Config {
    float temperature;
    int top_k;
    float top_p;
  };
  const Config configs[] = {{0.0f, 0, 1.0f}, {1.0f, 0, 1.0f}, {0.7f, 40, 0.95f}, {1.2f, 0, 0.9f}};
  for (int vocab : {97, 4097, 151936}) {
    const int rows = vocab > 10000 ? 16 : 64;
    for (const Config& cfg : configs) {
      SamplingParams sampling;
      sampling.temperature = cfg.temperature;
      sampling.top_k = cfg.top_k;
      sampling.top_p = cfg.top_p;
      const std::vector<RowCase> cases = random_rows(rng, rows, vocab, sampling);
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::normal_distribution<float> dist(0.0f, 3.0f);
      for (float& x : logits) x = dist(rng);
      std::vector<RowSamplingParams> params(rows);
      std::vector<LogitAdjustment> entries;
      const uint64_t seed = rng();
      for (int r = 0; r < rows; ++r) {
        const RowCase& c = cases[r];
        params[r].temperature = c.params.temperature;
        params[r].top_k = c.params.top_k;
        params[r].top_p = c.params.top_p;
        params[r].greedy = c.params.is_greedy() ? 1 : 0;
        params[r].u = sampling_uniform(seed, r);
        params[r].adjust_begin = static_cast<int>(entries.size());
        params[r].adjust_count = static_cast<int>(c.adjustments.entries().size());
        params[r].repetition_penalty = c.adjustments.repetition_penalty();
        params[r].presence_penalty = c.adjustments.presence_penalty();
        entries.insert(entries.end(), c.adjustments.entries().begin(), c.adjustments.entries().end());
      }
      ASSERT_FALSE(entries.empty());
      DeviceBuffer<float> d_logits(logits);
      DeviceBuffer<RowSamplingParams> d_params(params);
      DeviceBuffer<int32_t> d_tokens(rows);
      DeviceBuffer<LogitAdjustment> d_entries(entries);
      DeviceBuffer<float> d_saved(entries.size());
      d_tokens.poison();
      launch_sample_rows(d_logits.get(), rows, vocab, vocab, d_params.get(), d_tokens.get(), nullptr,
                         d_entries.get(), d_saved.get());
      const std::vector<int32_t> got = d_tokens.download();
      const std::vector<float> after = d_logits.download();
      EXPECT_EQ(std::memcmp(after.data(), logits.data(), logits.size() * sizeof(float)), 0)
          << "the raw logits were not restored";
      int mismatches = 0, changed = 0;
      for (int r = 0; r < rows; ++r) {
        std::vector<float> row(logits.begin() + static_cast<size_t>(r) * vocab,
                               logits.begin() + static_cast<size_t>(r + 1) * vocab);
        const int32_t raw_token = sample_token(row.data(), vocab, cases[r].params, seed, r);
        cases[r].adjustments.apply(row.data());
        const int32_t want = sample_token(row.data(), vocab, cases[r].params, seed, r);
        changed += want != raw_token;
        if (cases[r].params.is_greedy()) {
          EXPECT_EQ(got[r], want) << "vocab " << vocab << " row " << r;
        } else if (got[r] != want) {
          ++mismatches;
        }
      }
      EXPECT_LE(mismatches, 1) << "vocab " << vocab << " T " << cfg.temperature;
      // The test's power: the adjustments must change the answer in a good share of rows, or the
      // comparison above would only check unadjusted sampling. How many change depends on the
      // random rows' gaps (measured on the H100, greedy: 15 of 64 rows at a small vocabulary, 3 of 16 at
      // 151936); a sampled draw with the same u moves only where the adjusted mass crosses it.
      if (cfg.temperature == 0.0f) {
        EXPECT_GE(changed, rows / 8) << "the adjustments should change greedy tokens, vocab " << vocab;
      } else {
        EXPECT_GE(changed, 1) << "the adjustments should change some sampled tokens, vocab " << vocab;
      }
    }
  }
}

// The tiny model on the CUDA engine, every request greedy unless said otherwise.
EngineConfig engine_config(const std::string& device, bool graphs) {
  EngineConfig c;
  c.model_dir = testing::shared_dir() + "/models/origami-tiny-qwen3";
  c.device = device;
  c.num_threads = 2;
  c.block_size = 16;
  c.num_kv_blocks = 96;
  c.max_num_seqs = 8;
  c.enable_cuda_graphs = graphs;
  return c;
}

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
};

std::vector<Outcome> run_all(const EngineConfig& config, const std::vector<int32_t>& prompt,
                             const std::vector<SamplingParams>& params) {
  auto engine = Engine::create(config);
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  if (!engine.has_value()) return {};
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    auto id = (*engine)->add_request(prompt, params[i]);
    EXPECT_TRUE(id.has_value()) << id.status().to_string();
    if (id.has_value()) index[*id] = i;
  }
  std::vector<Outcome> out(params.size());
  while ((*engine)->has_unfinished())
    for (const RequestOutput& o : (*engine)->step()) {
      Outcome& oc = out[index.at(o.request_id)];
      oc.tokens.insert(oc.tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) oc.reason = o.finish_reason;
      EXPECT_NE(o.finish_reason, FinishReason::kError) << o.error;
    }
  return out;
}

TEST(CudaSamplingPenalties, EngineHonoursThemWithAndWithoutGraphs) {
  const std::vector<int32_t> prompt = {463, 4592, 301, 270, 5936, 3001, 77, 1200, 8, 4242, 17, 903, 2500, 61, 3333};
  auto probe = Engine::create(engine_config("cpu", false));
  ASSERT_TRUE(probe.has_value());
  const std::vector<int32_t> eos = (*probe)->model_config().eos_token_ids;
  ASSERT_FALSE(eos.empty());
  SamplingParams plain;
  plain.temperature = 0.0f;
  plain.max_tokens = 24;
  plain.ignore_eos = true;
  SamplingParams repetition = plain;
  repetition.repetition_penalty = 1.5f;
  SamplingParams frequency = plain;
  frequency.frequency_penalty = 1.5f;
  frequency.presence_penalty = 0.5f;
  SamplingParams bias = plain;
  bias.logit_bias = {{1234, 100.0f}};
  SamplingParams min_tokens = plain;
  min_tokens.ignore_eos = false;
  min_tokens.logit_bias = {{eos[0], 100.0f}};
  min_tokens.min_tokens = 5;
  SamplingParams sampled = frequency;
  sampled.temperature = 0.8f;
  sampled.seed = 5;
  const std::vector<SamplingParams> params = {plain, repetition, frequency, bias, min_tokens, sampled};
  const std::vector<Outcome> graphs = run_all(engine_config("cuda", true), prompt, params);
  const std::vector<Outcome> eager = run_all(engine_config("cuda", false), prompt, params);
  const std::vector<Outcome> cpu = run_all(engine_config("cpu", false), prompt, params);
  ASSERT_EQ(graphs.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(graphs[i].tokens, eager[i].tokens) << "request " << i;
  EXPECT_NE(graphs[1].tokens, graphs[0].tokens);
  EXPECT_NE(graphs[2].tokens, graphs[0].tokens);
  EXPECT_EQ(graphs[3].tokens, std::vector<int32_t>(24, 1234));
  ASSERT_EQ(graphs[4].tokens.size(), 6u);
  EXPECT_EQ(graphs[4].tokens.back(), eos[0]);
  EXPECT_EQ(graphs[4].reason, FinishReason::kEos);
  EXPECT_EQ(cpu[3].tokens, graphs[3].tokens);
  ASSERT_EQ(cpu[4].tokens.size(), 6u);
  // bf16 on the GPU and fp32 on the CPU drift apart eventually; report how long they agree.
  // Greedy requests must agree on their first token (its CPU logit gap is far above bf16 noise
  // here); a sampled draw on logits that differ by bf16 rounding may part at any token, even the
  // first (measured: request 5 parted at its first token), so it is reported only: the kernel
  // test above checks sampled draws on identical logits.
  for (size_t i = 0; i < params.size(); ++i) {
    size_t agree = 0;
    while (agree < cpu[i].tokens.size() && agree < graphs[i].tokens.size() && cpu[i].tokens[agree] == graphs[i].tokens[agree])
      ++agree;
    std::printf("[penalties] request %zu: CPU and CUDA agree for %zu/%zu tokens\n", i, agree, cpu[i].tokens.size());
    if (params[i].is_greedy()) {
      EXPECT_GE(agree, 1u) << "request " << i;
    }
  }
}

}  // namespace
}  // namespace origami::cuda
