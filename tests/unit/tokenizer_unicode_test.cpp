// NFC against known compositions (values from the Unicode standard / Python's unicodedata),
// character classes, UTF-8 helpers and the hand-written split patterns.
#include <gtest/gtest.h>

#include "tokenizer/split_pattern.h"
#include "tokenizer/unicode.h"

namespace origami {
namespace {

std::string u8(std::u32string_view cps) {
  std::string s;
  for (char32_t c : cps) unicode::append_utf8(s, c);
  return s;
}

TEST(TokenizerUnicode, NfcKnownCompositions) {
  struct Case {
    std::u32string in, nfc, nfd;
  };
  const Case cases[] = {
      {U"e\u0301", U"\u00E9", U"e\u0301"},                            // é
      {U"A\u030A", U"\u00C5", U"A\u030A"},                            // Å
      {U"\u212B", U"\u00C5", U"A\u030A"},                             // ANGSTROM SIGN (singleton)
      {U"\u2126", U"\u03A9", U"\u03A9"},                              // OHM SIGN (singleton)
      {U"\u1100\u1161\u11A8", U"\uAC01", U"\u1100\u1161\u11A8"},      // Hangul L+V+T
      {U"\uAC00\u11A8", U"\uAC01", U"\u1100\u1161\u11A8"},            // Hangul LV+T
      {U"\u1100\u1161\u1175", U"\uAC00\u1175", U"\u1100\u1161\u1175"},  // V+V does not compose
      {U"d\u0307\u0323", U"\u1E0D\u0307", U"d\u0323\u0307"},          // reordering by class
      {U"\u1E0B\u0323", U"\u1E0D\u0307", U"d\u0323\u0307"},
      {U"\u0958", U"\u0915\u093C", U"\u0915\u093C"},                  // composition exclusion
      {U"a\u0328\u0301", U"\u0105\u0301", U"a\u0328\u0301"},
      {U"A\u0301\u0301", U"\u00C1\u0301", U"A\u0301\u0301"},          // second mark is blocked
      {U"\u00C5\u0301", U"\u01FA", U"A\u030A\u0301"},                 // recomposition of a composite
      {U"e\u0301\u0300", U"\u00E9\u0300", U"e\u0301\u0300"},
      {U"\u0344", U"\u0308\u0301", U"\u0308\u0301"},                  // non-starter decomposition
      {U"\uFB01", U"\uFB01", U"\uFB01"},                              // compatibility only: unchanged
      {U"caf\u00E9 nai\u0308ve", U"caf\u00E9 na\u00EFve", U"cafe\u0301 nai\u0308ve"},
      {U"", U"", U""},
      {U"plain ascii", U"plain ascii", U"plain ascii"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(unicode::nfc(u8(c.in)), u8(c.nfc)) << u8(c.in);
    EXPECT_EQ(unicode::nfd(u8(c.in)), u8(c.nfd)) << u8(c.in);
    EXPECT_EQ(unicode::nfc(u8(c.nfd)), u8(c.nfc)) << u8(c.in);
  }
}

TEST(TokenizerUnicode, NfcIsIdempotentOverTheBmp) {
  // Every BMP code point, alone and followed by a combining mark: NFC(NFC(x)) == NFC(x) and
  // NFC(NFD(x)) == NFC(x).
  for (char32_t cp = 0x20; cp < 0x10000; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;
    for (const std::string& s : {unicode::to_utf8(cp), unicode::to_utf8(cp) + u8(U"\u0301")}) {
      const std::string n = unicode::nfc(s);
      ASSERT_EQ(unicode::nfc(n), n) << std::hex << static_cast<uint32_t>(cp);
      ASSERT_EQ(unicode::nfc(unicode::nfd(s)), n) << std::hex << static_cast<uint32_t>(cp);
    }
  }
}

TEST(TokenizerUnicode, CharacterClasses) {
  EXPECT_TRUE(unicode::is_letter(U'a'));
  EXPECT_TRUE(unicode::is_letter(U'\u00E9'));
  EXPECT_TRUE(unicode::is_letter(U'\u4E2D'));   // 中
  EXPECT_TRUE(unicode::is_letter(U'\uD55C'));   // 한
  EXPECT_FALSE(unicode::is_letter(U'\u0301'));  // combining mark (Mn)
  EXPECT_FALSE(unicode::is_letter(U'1'));
  EXPECT_TRUE(unicode::is_number(U'7'));
  EXPECT_TRUE(unicode::is_number(U'\u0661'));   // ARABIC-INDIC DIGIT ONE (Nd)
  EXPECT_TRUE(unicode::is_number(U'\u00BD'));   // ½ (No)
  EXPECT_TRUE(unicode::is_number(U'\u2167'));   // Ⅷ (Nl)
  EXPECT_TRUE(unicode::is_whitespace(U'\t'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u0085'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u00A0'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u3000'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u2028'));
  EXPECT_FALSE(unicode::is_whitespace(U'\u200B'));  // ZERO WIDTH SPACE is not White_Space
  EXPECT_FALSE(unicode::is_whitespace(U'\x1C'));    // nor are the information separators
  EXPECT_FALSE(unicode::is_whitespace(U'x'));
}

TEST(TokenizerUnicode, Utf8Helpers) {
  EXPECT_TRUE(unicode::is_valid_utf8("h\xC3\xA9llo \xF0\x9F\x99\x82"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xC3"));
  EXPECT_FALSE(unicode::is_valid_utf8("\xED\xA0\x80"));  // surrogate
  EXPECT_FALSE(unicode::is_valid_utf8("\xC0\xAF"));      // overlong
  // Each maximal invalid subpart becomes one U+FFFD.
  EXPECT_EQ(unicode::to_valid_utf8("a\xF0\x9F\x99z"), "a\xEF\xBF\xBDz");
  EXPECT_EQ(unicode::to_valid_utf8("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(unicode::to_valid_utf8("\xE4\x41"), "\xEF\xBF\xBD" "A");
  // Incomplete tails are held back, invalid ones are not.
  EXPECT_EQ(unicode::complete_utf8_prefix("ab\xF0\x9F\x99"), 2u);
  EXPECT_EQ(unicode::complete_utf8_prefix("ab\xE4"), 2u);
  EXPECT_EQ(unicode::complete_utf8_prefix("ab\xE4\x41"), 4u);
  EXPECT_EQ(unicode::complete_utf8_prefix("ab\xC3\xA9"), 4u);
  EXPECT_EQ(unicode::complete_utf8_prefix("\x80"), 1u);
}

std::vector<std::string> split(SplitPattern p, std::string_view text) {
  std::vector<std::string_view> views;
  split_by_pattern(p, text, views);
  return {views.begin(), views.end()};
}

using Pieces = std::vector<std::string>;

// Expected pieces were produced by a backtracking regex engine on the same patterns.
TEST(TokenizerSplitPattern, Qwen2) {
  EXPECT_EQ(split(SplitPattern::kQwen2, "Hello world!"), (Pieces{"Hello", " world", "!"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "  leading and trailing spaces   "),
            (Pieces{" ", " leading", " and", " trailing", " spaces", "   "}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "line five\r\nwindows\n\n\nx"),
            (Pieces{"line", " five", "\r\n", "windows", "\n\n\n", "x"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "I'm SHOUTING'S 12345"),
            (Pieces{"I", "'m", " SHOUTING", "'S", " ", "1", "2", "3", "4", "5"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "f(x):\n    return x**2  # sq\n"),
            (Pieces{"f", "(x", "):\n", "   ", " return", " x", "**", "2", " ", " #", " sq", "\n"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "   \n\n   \t  end"), (Pieces{"   \n\n", "   \t ", " end"}));
  EXPECT_EQ(split(SplitPattern::kQwen2, "\u4E2D\u6587\uFF0C\u6807"), (Pieces{"\u4E2D\u6587", "\uFF0C\u6807"}));
}

TEST(TokenizerSplitPattern, Llama3AndGpt2) {
  EXPECT_EQ(split(SplitPattern::kLlama3, "year 2025, 1234567"),
            (Pieces{"year", " ", "202", "5", ",", " ", "123", "456", "7"}));
  EXPECT_EQ(split(SplitPattern::kGpt2, "I'M here 2025!!  ok"),
            (Pieces{"I", "'", "M", " here", " 2025", "!!", " ", " ok"}));
}

TEST(TokenizerSplitPattern, DetectsSupportedPatternsOnly) {
  for (SplitPattern p : {SplitPattern::kGpt2, SplitPattern::kQwen2, SplitPattern::kLlama3}) {
    auto d = detect_split_pattern(split_pattern_regex(p), "tokenizer.json");
    ASSERT_TRUE(d.has_value());
    EXPECT_EQ(*d, p);
  }
  auto bad = detect_split_pattern("\\w+|\\s+", "some/tokenizer.json");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidFile);
  EXPECT_NE(bad.status().message().find("some/tokenizer.json"), std::string::npos);
  EXPECT_NE(bad.status().message().find("\\w+|\\s+"), std::string::npos);
}

}  // namespace
}  // namespace origami
