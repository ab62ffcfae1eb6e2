#include "tokenizer/chat_template.h"

#include <fstream>
#include <iterator>
#include <sstream>

#include "core/json_parse.h"

namespace origami {

Expected<ChatTemplate> ChatTemplate::parse(const std::string& source, const ChatTemplateOptions& options) {
  jinja::LexerOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  lex.keep_trailing_newline = options.keep_trailing_newline;
  ORIGAMI_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source, lex));
  ChatTemplate ct;
  ct.source_ = source;
  ct.template_ = std::move(t);
  ct.limits_ = options.limits;
  return ct;
}

Expected<ChatTemplate> ChatTemplate::from_tokenizer_config(const std::string& path, const ChatTemplateOptions& options) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open tokenizer config " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return invalid_file(path + ": read error");
  Expected<nlohmann::json> json = parse_json(text, kFileJsonMaxDepth);
  if (!json) return invalid_file(path + ": " + json.status().message());
  const nlohmann::json config = std::move(*json);
  if (!config.is_object()) return invalid_file(path + ": not a JSON object");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return not_found(path + ": no field 'chat_template'");
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      if (entry.is_object() && entry.contains("name") && entry["name"] == "default" && entry.contains("template") && entry["template"].is_string()) {
        source = entry["template"].get<std::string>();
      }
    }
    if (source.empty()) return invalid_file(path + ": field 'chat_template' has no template named 'default'");
  } else {
    return invalid_file(path + ": field 'chat_template' must be a string or a list of named templates");
  }
  auto parsed = parse(source, options);
  if (!parsed) return Status(parsed.status().code(), path + ": chat_template: " + parsed.status().message());
  return parsed;
}

Expected<std::string> ChatTemplate::render_value(jinja::Value messages, bool add_generation_prompt, jinja::Value extra,
                                                 const std::string& bos_token, const std::string& eos_token) const {
  jinja::Dict vars;
  if (extra.is_dict()) vars = extra.entries();
  else if (!extra.is_none() && !extra.is_undefined()) return invalid_argument("chat template: extra variables must be a JSON object");
  vars.set(jinja::Value("messages"), std::move(messages));
  vars.set(jinja::Value("add_generation_prompt"), jinja::Value(add_generation_prompt));
  vars.set(jinja::Value("bos_token"), jinja::Value(bos_token));
  vars.set(jinja::Value("eos_token"), jinja::Value(eos_token));
  return template_.render(jinja::Value::dict(std::move(vars)), limits_);
}

Expected<std::string> ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& extra,
                                           const std::string& bos_token, const std::string& eos_token) const {
  return render_value(jinja::from_json(messages), add_generation_prompt, jinja::from_json(extra), bos_token, eos_token);
}

Expected<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                           const nlohmann::ordered_json& extra, const std::string& bos_token,
                                           const std::string& eos_token) const {
  return render_value(jinja::from_json(messages), add_generation_prompt, jinja::from_json(extra), bos_token, eos_token);
}

}  // namespace origami
