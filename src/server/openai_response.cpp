#include "server/openai_response.h"

#include <random>

namespace origami::server {

nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

nlohmann::json choice_json(ApiKind kind, int index, const std::string& text, const std::string& finish_reason,
                           nlohmann::json logprobs) {
  nlohmann::json c = {{"index", index}};
  if (kind == ApiKind::kChat)
    c["message"] = {{"role", "assistant"}, {"content", text}};
  else
    c["text"] = text;
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(finish_reason);
  return c;
}

nlohmann::json response_json(const ResponseHeader& h, nlohmann::json choices, nlohmann::json usage) {
  return {{"id", h.id},
          {"object", h.kind == ApiKind::kChat ? "chat.completion" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", std::move(choices)},
          {"usage", std::move(usage)}};
}

nlohmann::json chunk_json(const ResponseHeader& h, int index, const std::string& text, const std::string& finish_reason,
                          bool role_only, nlohmann::json logprobs) {
  nlohmann::json c = {{"index", index}};
  if (h.kind == ApiKind::kChat) {
    if (role_only)
      c["delta"] = {{"role", "assistant"}, {"content", ""}};
    else if (text.empty())
      c["delta"] = nlohmann::json::object();
    else
      c["delta"] = {{"content", text}};
  } else {
    c["text"] = text;
  }
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(finish_reason);
  return {{"id", h.id},
          {"object", h.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", nlohmann::json::array({c})}};
}

nlohmann::json usage_chunk_json(const ResponseHeader& h, nlohmann::json usage) {
  return {{"id", h.id},
          {"object", h.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"choices", nlohmann::json::array()},
          {"usage", std::move(usage)}};
}

nlohmann::json models_json(const std::string& model, int64_t created, int max_model_len, int vocab_size) {
  return {{"object", "list"},
          {"data", nlohmann::json::array({{{"id", model},
                                           {"object", "model"},
                                           {"created", created},
                                           {"owned_by", "origami"},
                                           {"root", model},
                                           {"parent", nullptr},
                                           {"max_model_len", max_model_len},
                                           {"vocab_size", vocab_size}}})}};
}

std::string make_response_id(ApiKind kind) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 32; ++i) id += hex[rng() & 15];
  return id;
}

}  // namespace origami::server
