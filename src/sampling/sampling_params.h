#pragma once
// Per-request decoding parameters, with the meanings vLLM gives them.
#include <cstdint>
#include <optional>
#include <string>
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

  // Below this temperature sampling is greedy: dividing logits by a tiny temperature only
  // amplifies rounding noise, and the argmax is what such a request asks for.
  static constexpr float kGreedyTemperature = 1e-5f;

  bool is_greedy() const { return temperature < kGreedyTemperature || top_k == 1; }
  // Rejects NaN/inf/negative temperature, top_p outside (0, 1], min_p outside [0, 1], top_k < -1,
  // max_tokens < 1, empty stop strings, negative stop token ids; the message names the field
  // and the value.
  Status validate() const;
};

}  // namespace origami
