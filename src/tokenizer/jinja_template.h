#pragma once
// A parsed Jinja template and its interpreter. Rendering is deterministic and bounded: output
// size, work steps and macro call depth are capped so a hostile template cannot hang or exhaust
// memory. Errors are thrown as JinjaError inside and returned as Status by the public API.
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_lexer.h"

namespace origami::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;
  int64_t max_steps = 20'000'000;  // statements executed + expressions evaluated
  int max_call_depth = 64;         // nested macro calls
};

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
