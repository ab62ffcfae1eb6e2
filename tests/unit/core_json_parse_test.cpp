// The JSON depth limit (core/json_parse.h) against a brute force, and the bounded rendering of
// values in error messages (core/json_excerpt.h).
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami {
namespace {

// Random JSON text of at most `depth` levels, with strings full of brackets, quotes and escapes
// (the bytes a pre-scan must not count), and whitespace between tokens.
class RandomJson {
 public:
  explicit RandomJson(uint32_t seed) : rng_(seed) {}

  std::string value(int depth) {
    const int kind = pick(depth > 0 ? 8 : 5);
    std::string s = space();
    switch (kind) {
      case 0: s += "null"; break;
      case 1: s += pick(2) ? "true" : "false"; break;
      case 2: s += std::to_string(static_cast<int>(rng_() % 2001) - 1000); break;
      case 3: s += "-1.5e3"; break;
      case 4: s += string(); break;
      case 5:
      case 6: {
        s += '[';
        const int n = pick(4);
        for (int i = 0; i < n; ++i) s += (i ? "," : "") + value(depth - 1);
        s += space() + ']';
        break;
      }
      default: {
        s += '{';
        const int n = pick(4);
        for (int i = 0; i < n; ++i) s += (i ? "," : "") + space() + string() + space() + ":" + value(depth - 1);
        s += space() + '}';
        break;
      }
    }
    return s + space();
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }
  std::string space() { return pick(4) == 0 ? " \n" : ""; }
  std::string string() {
    static const char* kPieces[] = {"[", "]", "{", "}", "\\\"", "\\\\", "\\\\\\\"", "a", "\\u005b", "\\n", ":", ","};
    std::string s = "\"";
    const int n = pick(6);
    for (int i = 0; i < n; ++i) s += kPieces[pick(12)];
    return s + "\"";
  }
  std::mt19937 rng_;
};

// A brute force independent of the scan: a recursive-descent reader of valid JSON that records
// the deepest nesting and where nesting first passes `limit`.
struct DescentDepth {
  std::string_view text;
  int limit = 0;
  size_t pos = 0;
  int deepest = 0;
  std::optional<size_t> first_excess;

  void skip_space() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) ++pos;
  }
  void string() {
    ++pos;  // opening quote
    while (text[pos] != '"') pos += text[pos] == '\\' ? 2 : 1;
    ++pos;
  }
  void value(int depth) {
    skip_space();
    const char c = text[pos];
    if (c == '[' || c == '{') {
      const int inner = depth + 1;
      deepest = std::max(deepest, inner);
      if (inner > limit && !first_excess) first_excess = pos;
      const char close = c == '[' ? ']' : '}';
      ++pos;
      skip_space();
      while (text[pos] != close) {
        if (c == '{') {
          skip_space();
          string();
          skip_space();
          ++pos;  // ':'
        }
        value(inner);
        skip_space();
        if (text[pos] == ',') ++pos;
        skip_space();
      }
      ++pos;
    } else if (c == '"') {
      string();
    } else {
      while (pos < text.size() && std::string_view(",]} \n").find(text[pos]) == std::string_view::npos) ++pos;
    }
    skip_space();
  }
};

TEST(JsonDepth, MatchesRecursiveDescentOnRandomJson) {
  RandomJson gen(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string text = gen.value(trial % 9);
    ASSERT_FALSE(nlohmann::json::parse(text, nullptr, false).is_discarded()) << text;  // the generator writes JSON
    for (int limit : {0, 1, 2, 3, 5}) {
      DescentDepth brute;
      brute.text = text;
      brute.limit = limit;
      brute.value(0);
      ASSERT_EQ(brute.pos, text.size()) << text;
      ASSERT_EQ(json_nesting_depth(text), brute.deepest) << text;
      ASSERT_EQ(find_json_depth_excess(text, limit), brute.first_excess) << "limit " << limit << ": " << text;
      Expected<nlohmann::json> parsed = parse_json(text, limit);
      ASSERT_EQ(parsed.has_value(), !brute.first_excess) << text;
      if (parsed) {
        EXPECT_EQ(*parsed, nlohmann::json::parse(text));
      }
    }
  }
}

TEST(JsonDepth, BracketsInsideStringsDoNotCount) {
  EXPECT_EQ(json_nesting_depth(R"(["[[[[{{{{", "\"[[[", "\\", {"k[": "]]]]"}])"), 2);
  EXPECT_EQ(json_nesting_depth(R"("\\\"[")"), 0);
  EXPECT_EQ(json_nesting_depth("17"), 0);
  EXPECT_EQ(json_nesting_depth("[]"), 1);
}

TEST(JsonDepth, MillionDeepIsRefusedWithWhere) {
  const int depth = 1000000;
  for (const auto& [open, close] : {std::pair{"[", "]"}, std::pair{"{\"a\":", "}"}}) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += "1";
    for (int i = 0; i < depth; ++i) text += close;
    Expected<nlohmann::json> j = parse_json(text);
    ASSERT_FALSE(j.has_value());
    const size_t at = std::string(open).size() * kRequestJsonMaxDepth;  // the 65th opening bracket
    EXPECT_EQ(j.status().message(), "JSON nested deeper than 64 levels at byte offset " + std::to_string(at));
    EXPECT_EQ(json_nesting_depth(text), depth);
  }
}

TEST(JsonDepth, LimitIsInclusiveAndFilesGetMore) {
  auto nested = [](int d) { return std::string(static_cast<size_t>(d), '[') + std::string(static_cast<size_t>(d), ']'); };
  EXPECT_TRUE(parse_json(nested(kRequestJsonMaxDepth)).has_value());
  EXPECT_FALSE(parse_json(nested(kRequestJsonMaxDepth + 1)).has_value());
  EXPECT_TRUE(parse_json(nested(kFileJsonMaxDepth), kFileJsonMaxDepth).has_value());
  EXPECT_FALSE(parse_json(nested(kFileJsonMaxDepth + 1), kFileJsonMaxDepth).has_value());
}

TEST(JsonDepth, InvalidJsonIsAnErrorThatQuotesNothing) {
  EXPECT_EQ(parse_json("[1, 2, x]").status().message(), "not valid JSON at byte 8");
  for (const std::string text : {"", "{", "[1,]", "{\"a\" 1}", "tru", "\"unterminated", "]]]][[[[", "{} {}", "[1] x"}) {
    Expected<nlohmann::json> j = parse_json(text);
    ASSERT_FALSE(j.has_value()) << text;
    EXPECT_EQ(j.status().message().rfind("not valid JSON at byte ", 0), 0u) << j.status().message();
  }
}

// nlohmann reports a number beyond double's range as out_of_range, not parse_error: found by the
// fuzzers (a bare body "1e3082" used to terminate the server).
TEST(JsonDepth, NumberOutOfRangeIsAnError) {
  for (const std::string text : {"1e3082", "[1e999]", "{\"max_tokens\": -1e400}"}) {
    Expected<nlohmann::json> j = parse_json(text);
    ASSERT_FALSE(j.has_value()) << text;
    EXPECT_EQ(j.status().message(), "not valid JSON: a number is out of range") << text;
  }
}

TEST(JsonExcerpt, ShortValuesAreTheirCompactJson) {
  for (const char* text : {"null", "true", "-3", "1.5", "\"hi\"", "[]", "{}", "[1,[2,{\"a\":[]}],\"x\"]", "{\"a\":1,\"b\":[true]}"}) {
    const nlohmann::json v = nlohmann::json::parse(text);
    EXPECT_EQ(json_excerpt(v), v.dump()) << text;
  }
}

TEST(JsonExcerpt, LongValuesAreCutToTheBound) {
  RandomJson gen(11);
  for (int trial = 0; trial < 300; ++trial) {
    const nlohmann::json v = nlohmann::json::parse(gen.value(6));
    const std::string full = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    for (size_t bound : {size_t{0}, size_t{5}, size_t{40}, kJsonExcerptBytes}) {
      const std::string e = json_excerpt(v, bound);
      if (full.size() <= bound) {
        EXPECT_EQ(e, full);
      } else {
        EXPECT_EQ(e, full.substr(0, bound) + "...") << full;
      }
    }
  }
  const nlohmann::json big(std::string(1 << 20, 'x'));
  EXPECT_EQ(json_excerpt(big), "\"" + std::string(kJsonExcerptBytes - 1, 'x') + "...");
}

TEST(JsonExcerpt, DeepValuesAreRenderedWithoutRecursion) {
  // Built by hand (parse_json would refuse it): a million levels, rendered by its first bytes only.
  nlohmann::json v = 1;
  for (int i = 0; i < 1000000; ++i) {
    nlohmann::json outer = nlohmann::json::array();
    outer.push_back(std::move(v));
    v = std::move(outer);
  }
  EXPECT_EQ(json_excerpt(v), std::string(kJsonExcerptBytes, '[') + "...");
}

TEST(JsonExcerpt, InvalidUtf8IsReplacedNotThrown) {
  const nlohmann::json v = {{"k\xff", "\xc3"}};
  EXPECT_NO_THROW((void)json_excerpt(v));
  EXPECT_NO_THROW((void)json_excerpt(nlohmann::json("\xe2\x82")));
}

TEST(TextExcerpt, CutsAtACharacterBoundary) {
  EXPECT_EQ(text_excerpt("short"), "short");
  EXPECT_EQ(text_excerpt(std::string(300, 'a')), std::string(100, 'a') + "...");
  // "é" is two bytes; a cut inside it backs up to its start.
  EXPECT_EQ(text_excerpt("abc\xc3\xa9", 4), "abc...");
}

}  // namespace
}  // namespace origami
