#pragma once
// The `pre_tokenizer` section of tokenizer.json: Split (with a supported regex, behaviour
// Isolated), ByteLevel, Metaspace, and Sequence of those. It cuts normalized text into the
// pieces ("words") that BPE encodes independently.
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "tokenizer/split_pattern.h"

namespace origami {

class PreTokenizer {
 public:
  // `json` may be null (the whole text is one word).
  static Expected<PreTokenizer> from_json(const nlohmann::json& json, const std::string& where);

  // Whether a ByteLevel step is present: the model then works on bytes, not characters.
  bool byte_level() const { return byte_level_; }

  // Splits `text` into words. `at_text_start`: the text begins the input (Metaspace "first").
  // Words are views into `text` or into `storage` (which must outlive them).
  void split(std::string_view text, bool at_text_start, std::vector<std::string_view>& words,
             std::deque<std::string>& storage) const;

 private:
  enum class Kind { kSplit, kByteLevel, kMetaspace };
  enum class Prepend { kAlways, kFirst, kNever };
  struct Step {
    Kind kind;
    SplitPattern pattern = SplitPattern::kGpt2;  // kSplit, or kByteLevel with use_regex
    bool use_regex = false;                      // kByteLevel
    bool add_prefix_space = false;               // kByteLevel
    std::string replacement;                     // kMetaspace
    Prepend prepend = Prepend::kAlways;          // kMetaspace
    bool split = false;                          // kMetaspace
  };
  static Status parse(const nlohmann::json& json, const std::string& where, std::vector<Step>& steps);

  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace origami
