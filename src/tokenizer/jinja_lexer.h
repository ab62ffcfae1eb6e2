#pragma once
// Splits a template into text and tag tokens, applying Jinja's whitespace control: `{%-`/`-%}`
// strip all whitespace on that side, `{%+` keeps it, and the trim_blocks / lstrip_blocks options
// behave as Jinja2's do (HF chat templates turn both on).
#include <string>
#include <vector>

namespace origami::jinja {

enum class TokenType { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOperator, kEof };

struct Token {
  TokenType type;
  std::string text;  // text data, name, decoded string literal, number spelling, or operator
  int line = 1;
  int column = 1;
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

// Throws JinjaError (with line/column) on a malformed template.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& options);

}  // namespace origami::jinja
