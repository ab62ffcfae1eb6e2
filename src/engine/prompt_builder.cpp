#include "engine/prompt_builder.h"

#include "engine/json_token_ids.h"

namespace origami {

PromptBuilder::PromptBuilder(std::shared_ptr<const Tokenizer> tokenizer) : tokenizer_(std::move(tokenizer)) {}

Expected<std::vector<int32_t>> PromptBuilder::from_text(const std::string& text) const {
  return tokenizer_->encode(text, /*add_special_tokens=*/true);
}

Expected<std::vector<int32_t>> PromptBuilder::from_messages(const nlohmann::json& messages,
                                                            const nlohmann::json& template_kwargs) const {
  if (!messages.is_array() || messages.empty())
    return invalid_argument("'messages' must be a non-empty list of {role, content} objects");
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return invalid_argument("messages[" + std::to_string(i) + "] needs a string 'role'");
  }
  if (tokenizer_->chat_template().empty())
    return invalid_argument("this model's tokenizer_config.json has no chat_template; send 'prompt' instead");
  if (!chat_template_) chat_template_.emplace(ChatTemplate::parse(tokenizer_->chat_template()));
  if (!chat_template_->has_value())
    return invalid_file("chat template of the tokenizer: " + chat_template_->status().message());
  Expected<std::string> text = chat_template_->value().render(messages, /*add_generation_prompt=*/true, template_kwargs,
                                                              tokenizer_->bos_token(), tokenizer_->eos_token());
  if (!text) return text.status();
  return tokenizer_->encode(*text, /*add_special_tokens=*/false);
}

const std::vector<std::string>& PromptBuilder::json_fields() {
  static const std::vector<std::string> kFields = {"prompt", "messages", "chat_template_kwargs"};
  return kFields;
}

Expected<std::vector<int32_t>> PromptBuilder::from_json(const nlohmann::json& request) const {
  if (!request.is_object()) return invalid_argument("a request must be a JSON object");
  const bool has_prompt = request.contains("prompt");
  const bool has_messages = request.contains("messages");
  if (has_prompt == has_messages) return invalid_argument("a request needs exactly one of 'prompt' or 'messages'");
  if (has_messages) {
    nlohmann::json kwargs = request.value("chat_template_kwargs", nlohmann::json::object());
    if (!kwargs.is_object()) return invalid_argument("'chat_template_kwargs' must be an object");
    return from_messages(request["messages"], kwargs);
  }
  const auto& prompt = request["prompt"];
  if (prompt.is_string()) return from_text(prompt.get<std::string>());
  if (prompt.is_array()) return token_ids_from_json(prompt, "prompt");
  return invalid_argument("'prompt' must be a string or a list of token ids");
}

}  // namespace origami
