#pragma once
// A parsed Jinja template and its interpreter. Rendering is bounded: output size, work steps
// (charged per byte allocated too), memory, nesting, macro call depth and, as a backstop, wall
// time are capped (RenderLimits, jinja_budget.h) so a hostile template cannot hang or exhaust
// memory. Errors are thrown as JinjaError inside and returned as Status by the public API.
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_budget.h"
#include "tokenizer/jinja_lexer.h"

namespace origami::jinja {

class Template {
 public:
  // Parses and checks that every filter and test the template names exists.
  static Expected<Template> parse(const std::string& source, const LexerOptions& options = {});

  // Renders with `variables` (a dict value) on top of the built-in globals.
  Expected<std::string> render(const Value& variables, const RenderLimits& limits = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace origami::jinja
