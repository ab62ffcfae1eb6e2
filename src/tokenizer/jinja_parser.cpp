#include "tokenizer/jinja_parser.h"

#include <charconv>
#include <cstdlib>

namespace origami::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseLimits& limits) : toks_(std::move(tokens)), limits_(limits) {}

  Body parse_root() {
    Body body = parse_body({});
    if (cur().type != TokenType::kEof) fail("unexpected tag '" + cur().text + "'");
    return body;
  }

 private:
  // Counts nesting so that deeply nested input fails cleanly instead of overflowing the stack.
  struct DepthGuard {
    Parser* p;
    explicit DepthGuard(Parser* parser) : p(parser) {
      if (++p->depth_ > p->limits_.max_nesting) p->fail("template nesting too deep");
    }
    ~DepthGuard() { --p->depth_; }
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }

  [[noreturn]] void fail(const std::string& msg) const {
    const Token& t = cur();
    throw JinjaError("syntax error at line " + std::to_string(t.line) + ", column " + std::to_string(t.column) + ": " + msg, true);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEof: return "end of template";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVarEnd: return "end of print statement";
      case TokenType::kText: return "template data";
      case TokenType::kString: return "string";
      default: return "'" + t.text + "'";
    }
  }

  bool is_op(const char* op) const { return cur().type == TokenType::kOperator && cur().text == op; }
  bool is_name(const char* name) const { return cur().type == TokenType::kName && cur().text == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) fail("expected end of statement block, got " + describe(cur()));
    advance();
  }

  ExprPtr make(ExprKind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  // ---- statements ----

  // Parses until a block tag whose keyword is in `ends` (left as the current token) or the end.
  Body parse_body(const std::vector<std::string>& ends) {
    DepthGuard guard(this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEof) {
        if (!ends.empty()) {
          std::string expected;
          for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
          fail("unexpected end of template, expected " + expected);
        }
        return body;
      }
      if (t.type == TokenType::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = t.line;
        s->column = t.column;
        advance();
        s->expr = parse_tuple(true);
        if (cur().type != TokenType::kVarEnd) fail("expected end of print statement, got " + describe(cur()));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        advance();
        if (cur().type != TokenType::kName) fail("expected a statement name, got " + describe(cur()));
        for (const auto& e : ends) {
          if (cur().text == e) return body;
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr new_stmt(StmtKind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Consumes `{% endxxx %}` after parse_body stopped on it.
  void end_tag() {
    advance();
    expect_block_end();
  }

  StmtPtr parse_statement() {
    Token kw = cur();
    const std::string& k = kw.text;
    if (k == "for") return parse_for();
    if (k == "if") return parse_if();
    if (k == "set") return parse_set();
    if (k == "macro") return parse_macro();
    if (k == "call") return parse_call_block();
    if (k == "filter") return parse_filter_block();
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail("'" + k + "' outside of a loop");
      advance();
      expect_block_end();
      return new_stmt(k == "break" ? StmtKind::kBreak : StmtKind::kContinue, kw);
    }
    if (k == "generation") {
      advance();
      expect_block_end();
      auto s = new_stmt(StmtKind::kScope, kw);
      s->bodies.push_back(parse_body({"endgeneration"}));
      end_tag();
      return s;
    }
    fail("encountered unknown tag '" + k + "'");
  }

  StmtPtr parse_for() {
    auto s = new_stmt(StmtKind::kFor, cur());
    advance();
    bool paren = skip_op("(");
    do {
      if (paren && is_op(")")) break;
      s->targets.push_back(expect_name());
    } while (skip_op(","));
    if (paren) expect_op(")");
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->cond = parse_expression();
    if (skip_name("recursive")) fail("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->bodies.push_back(parse_body({"endfor", "else"}));
    --loop_depth_;
    if (is_name("else")) {
      advance();
      expect_block_end();
      s->bodies.push_back(parse_body({"endfor"}));
    }
    end_tag();
    return s;
  }

  StmtPtr parse_if() {
    auto s = new_stmt(StmtKind::kIf, cur());
    advance();
    s->conds.push_back(parse_tuple(false));
    expect_block_end();
    while (true) {
      s->bodies.push_back(parse_body({"elif", "else", "endif"}));
      if (is_name("elif")) {
        advance();
        s->conds.push_back(parse_tuple(false));
        expect_block_end();
        continue;
      }
      if (is_name("else")) {
        advance();
        expect_block_end();
        s->bodies.push_back(parse_body({"endif"}));
      }
      break;
    }
    end_tag();
    return s;
  }

  StmtPtr parse_set() {
    Token kw = cur();
    advance();
    std::vector<std::string> targets;
    std::string attr;
    targets.push_back(expect_name());
    if (skip_op(".")) {
      attr = expect_name();
    } else {
      while (skip_op(",")) {
        if (is_op("=")) break;
        targets.push_back(expect_name());
      }
    }
    if (skip_op("=")) {
      auto s = new_stmt(StmtKind::kSet, kw);
      s->targets = std::move(targets);
      s->attr = std::move(attr);
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    if (!attr.empty() || targets.size() != 1) fail("expected '='");
    auto s = new_stmt(StmtKind::kSetBlock, kw);
    s->targets = std::move(targets);
    if (is_op("|")) s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    s->bodies.push_back(parse_body({"endset"}));
    end_tag();
    return s;
  }

  void parse_params(Stmt* s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      s->params.push_back(expect_name());
      s->defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
    }
    expect_op(")");
  }

  StmtPtr parse_macro() {
    auto s = new_stmt(StmtKind::kMacro, cur());
    advance();
    s->name = expect_name();
    parse_params(s.get());
    expect_block_end();
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    s->bodies.push_back(parse_body({"endmacro"}));
    loop_depth_ = saved_loop_depth;
    end_tag();
    return s;
  }

  StmtPtr parse_call_block() {
    auto s = new_stmt(StmtKind::kCallBlock, cur());
    advance();
    if (is_op("(")) parse_params(s.get());
    s->expr = parse_expression();
    if (s->expr->kind != ExprKind::kCall) fail("expected a call");
    expect_block_end();
    s->bodies.push_back(parse_body({"endcall"}));
    end_tag();
    return s;
  }

  StmtPtr parse_filter_block() {
    auto s = new_stmt(StmtKind::kFilterBlock, cur());
    advance();
    s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
    expect_block_end();
    s->bodies.push_back(parse_body({"endfilter"}));
    end_tag();
    return s;
  }

  // ---- expressions ----

  bool at_tuple_end() const {
    const Token& t = cur();
    return t.type == TokenType::kBlockEnd || t.type == TokenType::kVarEnd || (t.type == TokenType::kOperator && t.text == ")") ||
           (t.type == TokenType::kName && (t.text == "recursive" || t.text == "if"));
  }

  ExprPtr parse_tuple(bool with_condexpr) {
    Token start = cur();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty() && at_tuple_end()) break;
      items.push_back(with_condexpr ? parse_expression() : parse_or());
      if (!skip_op(",")) break;
      is_tuple = true;
      if (at_tuple_end()) break;
    }
    if (!is_tuple) return std::move(items[0]);
    auto e = make(ExprKind::kTuple, start);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(this);
    Token start = cur();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      advance();
      auto e = make(ExprKind::kCondExpr, start);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression() : nullptr;
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(other));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(ExprKind::kBinary, at);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      Token at = cur();
      advance();
      left = binary(at, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      Token at = cur();
      advance();
      left = binary(at, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this);
      auto e = make(ExprKind::kUnary, cur());
      advance();
      e->name = "not";
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    Token start = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::kCompare, start);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      Token at = cur();
      advance();
      left = binary(at, at.text, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      Token at = cur();
      advance();
      left = binary(at, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      Token at = cur();
      advance();
      left = binary(at, at.text, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      Token at = cur();
      advance();
      left = binary(at, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto e = make(ExprKind::kUnary, cur());
      e->name = cur().text;
      advance();
      e->args.push_back(parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case TokenType::kName: {
        advance();
        auto e = make(ExprKind::kLiteral, t);
        if (t.text == "true" || t.text == "True") e->literal = Value(true);
        else if (t.text == "false" || t.text == "False") e->literal = Value(false);
        else if (t.text == "none" || t.text == "None") e->literal = Value::none();
        else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += cur().text;
          advance();
        }
        auto e = make(ExprKind::kLiteral, t);
        e->literal = Value(std::move(s));
        return e;
      }
      case TokenType::kInt: {
        advance();
        auto e = make(ExprKind::kLiteral, t);
        int64_t v = 0;
        auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (res.ec != std::errc()) fail("integer literal out of range: " + t.text);
        e->literal = Value(v);
        return e;
      }
      case TokenType::kFloat: {
        advance();
        auto e = make(ExprKind::kLiteral, t);
        e->literal = Value(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case TokenType::kOperator: {
        if (t.text == "(") {
          advance();
          if (skip_op(")")) {
            auto e = make(ExprKind::kTuple, t);
            return e;
          }
          ExprPtr inner = parse_tuple(true);
          expect_op(")");
          return inner;
        }
        if (t.text == "[") {
          advance();
          auto e = make(ExprKind::kList, t);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression());
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          advance();
          auto e = make(ExprKind::kDict, t);
          while (!is_op("}")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("}")) break;
            e->args.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          expect_op("}");
          return e;
        }
        break;
      }
      default: break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      Token t = cur();
      if (is_op(".")) {
        advance();
        if (cur().type == TokenType::kName) {
          auto e = make(ExprKind::kGetAttr, t);
          e->name = cur().text;
          advance();
          e->args.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().type == TokenType::kInt) {
          auto e = make(ExprKind::kGetItem, t);
          e->args.push_back(std::move(node));
          e->args.push_back(parse_primary());
          node = std::move(e);
        } else {
          fail("expected an attribute name, got " + describe(cur()));
        }
      } else if (is_op("[")) {
        advance();
        node = parse_subscript(std::move(node), t);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, const Token& at) {
    std::vector<ExprPtr> parts;
    bool is_slice = false;
    parts.push_back(is_op(":") ? nullptr : parse_expression());
    if (skip_op(":")) {
      is_slice = true;
      parts.push_back((is_op(":") || is_op("]")) ? nullptr : parse_expression());
      if (skip_op(":")) {
        parts.push_back(is_op("]") ? nullptr : parse_expression());
      } else {
        parts.push_back(nullptr);
      }
    }
    expect_op("]");
    auto e = make(is_slice ? ExprKind::kSlice : ExprKind::kGetItem, at);
    e->args.push_back(std::move(node));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // Parses `( args )` into e->args (after any already there) and e->kwnames/kwargs.
  void parse_call_args(Expr* e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator && peek().text == "=") {
        e->kwnames.push_back(cur().text);
        advance();
        advance();
        e->kwargs.push_back(parse_expression());
      } else {
        if (!e->kwnames.empty()) fail("positional argument follows keyword argument");
        e->args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(ExprKind::kCall, cur());
    e->args.push_back(std::move(callee));
    parse_call_args(e.get());
    return e;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::kName) {
      advance();
      name += "." + cur().text;
      advance();
    }
    return name;
  }

  ExprPtr parse_filter_chain(ExprPtr node, bool leading_pipe = true) {
    bool first = true;
    while (first ? (!leading_pipe || is_op("|")) : is_op("|")) {
      if (leading_pipe || !first) expect_op("|");
      first = false;
      auto e = make(ExprKind::kFilter, cur());
      e->name = parse_dotted_name();
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(e.get());
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        auto e = make(ExprKind::kTest, cur());
        advance();
        if (skip_name("not")) e->negated = true;
        e->name = parse_dotted_name();
        e->args.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(e.get());
        } else {
          const Token& t = cur();
          bool arg_start = t.type == TokenType::kName || t.type == TokenType::kString || t.type == TokenType::kInt ||
                           t.type == TokenType::kFloat || (t.type == TokenType::kOperator && (t.text == "[" || t.text == "{"));
          if (arg_start && !(t.type == TokenType::kName && (t.text == "else" || t.text == "or" || t.text == "and" || t.text == "if" || t.text == "in" || t.text == "not"))) {
            if (t.type == TokenType::kName && t.text == "is") fail("you cannot chain multiple tests with is");
            e->args.push_back(parse_postfix(parse_primary()));
          }
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  ParseLimits limits_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(const std::string& source, const LexerOptions& options, const ParseLimits& limits) {
  Parser parser(tokenize(source, options), limits);
  return parser.parse_root();
}

}  // namespace origami::jinja
