#pragma once
// Log-probabilities under a row of logits (temperature 1, no filters): the raw model
// distribution, log_softmax(logits). Teacher forcing and perplexity report the forced token's;
// the OpenAI `logprobs` fields report the output token's and the top alternatives' (as vLLM
// does by default: before temperature, top-k/p and min-p). Shared by the CPU backend and the
// GPU kernels' tests.
#include <cstdint>
#include <vector>

namespace origami {

// The most alternatives a request may ask for per token (vLLM's default max_logprobs; OpenAI's
// chat API allows 20 top_logprobs).
inline constexpr int kMaxTopLogprobs = 20;

struct TopLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

// One output token: its log-probability and the `num_top` most likely tokens of the row it was
// chosen from (descending log-probability, ties by ascending id).
struct TokenLogprobs {
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
};

// log softmax(logits)[token], stable: max-shifted, the sum accumulated in double. NaN logits
// count as -inf. `token` must be in [0, vocab).
float log_softmax_at(const float* logits, int vocab, int32_t token);

// token's log-probability and the top `num_top` (0..kMaxTopLogprobs, at most vocab) with one
// normalizer for the row; every value has the arithmetic of log_softmax_at. A token < 0 (no
// token chosen) gets NaN.
TokenLogprobs token_logprobs(const float* logits, int vocab, int32_t token, int num_top);

}  // namespace origami
