#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "tokenizer/jinja_value.h"

namespace origami::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string rstrip_ws(const std::string& s) {
  size_t end = s.size();
  while (end > 0 && is_space(s[end - 1])) --end;
  return s.substr(0, end);
}

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options) : src_(std::move(source)), opt_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos), pos);
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      std::string text = src_.substr(pos, tag - pos);
      text = strip_before(text, kind, sign, line_starting);
      emit_text(text, pos);
      size_t body = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        pos = skip_comment(tag, body, &line_starting);
      } else if (kind == '%' && is_raw_begin(body, &pos)) {
        pos = read_raw(tag, pos, &line_starting);
      } else {
        pos = read_tag(tag, body, kind == '%', &line_starting);
      }
    }
    tokens_.push_back({TokenType::kEof, "", line_of(src_.size()), col_of(src_.size())});
    return std::move(tokens_);
  }

 private:
  int line_of(size_t pos) const {
    return static_cast<int>(std::upper_bound(line_starts_.begin(), line_starts_.end(), pos) - line_starts_.begin());
  }
  int col_of(size_t pos) const { return static_cast<int>(pos - line_starts_[line_of(pos) - 1]) + 1; }

  [[noreturn]] void fail(const std::string& msg, size_t pos) const {
    throw JinjaError("syntax error at line " + std::to_string(line_of(pos)) + ", column " +
                         std::to_string(col_of(pos)) + ": " + msg,
                     true);
  }

  size_t find_tag(size_t pos) const {
    while (true) {
      size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // Whitespace control on the text before a tag: `-` strips all of it; otherwise lstrip_blocks
  // removes the indentation before a block or comment tag that starts its line.
  std::string strip_before(const std::string& text, char kind, char sign, bool line_starting) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign == '+' || !opt_.lstrip_blocks || kind == '{') return text;
    size_t l_pos = text.rfind('\n');
    l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
    if (l_pos == 0 && !line_starting) return text;
    if (l_pos == text.size()) return text;
    for (size_t i = l_pos; i < text.size(); ++i) {
      if (!is_space(text[i])) return text;
    }
    return text.substr(0, l_pos);
  }

  void emit_text(const std::string& text, size_t pos) {
    if (!text.empty()) tokens_.push_back({TokenType::kText, text, line_of(pos), col_of(pos)});
  }

  // After a block/comment end: `-` strips following whitespace, trim_blocks drops one newline.
  size_t strip_after(size_t pos, char sign, bool block, bool* line_starting) const {
    size_t start = pos;
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (sign != '+' && block && opt_.trim_blocks && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    *line_starting = pos > start ? src_[pos - 1] == '\n' : false;
    return pos;
  }

  size_t skip_comment(size_t tag, size_t body, bool* line_starting) {
    size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail("missing end of comment tag", tag);
    char sign = end > body ? src_[end - 1] : '\0';
    return strip_after(end + 2, sign, true, line_starting);
  }

  size_t skip_spaces(size_t p) const {
    while (p < src_.size() && is_space(src_[p])) ++p;
    return p;
  }

  // `{% raw %}`: sets *after to the position after the tag.
  bool is_raw_begin(size_t body, size_t* after) const {
    size_t p = skip_spaces(body);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_spaces(p + 3);
    if (src_.compare(p, 3, "-%}") == 0) {
      *after = skip_spaces(p + 3);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *after = p + 2;
      return true;
    }
    return false;
  }

  size_t read_raw(size_t tag, size_t pos, bool* line_starting) {
    size_t search = pos;
    while (true) {
      size_t p = src_.find("{%", search);
      if (p == std::string::npos) fail("missing end of raw directive", tag);
      size_t q = p + 2;
      char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q++] : '\0';
      q = skip_spaces(q);
      if (src_.compare(q, 6, "endraw") != 0) {
        search = p + 2;
        continue;
      }
      q = skip_spaces(q + 6);
      char end_sign = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) fail("unterminated endraw tag", p);
      std::string text = strip_before(src_.substr(pos, p - pos), '%', sign, false);
      emit_text(text, pos);
      return strip_after(q + 2, end_sign, true, line_starting);
    }
  }

  size_t read_tag(size_t tag, size_t pos, bool block, bool* line_starting) {
    tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_of(tag), col_of(tag)});
    std::vector<char> balance;
    const char* close = block ? "%}" : "}}";
    while (true) {
      pos = skip_spaces(pos);
      if (pos >= src_.size()) fail(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", tag);
      if (balance.empty()) {
        char sign = src_[pos];
        size_t end_at = std::string::npos;
        if ((sign == '-' || sign == '+') && src_.compare(pos + 1, 2, close) == 0) {
          end_at = pos + 3;
        } else if (src_.compare(pos, 2, close) == 0) {
          end_at = pos + 2;
          sign = '\0';
        }
        if (end_at != std::string::npos) {
          if (sign == '+' && !block) fail("unexpected '+'", pos);
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_of(pos), col_of(pos)});
          return strip_after(end_at, sign, block, line_starting);
        }
      }
      pos = read_token(pos, balance);
    }
  }

  size_t read_token(size_t pos, std::vector<char>& balance) {
    char c = src_[pos];
    int line = line_of(pos), col = col_of(pos);
    if (is_name_start(c)) {
      size_t end = pos;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      tokens_.push_back({TokenType::kName, src_.substr(pos, end - pos), line, col});
      return end;
    }
    if (is_digit(c)) return read_number(pos);
    if (c == '\'' || c == '"') return read_string(pos);
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (src_.compare(pos, 2, op) == 0) {
        tokens_.push_back({TokenType::kOperator, op, line, col});
        return pos + 2;
      }
    }
    static const std::string kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == std::string::npos) fail(std::string("unexpected char '") + c + "'", pos);
    if (c == '(' || c == '[' || c == '{') {
      balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) fail(std::string("unexpected '") + c + "'", pos);
      if (balance.back() != c) fail(std::string("unexpected '") + c + "', expected '" + balance.back() + "'", pos);
      balance.pop_back();
    }
    tokens_.push_back({TokenType::kOperator, std::string(1, c), line, col});
    return pos + 1;
  }

  size_t read_digits(size_t pos) const {
    while (pos < src_.size() && (is_digit(src_[pos]) || (src_[pos] == '_' && pos + 1 < src_.size() && is_digit(src_[pos + 1])))) ++pos;
    return pos;
  }

  size_t read_number(size_t pos) {
    size_t end = read_digits(pos);
    bool is_float = false;
    bool after_dot = pos > 0 && src_[pos - 1] == '.';  // `a.0.1` is attribute access, not a float
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      end = read_digits(end + 1);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        end = read_digits(e);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    tokens_.push_back({is_float ? TokenType::kFloat : TokenType::kInt, text, line_of(pos), col_of(pos)});
    return end;
  }

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // Python unicode-escape decoding; unknown escapes keep their backslash.
  size_t read_string(size_t pos) {
    char quote = src_[pos];
    std::string out;
    size_t p = pos + 1;
    while (true) {
      if (p >= src_.size()) fail("unterminated string literal", pos);
      char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail("unterminated string literal", pos);
      char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int i = 0; i < n; ++i) {
            int h = p + i < src_.size() ? hex_value(src_[p + i]) : -1;
            if (h < 0) fail("truncated \\" + std::string(1, e) + " escape in string literal", pos);
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          p += static_cast<size_t>(n);
          utf8_append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i) cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            utf8_append(out, cp);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({TokenType::kString, out, line_of(pos), col_of(pos)});
    return p + 1;
  }

  std::string src_;
  LexerOptions opt_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// Jinja normalises line endings to \n and, unless asked not to, drops one trailing newline.
std::string normalize_source(const std::string& source, bool keep_trailing_newline) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!keep_trailing_newline && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& options) {
  Lexer lexer(normalize_source(source, options.keep_trailing_newline), options);
  return lexer.run();
}

}  // namespace origami::jinja
