#pragma once
// Unknown request fields, refused by name: a typo such as "temprature" must not be dropped
// silently (the request would run with the default and answer a different question). Shared by
// the JSONL batch reader and the OpenAI server, each with its own list of known fields.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace origami {

// Levenshtein distance, for "did you mean" hints.
size_t edit_distance(std::string_view a, std::string_view b);

// The known field closest to `name` within edit distance 2, or "" if none is that close.
std::string closest_field(std::string_view name, const std::vector<std::string>& known);

// "" when every key of `request` (an object) is in `known`; else the error for the first that is
// not: "unknown field 'temprature' (did you mean 'temperature'?)" (the name cut to 100 bytes).
// `unknown` receives that key when not null.
std::string unknown_field_error(const nlohmann::json& request, const std::vector<std::string>& known,
                                std::string* unknown = nullptr);

// A field name for an error message: at most 100 bytes, so a huge key is never echoed whole.
std::string field_excerpt(std::string_view name);

}  // namespace origami
