#pragma once
// Turns what a user sends (raw text, token ids, or chat messages) into prompt token ids.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace origami {

class PromptBuilder {
 public:
  explicit PromptBuilder(std::shared_ptr<const Tokenizer> tokenizer);

  // Raw text, tokenized with the tokenizer's special tokens (e.g. BOS) as HF does.
  Expected<std::vector<int32_t>> from_text(const std::string& text) const;
  // Chat messages rendered with the model's chat template (generation prompt appended), then
  // tokenized without adding special tokens (the template writes them). `template_kwargs` are
  // extra template variables such as {"enable_thinking": false}.
  Expected<std::vector<int32_t>> from_messages(const nlohmann::json& messages,
                                               const nlohmann::json& template_kwargs = nlohmann::json::object()) const;
  // A JSON request: "prompt" (string, or list of token ids) or "messages".
  Expected<std::vector<int32_t>> from_json(const nlohmann::json& request) const;
  // The request fields from_json() reads.
  static const std::vector<std::string>& json_fields();

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  mutable std::optional<Expected<ChatTemplate>> chat_template_;  // parsed on first use
};

}  // namespace origami
