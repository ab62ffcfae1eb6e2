#include "tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/json_fields.h"

namespace origami {

Status PreTokenizer::parse(const nlohmann::json& json, const std::string& where, std::vector<Step>& steps) {
  if (json.is_null()) return Status::ok();
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return invalid_file(where + ": a pre_tokenizer must be an object with a string 'type'");
  }
  const std::string type = json["type"];
  if (type == "Sequence") {
    if (!json.contains("pretokenizers") || !json["pretokenizers"].is_array()) {
      return invalid_file(where + ": Sequence pre_tokenizer without a 'pretokenizers' array");
    }
    for (const auto& child : json["pretokenizers"]) ORIGAMI_RETURN_IF_ERROR(parse(child, where, steps));
    return Status::ok();
  }
  Step step;
  if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto& pattern = json.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
      return invalid_file(where + ": Split pre_tokenizer: only {\"Regex\": ...} patterns are supported");
    }
    const std::string field = where + ": pre_tokenizer";
    ORIGAMI_ASSIGN_OR_RETURN(const std::string behavior, optional_string(json, "behavior", "Isolated", field));
    if (behavior != "Isolated") {
      return invalid_file(where + ": Split pre_tokenizer: unsupported behavior '" + behavior + "'");
    }
    ORIGAMI_ASSIGN_OR_RETURN(const bool invert, optional_bool(json, "invert", false, field));
    if (invert) return invalid_file(where + ": Split pre_tokenizer: invert is not supported");
    ORIGAMI_ASSIGN_OR_RETURN(step.pattern, detect_split_pattern(pattern["Regex"].get<std::string>(), where));
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    ORIGAMI_ASSIGN_OR_RETURN(step.add_prefix_space, optional_bool(json, "add_prefix_space", false, where + ": pre_tokenizer"));
    ORIGAMI_ASSIGN_OR_RETURN(step.use_regex, optional_bool(json, "use_regex", true, where + ": pre_tokenizer"));
    step.pattern = SplitPattern::kGpt2;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    const std::string field = where + ": pre_tokenizer";
    ORIGAMI_ASSIGN_OR_RETURN(step.replacement, optional_string(json, "replacement", "\xE2\x96\x81", field));
    if (step.replacement.empty()) return invalid_file(where + ": Metaspace with an empty replacement");
    ORIGAMI_ASSIGN_OR_RETURN(const bool add_prefix_space, optional_bool(json, "add_prefix_space", true, field));
    ORIGAMI_ASSIGN_OR_RETURN(const std::string scheme,
                             optional_string(json, "prepend_scheme", add_prefix_space ? "always" : "never", field));
    if (scheme == "always") {
      step.prepend = Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = Prepend::kNever;
    } else {
      return invalid_file(where + ": Metaspace: unknown prepend_scheme '" + scheme + "'");
    }
    ORIGAMI_ASSIGN_OR_RETURN(step.split, optional_bool(json, "split", true, field));
  } else {
    return invalid_file(where + ": unsupported pre_tokenizer type '" + type + "'");
  }
  steps.push_back(std::move(step));
  return Status::ok();
}

Expected<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& json, const std::string& where) {
  PreTokenizer p;
  ORIGAMI_RETURN_IF_ERROR(parse(json, where, p.steps_));
  for (const Step& s : p.steps_) p.byte_level_ |= s.kind == Kind::kByteLevel;
  return p;
}

void PreTokenizer::split(std::string_view text, bool at_text_start, std::vector<std::string_view>& words,
                         std::deque<std::string>& storage) const {
  words.clear();
  if (text.empty()) return;
  // Steps that rewrite text keep the new text in `storage` (a deque: views stay valid).
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (size_t i = 0; i < current.size(); ++i) {
      std::string_view word = current[i];
      switch (step.kind) {
        case Kind::kSplit:
          split_by_pattern(step.pattern, word, next);
          break;
        case Kind::kByteLevel:
          if (step.add_prefix_space && (word.empty() || word.front() != ' ')) {
            std::string& prefixed = storage.emplace_back();
            prefixed.reserve(word.size() + 1);
            prefixed.push_back(' ');
            prefixed.append(word);
            word = storage.back();
          }
          if (step.use_regex) {
            split_by_pattern(step.pattern, word, next);
          } else {
            next.push_back(word);
          }
          break;
        case Kind::kMetaspace: {
          std::string s;
          s.reserve(word.size() + 8);
          for (char c : word) {
            if (c == ' ') {
              s += step.replacement;
            } else {
              s.push_back(c);
            }
          }
          const bool first = at_text_start && i == 0;
          if ((step.prepend == Prepend::kAlways || (step.prepend == Prepend::kFirst && first)) &&
              s.compare(0, step.replacement.size(), step.replacement) != 0) {
            s.insert(0, step.replacement);
          }
          storage.push_back(std::move(s));
          std::string_view w = storage.back();
          if (!step.split) {
            next.push_back(w);
            break;
          }
          // Each replacement starts a new word (merged with what follows it).
          size_t start = 0;
          for (size_t at = w.find(step.replacement, 1); at != std::string_view::npos;
               at = w.find(step.replacement, at + step.replacement.size())) {
            if (at > start) next.push_back(w.substr(start, at - start));
            start = at;
          }
          if (start < w.size()) next.push_back(w.substr(start));
          break;
        }
      }
    }
    current.swap(next);
  }
  words = std::move(current);
}

}  // namespace origami
