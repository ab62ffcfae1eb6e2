// Fuzzes a Jinja chat template rendered with fuzzed messages. Input: template source, then
// "\0" and a JSON document: an object of template variables ("messages", "tools",
// "add_generation_prompt", ...) or a list of messages. Without the JSON part, or when it is not
// valid JSON, a fixed conversation is rendered (regressions/chat_template/bomb_* are templates
// that, unbounded, take gigabytes or minutes). Render limits are lowered so that a template
// that hits them costs milliseconds, not seconds; that they hold is part of what is checked.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

using namespace origami;
using nlohmann::ordered_json;

namespace {

ordered_json default_messages() {
  return ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9\u65e5"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": null}])");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  bool has_vars = false;
  auto [source, vars_text] = fuzz::split_once(fuzz::as_text(data, size), std::string_view("\0", 1), &has_vars);
  ChatTemplateOptions options;
  options.limits.max_output_bytes = 1 << 20;
  options.limits.max_steps = 200'000;
  options.limits.max_memory_bytes = 16 << 20;
  Expected<ChatTemplate> tmpl = ChatTemplate::parse(std::string(source), options);
  if (!tmpl) {
    FUZZ_CHECK(!tmpl.status().message().empty(), "an error without a message");
    return 0;
  }
  ordered_json messages = default_messages();
  ordered_json extra = ordered_json::object();
  bool add_generation_prompt = true;
  if (has_vars) {
    ordered_json vars = ordered_json::parse(vars_text.begin(), vars_text.end(), nullptr, /*allow_exceptions=*/false);
    if (vars.is_array()) {
      messages = std::move(vars);
    } else if (vars.is_object()) {
      for (auto& [key, value] : vars.items()) {
        if (key == "messages") messages = value;
        else if (key == "add_generation_prompt") add_generation_prompt = value.is_boolean() && value.get<bool>();
        else extra[key] = value;
      }
    }
  }
  Expected<std::string> out = tmpl->render(messages, add_generation_prompt, extra, "<s>", "</s>");
  if (out) {
    FUZZ_CHECK(out->size() <= options.limits.max_output_bytes, "output above the limit");
  } else {
    FUZZ_CHECK(!out.status().message().empty(), "an error without a message");
  }
  return 0;
}
