#pragma once
// Per-request decoding parameters, with the meanings vLLM gives them.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace origami {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy
  int top_k = 0;             // 0 or -1: disabled
  float top_p = 1.0f;        // 1: disabled
  float min_p = 0.0f;        // 0: disabled
  std::optional<uint64_t> seed;  // unset: the engine draws one
  int max_tokens = 16;
  bool ignore_eos = false;
  std::vector<std::string> stop;      // stop strings (not included in the output)
  std::vector<int> stop_token_ids;    // stop tokens in addition to EOS
  bool include_stop_str_in_output = false;

  // Logit adjustments (sampling/logit_adjustments.h), vLLM's definitions, applied to the raw
  // logits before temperature and every filter, greedy included:
  float repetition_penalty = 1.0f;  // > 0; tokens in the prompt or output: l > 0 ? l / r : l * r
  float frequency_penalty = 0.0f;   // [-2, 2]; l -= f * (times the token is in the output)
  float presence_penalty = 0.0f;    // [-2, 2]; l -= p if the token is in the output
  int min_tokens = 0;               // EOS and stop_token_ids masked (and stop strings unchecked) until this many outputs
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100]), added to the logit

  static constexpr int kMaxLogitBiasEntries = 300;  // OpenAI's limit
  static constexpr float kMaxLogitBias = 100.0f;
  static constexpr float kMaxFrequencyPresencePenalty = 2.0f;

  // Below this temperature sampling is greedy: dividing logits by a tiny temperature only
  // amplifies rounding noise, and the argmax is what such a request asks for.
  static constexpr float kGreedyTemperature = 1e-5f;

  bool is_greedy() const { return temperature < kGreedyTemperature || top_k == 1; }
  // Any of the penalties is active (they need the request's prompt and output tokens).
  bool has_penalties() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f;
  }
  // Rejects NaN/inf/negative temperature, top_p outside (0, 1], min_p outside [0, 1], top_k < -1,
  // max_tokens < 1, empty stop strings, negative stop token ids, penalties out of range
  // (repetition_penalty <= 0 or not finite, frequency/presence outside [-2, 2]), min_tokens < 0
  // or > max_tokens, logit_bias with more than 300 entries, a negative or repeated id, or a bias
  // outside [-100, 100]; the message names the field and the value. Token ids are checked
  // against the vocabulary by the engine.
  Status validate() const;
};

}  // namespace origami
