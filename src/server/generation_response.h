#pragma once
// Turns the engine outputs of one HTTP generation request (its RequestChannel events) into
// what the client receives: SSE events while streaming, or one JSON body at the end. Free of
// any I/O so that the session only moves bytes. A streamed chunk carries the log-probabilities
// of the tokens since the previous chunk (text held back by the engine delays them with it).
//
// "return_token_ids" (vLLM's field and shapes): completions put "prompt_token_ids" and
// "token_ids" in each choice (a request may hold several prompts); chat puts
// "prompt_token_ids" beside "choices" (one prompt) and "token_ids" in each choice. Streaming:
// each content chunk's choice carries the ids generated since the choice's previous chunk (held
// back with its text, like the log-probabilities), and the prompt's ids come once per choice
// in its first chunk (chat: the role chunk, beside "choices"; completions: in the choice).
#include <optional>
#include <string>
#include <vector>

#include "server/api_error.h"
#include "server/openai_logprobs.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/request_channel.h"

namespace origami::server {

// "data: {json}\n\n": one server-sent event.
std::string sse_event(const nlohmann::json& payload);
inline const char* sse_done() { return "data: [DONE]\n\n"; }

class GenerationResponse {
 public:
  // `tokenizer` shows the tokens of `logprobs` (RequestOptions::logprobs >= 0).
  GenerationResponse(const GenerationRequest& request, ResponseHeader header, const Tokenizer* tokenizer);

  // Takes a step's events. Returns the SSE text to send now when streaming ("" when nothing).
  std::string consume(std::vector<ChannelEvent>& events);
  bool done() const { return num_finished_ == static_cast<int>(choices_.size()); }
  // The engine refused the request (a 400 before anything was sent).
  const std::optional<ApiError>& rejection() const { return rejection_; }
  // A choice ended with an engine error (e.g. a failed compression).
  const std::optional<ApiError>& failure() const { return failure_; }

  // Non-streaming: the response body once done() (renders the choices' logprobs once).
  nlohmann::json body();
  // Streaming: what follows the last choice (the usage chunk when asked for, and [DONE]).
  std::string stream_tail() const;

 private:
  struct Choice {
    std::string text;
    int num_tokens = 0;
    std::string finish_reason;
    bool opened = false;  // chat: the role delta was sent
    std::optional<ChoiceLogprobs> logprobs;  // when asked for: tokens not yet rendered
    // return_token_ids: the generated ids (streaming: those not yet sent).
    std::vector<int32_t> token_ids;
    bool prompt_ids_sent = false;  // streaming: the first chunk carried prompt_token_ids
  };
  const std::vector<int32_t>& prompt_of(int choice) const { return request_.prompts[choice / request_.n]; }
  // Streaming with return_token_ids: adds the choice's pending ids (and its prompt's ids, the
  // first time) to `chunk`, whose only choice is `choice`.
  void add_chunk_token_ids(int choice, nlohmann::json* chunk);
  nlohmann::json usage() const;

  const GenerationRequest& request_;
  ResponseHeader header_;
  std::vector<Choice> choices_;
  int num_finished_ = 0;
  int64_t prompt_tokens_ = 0;
  std::optional<ApiError> rejection_, failure_;
};

}  // namespace origami::server
