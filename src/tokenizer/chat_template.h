#pragma once
// Renders a model's chat template (tokenizer_config.json `chat_template`, Jinja) the way HF
// transformers does: trim_blocks and lstrip_blocks on, `tojson` as json.dumps without ASCII
// escaping, `raise_exception` and `strftime_now` available, loop controls enabled.
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "tokenizer/jinja_template.h"

namespace origami {

struct ChatTemplateOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
  jinja::RenderLimits limits;
};

class ChatTemplate {
 public:
  static Expected<ChatTemplate> parse(const std::string& source, const ChatTemplateOptions& options = {});
  // Reads the `chat_template` field of a tokenizer_config.json (a string, or a list of named
  // templates of which "default" is taken).
  static Expected<ChatTemplate> from_tokenizer_config(const std::string& path, const ChatTemplateOptions& options = {});

  // Variables: messages, add_generation_prompt, bos_token, eos_token, plus every key of `extra`
  // (e.g. enable_thinking, tools). nlohmann::json sorts object keys; pass ordered_json to keep
  // the caller's key order in `tojson` output.
  Expected<std::string> render(const nlohmann::json& messages, bool add_generation_prompt,
                               const nlohmann::json& extra = nlohmann::json::object(),
                               const std::string& bos_token = "", const std::string& eos_token = "") const;
  Expected<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& extra, const std::string& bos_token = "",
                               const std::string& eos_token = "") const;

  const std::string& source() const { return source_; }

 private:
  Expected<std::string> render_value(jinja::Value messages, bool add_generation_prompt, jinja::Value extra,
                                     const std::string& bos_token, const std::string& eos_token) const;

  std::string source_;
  jinja::Template template_;
  jinja::RenderLimits limits_;
};

}  // namespace origami
