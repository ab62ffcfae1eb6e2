#pragma once
// OpenAI's response objects, field for field: completions ("text_completion"), chat
// ("chat.completion", "chat.completion.chunk"), usage, and the model list.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"

namespace origami::server {

// What every object of one response shares.
struct ResponseHeader {
  ApiKind kind = ApiKind::kCompletion;
  std::string id;  // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  std::string model;
};

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// One finished choice of a non-streaming response; `logprobs`: null, or openai_logprobs.h's object.
nlohmann::json choice_json(ApiKind kind, int index, const std::string& text, const std::string& finish_reason,
                           nlohmann::json logprobs = nullptr);
// The non-streaming response around its choices.
nlohmann::json response_json(const ResponseHeader& h, nlohmann::json choices, nlohmann::json usage);
// One streamed choice delta; `finish_reason` empty: null. `role_only` (chat): the opening delta
// {"role": "assistant", "content": ""}.
nlohmann::json chunk_json(const ResponseHeader& h, int index, const std::string& text, const std::string& finish_reason,
                          bool role_only = false, nlohmann::json logprobs = nullptr);
// The last streamed object with stream_options.include_usage: no choices, the usage.
nlohmann::json usage_chunk_json(const ResponseHeader& h, nlohmann::json usage);
// GET /v1/models; vocab_size (an origami extension) lets `origami bench serve` draw the prompts
// `origami bench` draws.
nlohmann::json models_json(const std::string& model, int64_t created, int max_model_len, int vocab_size);

// A new random response id with OpenAI's prefix for the kind.
std::string make_response_id(ApiKind kind);

}  // namespace origami::server
