#include "sampling/sampling_params.h"

#include <cmath>
#include <cstdio>

namespace origami {
namespace {

// "%g" prints nan/inf readably, which std::to_string does not do for small values.
std::string format_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
  return buf;
}

Status bad_field(const char* field, const std::string& value, const char* requirement) {
  return invalid_argument(std::string("sampling parameter ") + field + " = " + value + " is invalid: " +
                          requirement);
}

}  // namespace

Status SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    return bad_field("temperature", format_float(temperature), "must be finite and >= 0 (0 means greedy)");
  // Written as negated ranges so that NaN fails them too.
  if (!(top_p > 0.0f && top_p <= 1.0f))
    return bad_field("top_p", format_float(top_p), "must be in (0, 1] (1 disables it)");
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    return bad_field("min_p", format_float(min_p), "must be in [0, 1] (0 disables it)");
  if (top_k < -1)
    return bad_field("top_k", std::to_string(top_k), "must be >= 1, or 0 / -1 to disable it");
  if (max_tokens < 1)
    return bad_field("max_tokens", std::to_string(max_tokens), "must be >= 1");
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty())
      return bad_field(("stop[" + std::to_string(i) + "]").c_str(), "\"\"", "stop strings must not be empty");
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0)
      return bad_field(("stop_token_ids[" + std::to_string(i) + "]").c_str(), std::to_string(stop_token_ids[i]),
                       "token ids must be >= 0");
  }
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    return bad_field("repetition_penalty", format_float(repetition_penalty), "must be finite and > 0 (1 disables it)");
  if (!(std::fabs(frequency_penalty) <= kMaxFrequencyPresencePenalty))
    return bad_field("frequency_penalty", format_float(frequency_penalty), "must be in [-2, 2] (0 disables it)");
  if (!(std::fabs(presence_penalty) <= kMaxFrequencyPresencePenalty))
    return bad_field("presence_penalty", format_float(presence_penalty), "must be in [-2, 2] (0 disables it)");
  if (min_tokens < 0) return bad_field("min_tokens", std::to_string(min_tokens), "must be >= 0");
  if (min_tokens > max_tokens)
    return bad_field("min_tokens", std::to_string(min_tokens),
                     ("must be <= max_tokens (" + std::to_string(max_tokens) + ")").c_str());
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries))
    return bad_field("logit_bias", std::to_string(logit_bias.size()) + " entries", "must have at most 300 entries");
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto& [id, bias] = logit_bias[i];
    const std::string where = "logit_bias[" + std::to_string(id) + "]";
    if (id < 0) return bad_field("logit_bias", std::to_string(id), "token ids must be >= 0");
    if (!(std::fabs(bias) <= kMaxLogitBias))
      return bad_field(where.c_str(), format_float(bias), "must be in [-100, 100]");
    for (size_t j = 0; j < i; ++j)
      if (logit_bias[j].first == id) return bad_field("logit_bias", std::to_string(id), "token ids must not repeat");
  }
  return Status::ok();
}

}  // namespace origami
