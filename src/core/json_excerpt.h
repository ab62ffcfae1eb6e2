#pragma once
// A JSON value quoted in an error message: compact JSON cut to a bounded length, rendered without
// recursion and without visiting more of the value than it prints, so that a large or deep value
// in a request costs nothing to report. Invalid UTF-8 in strings is replaced, never thrown.
#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace origami {

inline constexpr size_t kJsonExcerptBytes = 100;

// The value's compact JSON when it fits in `max_bytes`, else its first `max_bytes` bytes + "...".
std::string json_excerpt(const nlohmann::json& value, size_t max_bytes = kJsonExcerptBytes);

// Text (a field name, an option key) quoted in an error message: its first `max_bytes` bytes, cut
// at a UTF-8 character boundary, + "..." when cut.
std::string text_excerpt(std::string_view text, size_t max_bytes = kJsonExcerptBytes);

}  // namespace origami
