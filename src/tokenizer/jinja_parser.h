#pragma once
// Recursive-descent parser from lexer tokens to the template's statement tree, with Jinja2's
// operator precedence. Errors are JinjaErrors naming line and column.
#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace origami::jinja {

struct ParseLimits {
  int max_nesting = 200;  // expression and block nesting, so hostile input cannot exhaust the stack
};

Body parse_template(const std::string& source, const LexerOptions& options, const ParseLimits& limits = {});

}  // namespace origami::jinja
