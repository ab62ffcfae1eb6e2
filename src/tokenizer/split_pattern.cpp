#include "tokenizer/split_pattern.h"

#include "tokenizer/unicode.h"

namespace origami {
namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// One decoded character with its classes.
struct Char {
  char32_t cp = 0;
  size_t end = 0;  // byte offset just past it
  bool letter = false, number = false, space = false;
};

class Scanner {
 public:
  explicit Scanner(std::string_view text) : text_(text) {}
  size_t size() const { return text_.size(); }

  Char at(size_t pos) const {
    Char c;
    const auto b = static_cast<unsigned char>(text_[pos]);
    if (b < 0x80) {  // ASCII fast path
      c.cp = b;
      c.end = pos + 1;
      c.letter = ((b | 0x20) >= 'a' && (b | 0x20) <= 'z');
      c.number = b >= '0' && b <= '9';
      c.space = b == ' ' || (b >= 0x09 && b <= 0x0D);
      return c;
    }
    size_t p = pos;
    c.cp = unicode::next_code_point(text_, p);
    c.end = p;
    c.letter = unicode::is_letter(c.cp);
    c.number = !c.letter && unicode::is_number(c.cp);
    c.space = !c.letter && !c.number && unicode::is_whitespace(c.cp);
    return c;
  }

  size_t skip_letters(size_t pos) const {
    while (pos < size()) {
      const Char c = at(pos);
      if (!c.letter) break;
      pos = c.end;
    }
    return pos;
  }
  size_t skip_numbers(size_t pos, int max_count) const {
    for (int n = 0; pos < size() && n < max_count; ++n) {
      const Char c = at(pos);
      if (!c.number) break;
      pos = c.end;
    }
    return pos;
  }
  // [^\s\p{L}\p{N}]*
  size_t skip_other(size_t pos) const {
    while (pos < size()) {
      const Char c = at(pos);
      if (c.letter || c.number || c.space) break;
      pos = c.end;
    }
    return pos;
  }
  size_t skip_newlines(size_t pos) const {
    while (pos < size() && (text_[pos] == '\r' || text_[pos] == '\n')) ++pos;
    return pos;
  }

  // 's|'t|'re|'ve|'m|'ll|'d, optionally ignoring case. Returns the end or 0.
  size_t contraction(size_t pos, bool ignore_case) const {
    if (text_[pos] != '\'' || pos + 1 >= size()) return 0;
    auto lower = [&](size_t p, size_t& end) -> char32_t {
      Char c = at(p);
      end = c.end;
      char32_t cp = c.cp;
      if (ignore_case) {
        if (cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
        if (cp == 0x17F) cp = 's';  // LATIN SMALL LETTER LONG S case-folds to 's'
      }
      return cp;
    };
    size_t e1;
    const char32_t c1 = lower(pos + 1, e1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return e1;
    if (e1 >= size()) return 0;
    size_t e2;
    const char32_t c2 = lower(e1, e2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return e2;
    return 0;
  }

  // The whitespace run starting at pos: its end, the start of its last char, and the end of its
  // last '\r' or '\n' (0 if none).
  struct SpaceRun {
    size_t end, last_start, last_newline_end;
  };
  SpaceRun space_run(size_t pos) const {
    SpaceRun r{pos, pos, 0};
    while (r.end < size()) {
      const Char c = at(r.end);
      if (!c.space) break;
      r.last_start = r.end;
      if (c.cp == '\r' || c.cp == '\n') r.last_newline_end = c.end;
      r.end = c.end;
    }
    return r;
  }

 private:
  std::string_view text_;
};

// \s+(?!\S)|\s+ at a whitespace char: the run, less its last char when a non-space follows
// (so that the last space joins the next word), unless that would leave it empty.
size_t match_trailing_space(const Scanner::SpaceRun& run, size_t pos, size_t size) {
  if (run.end == size) return run.end;
  if (run.last_start > pos) return run.last_start;
  return run.end;
}

size_t match_gpt2(const Scanner& s, size_t pos) {
  if (size_t e = s.contraction(pos, /*ignore_case=*/false)) return e;
  const Char c = s.at(pos);
  const bool space_prefix = c.cp == ' ' && c.end < s.size();
  const Char next = space_prefix ? s.at(c.end) : Char{};
  // ' ?\p{L}+'
  if (c.letter) return s.skip_letters(c.end);
  if (space_prefix && next.letter) return s.skip_letters(next.end);
  // ' ?\p{N}+'
  if (c.number) return s.skip_numbers(c.end, 1 << 30);
  if (space_prefix && next.number) return s.skip_numbers(next.end, 1 << 30);
  // ' ?[^\s\p{L}\p{N}]+'
  if (!c.space) return s.skip_other(c.end);
  if (space_prefix && !next.letter && !next.number && !next.space) return s.skip_other(next.end);
  return match_trailing_space(s.space_run(pos), pos, s.size());
}

size_t match_qwen(const Scanner& s, size_t pos, int max_digits) {
  if (size_t e = s.contraction(pos, /*ignore_case=*/true)) return e;
  const Char c = s.at(pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.letter) return s.skip_letters(c.end);
  if (!c.number && c.cp != '\r' && c.cp != '\n' && c.end < s.size()) {
    const Char next = s.at(c.end);
    if (next.letter) return s.skip_letters(next.end);
  }
  // \p{N} or \p{N}{1,3}
  if (c.number) return s.skip_numbers(c.end, max_digits - 1);
  // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
  if (!c.space) return s.skip_newlines(s.skip_other(c.end));
  if (c.cp == ' ' && c.end < s.size()) {
    const Char next = s.at(c.end);
    if (!next.letter && !next.number && !next.space) return s.skip_newlines(s.skip_other(next.end));
  }
  // \s*[\r\n]+ : backtracking leaves the run's last newline as the end.
  const Scanner::SpaceRun run = s.space_run(pos);
  if (run.last_newline_end != 0) return run.last_newline_end;
  return match_trailing_space(run, pos, s.size());
}

}  // namespace

Expected<SplitPattern> detect_split_pattern(std::string_view regex, const std::string& where) {
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  return invalid_file(where + ": unsupported pre-tokenizer split regex '" + std::string(regex) +
                      "' (supported: the GPT-2, Qwen2 and Llama-3 patterns)");
}

std::string_view split_pattern_regex(SplitPattern pattern) {
  switch (pattern) {
    case SplitPattern::kGpt2: return kGpt2Regex;
    case SplitPattern::kQwen2: return kQwen2Regex;
    case SplitPattern::kLlama3: return kLlama3Regex;
  }
  return {};
}

void split_by_pattern(SplitPattern pattern, std::string_view text, std::vector<std::string_view>& out) {
  const Scanner s(text);
  for (size_t pos = 0; pos < text.size();) {
    size_t end = 0;
    switch (pattern) {
      case SplitPattern::kGpt2: end = match_gpt2(s, pos); break;
      case SplitPattern::kQwen2: end = match_qwen(s, pos, 1); break;
      case SplitPattern::kLlama3: end = match_qwen(s, pos, 3); break;
    }
    if (end <= pos) end = s.at(pos).end;  // unreachable for these patterns: every char matches
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
}

}  // namespace origami
