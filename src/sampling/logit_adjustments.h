#pragma once
// A request's logit adjustments, with vLLM's definitions and order, applied to the raw logits of
// every token it samples (greedy included) before temperature and the filters of sampler.h:
//   1. min_tokens: EOS (unless ignore_eos) and stop_token_ids are -inf while fewer than
//      min_tokens tokens were generated;
//   2. logit_bias: l += bias;
//   3. repetition_penalty r, for tokens in the prompt or the output: l = l > 0 ? l / r : l * r;
//   4. frequency_penalty f: l -= f * (times the token is in the output);
//   5. presence_penalty p: l -= p if the token is in the output.
// Every step touches only the tokens named above, so the state is sparse: one entry per token
// that the prompt (only under a repetition penalty), the output (only under a penalty),
// logit_bias or the min_tokens mask names. Entries are updated in place as tokens are generated
// (O(1) per token); a request without any adjustment has no entries and costs nothing. The CUDA
// sampling kernel applies the same entries (backend/cuda/sampling_kernels.h); this header is
// also compiled as CUDA C++17, hence vectors rather than spans.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "sampling/sampling_params.h"

namespace origami {

// One adjusted token. Plain data: the CUDA backend copies these to the device as they are.
struct LogitAdjustment {
  static constexpr uint32_t kPenalized = 1;  // in the prompt or the output: repetition penalty
  static constexpr uint32_t kMasked = 2;     // -inf (min_tokens not reached)
  int32_t token = 0;
  uint32_t flags = 0;
  float bias = 0.0f;            // logit_bias
  float frequency_term = 0.0f;  // frequency_penalty * output_count, as one float product
  int32_t output_count = 0;     // times in the output (presence_penalty applies when > 0)
};

class LogitAdjustments {
 public:
  LogitAdjustments() = default;
  // `prompt` and `eos_token_ids` are read here only; params must be valid (validate()) with
  // logit_bias ids below vocab_size. Stop token ids at or above vocab_size are never sampled and
  // so need no mask.
  LogitAdjustments(const SamplingParams& params, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& eos_token_ids, int vocab_size);

  // Records a token appended to the output (sampled or forced).
  void add_output_token(int32_t token);

  bool empty() const { return entries_.empty(); }
  const std::vector<LogitAdjustment>& entries() const { return entries_; }
  float repetition_penalty() const { return repetition_penalty_; }
  float presence_penalty() const { return presence_penalty_; }

  // Applies every entry to logits (one row of the vocabulary; entries' tokens are in range).
  void apply(float* logits) const;

 private:
  LogitAdjustment& entry_for(int32_t token);

  std::vector<LogitAdjustment> entries_;
  std::unordered_map<int32_t, uint32_t> index_;  // token -> entries_ index
  float repetition_penalty_ = 1.0f;
  float frequency_penalty_ = 0.0f;
  float presence_penalty_ = 0.0f;
  bool track_output_ = false;  // any penalty: output tokens get entries
  int min_tokens_ = 0;
  int num_output_ = 0;
};

// One entry applied to one logit: the steps of the header comment, each a single rounded float
// operation (no fused multiply-add: logit_adjustments.cpp is compiled without contraction, and
// the CUDA kernel uses the _rn intrinsics) so that both backends give the same bits.
float adjusted_logit(float logit, const LogitAdjustment& a, float repetition_penalty, float presence_penalty);

}  // namespace origami
