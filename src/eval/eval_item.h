#pragma once
// One evaluation request as the engine runs it: a prompt, tokens forced as the first outputs
// (teacher forcing, one per decode step, so decode-time compression runs through them), then
// `max_new_tokens` generated greedily. And what came back.
#include <cstdint>
#include <string>
#include <vector>

namespace origami::eval {

struct EvalItem {
  std::vector<int32_t> prompt_token_ids;
  std::vector<int32_t> forced_token_ids;
  int max_new_tokens = 0;               // generated after the forced tokens (greedy)
  bool return_forced_logprobs = false;  // perplexity needs log p(forced token)
};

struct EvalItemResult {
  bool ok = false;
  std::string error;
  std::vector<int32_t> generated_token_ids;  // the outputs after the forced ones
  std::vector<float> forced_logprobs;        // one per forced token when asked for
};

}  // namespace origami::eval
