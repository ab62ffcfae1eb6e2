#pragma once
// One engine run for the GPU engine tests: greedy generation of every prompt (optionally
// teacher-forced), collecting tokens, forced log-probabilities and the compression count, with
// the checks every such run makes (no request error, no KV block leaked).
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine/engine.h"

namespace origami::testing {

struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> forced_logprobs;
  int64_t compressions = 0;
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
  EXPECT_EQ((*engine)->num_kv_blocks_used(), 0) << "KV blocks leaked";
  return r;
}

}  // namespace origami::testing
