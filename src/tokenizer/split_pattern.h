#pragma once
// Hand-written matchers for the pre-tokenizer split regexes found in byte-level tokenizer.json
// files. A general regex engine with Unicode classes is not available everywhere the engine
// runs, and these patterns are few and fixed, so each is matched by code that follows the
// regex's backtracking (leftmost alternative wins) semantics exactly.
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace origami {

enum class SplitPattern {
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,
  // As kQwen2 but with \p{N}{1,3} (GPT-4 / Llama-3).
  kLlama3,
};

// Recognises one of the supported patterns; anything else is an error naming `where`.
Expected<SplitPattern> detect_split_pattern(std::string_view regex, const std::string& where);

// The regex text of a supported pattern.
std::string_view split_pattern_regex(SplitPattern pattern);

// Appends the pieces of `text` (matches and, if any, the unmatched gaps between them) in order.
// Input must be valid UTF-8.
void split_by_pattern(SplitPattern pattern, std::string_view text, std::vector<std::string_view>& out);

}  // namespace origami
