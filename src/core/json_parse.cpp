#include "core/json_parse.h"

#include <string>

namespace origami {
namespace {

// Walks `text` once, calling on_open(offset, depth) for every `[` / `{` outside strings with the
// depth it opens; stops early when on_open returns false. No recursion, no allocation.
template <typename OnOpen>
void scan_nesting(std::string_view text, OnOpen on_open) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped byte (an escaped quote included) cannot end the string
      else if (c == '"') in_string = false;
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '[':
      case '{':
        if (!on_open(i, ++depth)) return;
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced input is the parser's error to report
        break;
      default: break;
    }
  }
}

}  // namespace

std::optional<size_t> find_json_depth_excess(std::string_view text, int max_depth) {
  std::optional<size_t> at;
  scan_nesting(text, [&](size_t offset, int depth) {
    if (depth <= max_depth) return true;
    at = offset;
    return false;
  });
  return at;
}

int json_nesting_depth(std::string_view text) {
  int deepest = 0;
  scan_nesting(text, [&](size_t, int depth) {
    deepest = std::max(deepest, depth);
    return true;
  });
  return deepest;
}

Expected<nlohmann::json> parse_json(std::string_view text, int max_depth) {
  if (const std::optional<size_t> at = find_json_depth_excess(text, max_depth))
    return invalid_argument("JSON nested deeper than " + std::to_string(max_depth) + " levels at byte offset " +
                            std::to_string(*at));
  nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Parsed again to learn where (only on this error path, the input already depth-bounded);
    // nlohmann's message itself is not used: it quotes the bytes it last read.
    size_t at = text.size();
    try {
      (void)nlohmann::json::parse(text.begin(), text.end());
    } catch (const nlohmann::json::parse_error& e) {
      at = e.byte;
    } catch (const nlohmann::json::exception&) {
      // A number out of range (e.g. 1e999) is an out_of_range error, which carries no byte.
      return invalid_argument("not valid JSON: a number is out of range");
    }
    return invalid_argument("not valid JSON at byte " + std::to_string(at));
  }
  return j;
}

}  // namespace origami
