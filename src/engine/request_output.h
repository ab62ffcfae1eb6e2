#pragma once
// What the engine reports about a request after a step: new tokens, new text, and whether it ended.
#include <cstdint>
#include <string>
#include <vector>

#include "sampling/logprob.h"
#include "sched/request.h"

namespace origami {

struct RequestOutput {
  RequestId request_id = 0;
  std::vector<int32_t> new_token_ids;
  std::string new_text;  // streaming-safe: never ends inside a UTF-8 character or a possible stop string
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set when finish_reason == kError
  // With RequestOptions::return_forced_logprobs: log p(token) of each forced token in
  // new_token_ids that was forced (teacher forcing), in order.
  std::vector<float> forced_logprobs;
  // With RequestOptions::logprobs >= 0: one entry per new_token_ids entry, in order.
  std::vector<TokenLogprobs> logprobs;
};

}  // namespace origami
