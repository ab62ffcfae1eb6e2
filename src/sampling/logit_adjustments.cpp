#include "sampling/logit_adjustments.h"

#include <limits>

namespace origami {

LogitAdjustments::LogitAdjustments(const SamplingParams& params, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& eos_token_ids, int vocab_size)
    : repetition_penalty_(params.repetition_penalty),
      frequency_penalty_(params.frequency_penalty),
      presence_penalty_(params.presence_penalty),
      track_output_(params.has_penalties()),
      min_tokens_(params.min_tokens) {
  if (params.repetition_penalty != 1.0f)
    for (int32_t t : prompt) entry_for(t).flags |= LogitAdjustment::kPenalized;
  for (const auto& [token, bias] : params.logit_bias) entry_for(token).bias = bias;
  if (min_tokens_ > 0) {
    for (int32_t t : params.stop_token_ids)
      if (t >= 0 && t < vocab_size) entry_for(t).flags |= LogitAdjustment::kMasked;
    if (!params.ignore_eos)
      for (int32_t t : eos_token_ids)
        if (t >= 0 && t < vocab_size) entry_for(t).flags |= LogitAdjustment::kMasked;
  }
}

LogitAdjustment& LogitAdjustments::entry_for(int32_t token) {
  auto [it, inserted] = index_.try_emplace(token, static_cast<uint32_t>(entries_.size()));
  if (inserted) entries_.push_back(LogitAdjustment{.token = token});
  return entries_[it->second];
}

void LogitAdjustments::add_output_token(int32_t token) {
  ++num_output_;
  if (track_output_) {
    LogitAdjustment& e = entry_for(token);
    ++e.output_count;
    e.flags |= repetition_penalty_ != 1.0f ? LogitAdjustment::kPenalized : 0u;
    e.frequency_term = frequency_penalty_ * static_cast<float>(e.output_count);
  }
  if (num_output_ != min_tokens_) return;
  // The mask lifts: entries that only masked are dropped, so a request without other
  // adjustments goes back to the plain path.
  std::vector<LogitAdjustment> kept;
  kept.reserve(entries_.size());
  index_.clear();
  for (LogitAdjustment e : entries_) {
    e.flags &= ~LogitAdjustment::kMasked;
    if (e.flags == 0 && e.bias == 0.0f && e.output_count == 0) continue;
    index_.emplace(e.token, static_cast<uint32_t>(kept.size()));
    kept.push_back(e);
  }
  entries_ = std::move(kept);
}

float adjusted_logit(float logit, const LogitAdjustment& a, float repetition_penalty, float presence_penalty) {
  if (a.flags & LogitAdjustment::kMasked) return -std::numeric_limits<float>::infinity();
  float l = logit + a.bias;
  if (a.flags & LogitAdjustment::kPenalized) l = l > 0.0f ? l / repetition_penalty : l * repetition_penalty;
  l = l - a.frequency_term;
  if (a.output_count > 0) l = l - presence_penalty;
  return l;
}

void LogitAdjustments::apply(float* logits) const {
  for (const LogitAdjustment& a : entries_)
    logits[a.token] = adjusted_logit(logits[a.token], a, repetition_penalty_, presence_penalty_);
}

}  // namespace origami
