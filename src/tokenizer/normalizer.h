#pragma once
// The `normalizer` section of tokenizer.json: NFC/NFD, Prepend, Replace (literal patterns) and
// Sequence of those. Applied to each stretch of text between added tokens.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace origami {

class Normalizer {
 public:
  // `json` may be null (no normalization). `where` names the file for error messages.
  static Expected<Normalizer> from_json(const nlohmann::json& json, const std::string& where);

  bool empty() const { return steps_.empty(); }
  std::string normalize(std::string_view text) const;

 private:
  enum class Kind { kNfc, kNfd, kPrepend, kReplace };
  struct Step {
    Kind kind;
    std::string pattern;  // kReplace
    std::string content;  // kPrepend / kReplace
  };
  static Status parse(const nlohmann::json& json, const std::string& where, std::vector<Step>& steps);

  std::vector<Step> steps_;
};

}  // namespace origami
