#pragma once
// UTF-8 helpers, the character classes the pre-tokenizer needs (\p{L}, \p{N}, \s) and NFC.
// Tables come from unicode_tables.cpp (generated; no ICU needed at run time).
#include <cstdint>
#include <string>
#include <string_view>

namespace origami::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the code point at text[pos] and advances pos. Invalid or truncated sequences yield
// U+FFFD and advance by the maximal invalid subpart (at least one byte), as lossy decoders do.
char32_t next_code_point(std::string_view text, size_t& pos);

void append_utf8(std::string& out, char32_t cp);
std::string to_utf8(char32_t cp);

bool is_valid_utf8(std::string_view text);
// Replaces each maximal invalid subpart with U+FFFD.
std::string to_valid_utf8(std::string_view text);

// Length of the longest prefix of `bytes` that ends on a complete-or-invalid boundary, i.e.
// everything after it is an incomplete (so far valid) UTF-8 sequence that more bytes could finish.
size_t complete_utf8_prefix(std::string_view bytes);

bool is_letter(char32_t cp);      // \p{L}
bool is_number(char32_t cp);      // \p{N}
bool is_whitespace(char32_t cp);  // White_Space, i.e. regex \s

uint8_t combining_class(char32_t cp);

// Canonical composition (Unicode Normalization Form C). Input must be valid UTF-8.
std::string nfc(std::string_view text);
// Canonical decomposition (NFD), exposed for tests.
std::string nfd(std::string_view text);

}  // namespace origami::unicode
