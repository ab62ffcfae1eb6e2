#pragma once
// One engine run for the GPU engine tests: greedy generation of every prompt (optionally
// teacher-forced), collecting tokens, forced log-probabilities and the compression count, with
// the checks every such run makes (no request error, no KV block leaked).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/engine.h"

namespace origami::testing {

// origami-tiny-qwen3 with a small pool (96 blocks of 16), 8 sequences, chunked prefill of 64
// tokens and prefix caching: the engine tests' common setting.
inline EngineConfig tiny_qwen3_engine_config(const std::string& device, int heads_per_group, bool graphs) {
  EngineConfig c;
  c.model_dir = cuda::testing::shared_dir() + "/models/origami-tiny-qwen3";
  c.device = device;
  c.num_threads = 2;
  c.block_size = 16;
  c.num_kv_blocks = 96;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;  // chunked prefill
  c.enable_prefix_caching = true;
  c.enable_cuda_graphs = graphs;
  c.heads_per_group = heads_per_group;
  return c;
}

// Four random prompts (token ids 20..900 drawn from `seed`), the first and third starting with
// the same 40-token prefix (prefix-cache hits), of base_len + step * i tokens after it.
inline std::vector<std::vector<int32_t>> shared_prefix_prompts(uint32_t seed, int base_len, int step) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(20, 900);
  std::vector<int32_t> prefix(40);
  for (int32_t& t : prefix) t = tok(rng);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = i % 2 == 0 ? prefix : std::vector<int32_t>{};
    for (int j = 0; j < base_len + step * i; ++j) p.push_back(tok(rng));
    out.push_back(std::move(p));
  }
  return out;
}

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> forced_logprobs;
  int64_t compressions = 0;
  int64_t kept_pages = 0;  // EngineMetrics::num_kept_kv_pages: pages held right after each compaction
};

// Greedy generation of `max_tokens` per prompt; with `forced`, the outputs are teacher-forced.
inline RunResult run(const EngineConfig& c, const std::vector<std::vector<int32_t>>& ps, int max_tokens,
                     const std::vector<std::vector<int32_t>>* forced = nullptr) {
  RunResult r;
  auto engine = Engine::create(c);
  EXPECT_TRUE(engine.has_value()) << engine.status().to_string();
  if (!engine.has_value()) return r;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = max_tokens;
  greedy.ignore_eos = true;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < ps.size(); ++i) {
    RequestOptions options;
    if (forced != nullptr) {
      options.forced_output_tokens = (*forced)[i];
      options.return_forced_logprobs = true;
    }
    auto id = (*engine)->add_request(ps[i], greedy, options);
    EXPECT_TRUE(id.has_value()) << id.status().to_string();
    if (id.has_value()) index[*id] = i;
  }
  r.tokens.resize(ps.size());
  r.forced_logprobs.resize(ps.size());
  while ((*engine)->has_unfinished()) {
    for (const RequestOutput& o : (*engine)->step()) {
      const size_t i = index.at(o.request_id);
      r.tokens[i].insert(r.tokens[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      r.forced_logprobs[i].insert(r.forced_logprobs[i].end(), o.forced_logprobs.begin(), o.forced_logprobs.end());
      EXPECT_NE(o.finish_reason, FinishReason::kError) << o.error;
    }
  }
  r.compressions = (*engine)->metrics().num_compressions;
  r.kept_pages = (*engine)->metrics().num_kept_kv_pages;
  EXPECT_EQ((*engine)->num_kv_blocks_used(), 0) << "KV blocks leaked";
  return r;
}

// Mean |a - b| over every forced log-probability of two teacher-forced runs (the same count per
// prompt expected); infinity when there is none.
inline double mean_abs_diff(const RunResult& a, const RunResult& b) {
  double sum = 0;
  size_t n = 0;
  for (size_t i = 0; i < a.forced_logprobs.size(); ++i) {
    EXPECT_EQ(a.forced_logprobs[i].size(), b.forced_logprobs[i].size());
    for (size_t t = 0; t < std::min(a.forced_logprobs[i].size(), b.forced_logprobs[i].size()); ++t, ++n)
      sum += std::fabs(a.forced_logprobs[i][t] - b.forced_logprobs[i][t]);
  }
  return n ? sum / n : INFINITY;
}

// Two ways of running the same engine that must agree bit for bit: `other`'s greedy tokens
// (max_tokens a prompt) are `base`'s, and the log-probabilities of `base`'s tokens forced through
// each (forced_base, forced_other) are the same floats.
inline void expect_bit_identical_runs(const RunResult& base, const RunResult& forced_base, const RunResult& other,
                                      const RunResult& forced_other, int max_tokens) {
  ASSERT_EQ(other.tokens.size(), base.tokens.size());
  for (size_t i = 0; i < base.tokens.size(); ++i) {
    EXPECT_EQ(static_cast<int>(base.tokens[i].size()), max_tokens) << "prompt " << i;
    EXPECT_EQ(other.tokens[i], base.tokens[i]) << "prompt " << i;
    ASSERT_EQ(forced_other.forced_logprobs[i].size(), forced_base.forced_logprobs[i].size());
    for (size_t t = 0; t < forced_base.forced_logprobs[i].size(); ++t)
      EXPECT_EQ(forced_other.forced_logprobs[i][t], forced_base.forced_logprobs[i][t])
          << "prompt " << i << ", token " << t;
  }
}

}  // namespace origami::testing
