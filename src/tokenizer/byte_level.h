#pragma once
// The byte-level BPE alphabet: every byte maps to one printable code point (so that vocab
// strings are printable), e.g. ' ' -> 'Ġ' (U+0120), '\n' -> 'Ċ' (U+010A).
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace origami::byte_level {

// The code point standing for `byte`.
char32_t byte_to_char(uint8_t byte);
// The byte a code point stands for, or nullopt if it is not in the alphabet.
std::optional<uint8_t> char_to_byte(char32_t cp);

// Maps raw bytes to their alphabet string (UTF-8).
std::string encode(std::string_view bytes);
// Maps an alphabet string back to raw bytes; nullopt if some code point is outside the
// alphabet (the caller then uses the raw string, as the decoder does).
std::optional<std::string> decode(std::string_view text);

}  // namespace origami::byte_level
