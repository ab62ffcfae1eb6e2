#include "tokenizer/normalizer.h"

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace origami {

Status Normalizer::parse(const nlohmann::json& json, const std::string& where, std::vector<Step>& steps) {
  if (json.is_null()) return Status::ok();
  if (!json.is_object() || !json.contains("type") || !json["type"].is_string()) {
    return invalid_file(where + ": a normalizer must be an object with a string 'type'");
  }
  const std::string type = json["type"];
  if (type == "Sequence") {
    if (!json.contains("normalizers") || !json["normalizers"].is_array()) {
      return invalid_file(where + ": Sequence normalizer without a 'normalizers' array");
    }
    for (const auto& child : json["normalizers"]) ORIGAMI_RETURN_IF_ERROR(parse(child, where, steps));
    return Status::ok();
  }
  if (type == "NFC") {
    steps.push_back({Kind::kNfc, {}, {}});
  } else if (type == "NFD") {
    steps.push_back({Kind::kNfd, {}, {}});
  } else if (type == "Prepend") {
    if (!json.contains("prepend") || !json["prepend"].is_string()) {
      return invalid_file(where + ": Prepend normalizer without a string 'prepend'");
    }
    steps.push_back({Kind::kPrepend, {}, json["prepend"].get<std::string>()});
  } else if (type == "Replace") {
    const auto& pattern = json.value("pattern", nlohmann::json());
    if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string()) {
      return invalid_file(where + ": Replace normalizer: only literal {\"String\": ...} patterns are supported");
    }
    if (!json.contains("content") || !json["content"].is_string()) {
      return invalid_file(where + ": Replace normalizer without a string 'content'");
    }
    std::string pat = pattern["String"];
    if (pat.empty()) return invalid_file(where + ": Replace normalizer with an empty pattern");
    steps.push_back({Kind::kReplace, std::move(pat), json["content"].get<std::string>()});
  } else {
    return invalid_file(where + ": unsupported normalizer type '" + type + "'");
  }
  return Status::ok();
}

Expected<Normalizer> Normalizer::from_json(const nlohmann::json& json, const std::string& where) {
  Normalizer n;
  ORIGAMI_RETURN_IF_ERROR(parse(json, where, n.steps_));
  return n;
}

std::string Normalizer::normalize(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNfc: s = unicode::nfc(s); break;
      case Kind::kNfd: s = unicode::nfd(s); break;
      case Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
      case Kind::kReplace: {
        if (s.find(step.pattern) == std::string::npos) break;
        std::string out;
        out.reserve(s.size() + s.size() / 4);
        size_t from = 0;
        for (size_t at; (at = s.find(step.pattern, from)) != std::string::npos; from = at + step.pattern.size()) {
          out.append(s, from, at - from);
          out += step.content;
        }
        out.append(s, from);
        s = std::move(out);
        break;
      }
    }
  }
  return s;
}

}  // namespace origami
