#pragma once
// The one way origami parses JSON: a non-recursive pre-scan that bounds the nesting depth, then
// nlohmann's parser. nlohmann parses iteratively, but much of what follows a parse recurses over
// the value (dump, copies, conversions, the chat template's values): a body of 10^5 `[` would
// overflow the stack there. Bounding the depth at the bytes makes every later walk safe.
#include <cstddef>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace origami {

// Requests (HTTP bodies, JSONL lines, CLI arguments): far above what any API field nests.
inline constexpr int kRequestJsonMaxDepth = 64;
// Files (model config, tokenizer.json, safetensors headers, head budgets, eval data): the real
// files nest at most 6 levels (tokenizer.json 5, golden files 6); headroom for other tokenizers.
inline constexpr int kFileJsonMaxDepth = 128;

// The byte offset of the first `[` or `{` outside strings that opens level max_depth + 1, or none.
// Exact for valid JSON; for invalid JSON it bounds the valid prefix nlohmann reads before failing.
std::optional<size_t> find_json_depth_excess(std::string_view text, int max_depth);

// The deepest nesting of arrays and objects in `text` (0 for a scalar), counted as the pre-scan does.
int json_nesting_depth(std::string_view text);

// Parses `text` as one JSON value nested at most `max_depth` levels. Errors (kInvalidArgument;
// file readers re-wrap them with their path) never quote the input:
//   "JSON nested deeper than 64 levels at byte offset N", "not valid JSON at byte N" (nlohmann's
//   count: the 1-based position of the byte where parsing failed).
Expected<nlohmann::json> parse_json(std::string_view text, int max_depth = kRequestJsonMaxDepth);

}  // namespace origami
