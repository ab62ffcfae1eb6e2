#pragma once
// The `logprobs` object of a choice (or of a streamed chunk) in OpenAI's two shapes, from the
// engine's per-token log-probabilities (RequestOutput::logprobs):
//   completions: {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}],
//                 "text_offset": [int]}  (each top dict holds the top N and the chosen token,
//                 as vLLM's)
//   chat:        {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token",
//                 "logprob", "bytes"}]}]}  (exactly top_logprobs alternatives)
// Tokens are shown as the tokenizer decodes each one alone (a byte of a multi-byte character
// becomes U+FFFD; "bytes" keeps the raw bytes). -inf becomes -9999.0, as vLLM's, since JSON
// has no infinity.
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "sampling/logprob.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace origami::server {

// Accumulates one choice's tokens and renders them; take() renders and clears (streaming: the
// tokens of one chunk), while text offsets keep counting across calls.
class ChoiceLogprobs {
 public:
  ChoiceLogprobs(ApiKind kind, int num_top, const Tokenizer* tokenizer)
      : kind_(kind), num_top_(num_top), tokenizer_(tokenizer) {}

  // new_token_ids[i] with logprobs[i] (a step's RequestOutput).
  void add(const std::vector<int32_t>& token_ids, const std::vector<TokenLogprobs>& logprobs);
  bool empty() const { return tokens_.empty(); }
  nlohmann::json take();

 private:
  ApiKind kind_;
  int num_top_;
  const Tokenizer* tokenizer_;
  std::vector<int32_t> tokens_;
  std::vector<TokenLogprobs> logprobs_;
  int64_t text_offset_ = 0;  // characters of the token strings rendered so far (completions)
};

}  // namespace origami::server
