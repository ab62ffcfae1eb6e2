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

  bool is_greedy() const { return temperature <= 0.0f || top_k == 1; }
  // Rejects NaN/negative temperature, top_p outside (0, 1], min_p outside [0, 1], top_k < -1,
  // max_tokens < 1, empty stop strings; the message names the field.
  Status validate() const;
};

}  // namespace origami
