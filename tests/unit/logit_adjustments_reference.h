#pragma once
// The logit adjustments as vLLM defines them, over the whole vocabulary: the reference that
// sampling/logit_adjustments.h is checked against (unit test: random rows; e2e: the tiny
// model's logits). Files including it are compiled with -ffp-contract=off (tests/CMakeLists.txt)
// so that every step rounds once, as in the code under test.
#include <cstdint>
#include <limits>
#include <vector>

#include "sampling/sampling_params.h"

namespace origami::testing {

// vLLM's sampler, step by step over the whole vocabulary (v1 Sampler.forward: min-tokens and
// logit-bias processors, then apply_penalties: repetition, frequency, presence).
inline std::vector<float> reference_adjusted(const std::vector<float>& raw, const SamplingParams& p,
                                             const std::vector<int32_t>& prompt, const std::vector<int32_t>& output,
                                             const std::vector<int32_t>& eos) {
  const size_t vocab = raw.size();
  std::vector<int> output_count(vocab, 0);
  std::vector<bool> in_prompt(vocab, false);
  for (int32_t t : output) ++output_count[t];
  for (int32_t t : prompt) in_prompt[t] = true;
  std::vector<bool> stop(vocab, false);
  for (int32_t t : p.stop_token_ids) stop[t] = true;
  if (!p.ignore_eos)
    for (int32_t t : eos) stop[t] = true;
  std::vector<float> bias(vocab, 0.0f);
  for (const auto& [t, b] : p.logit_bias) bias[t] = b;
  std::vector<float> out(vocab);
  for (size_t t = 0; t < vocab; ++t) {
    float l = raw[t];
    if (static_cast<int>(output.size()) < p.min_tokens && stop[t]) l = -std::numeric_limits<float>::infinity();
    l = l + bias[t];
    if (in_prompt[t] || output_count[t] > 0) l = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
    const float frequency_term = p.frequency_penalty * static_cast<float>(output_count[t]);
    l = l - frequency_term;
    if (output_count[t] > 0) l = l - p.presence_penalty;
    out[t] = l;
  }
  return out;
}

}  // namespace origami::testing
