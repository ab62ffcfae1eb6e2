#include "tokenizer/jinja_template.h"

#include <climits>
#include <cmath>
#include <unordered_map>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_parser.h"

namespace origami::jinja {
namespace {

// A variable scope. For-loop iterations, macro calls and blocks get their own, so `set` inside
// them does not leak out, as in Jinja2.
struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};
using ScopePtr = std::shared_ptr<Scope>;

enum class Flow { kNormal, kBreak, kContinue };

// A macro call sets up a scope, binds its arguments and captures its output: it takes the time
// of about this many plain steps, and is charged so (a macro calling itself twice per call would
// otherwise run 2**call-depth calls at one step each).
constexpr int64_t kMacroCallSteps = 10;

[[noreturn]] void rethrow_located(const JinjaError& e, int line, int column) {
  throw JinjaError("error at line " + std::to_string(line) + ", column " + std::to_string(column) + ": " + e.what(), true);
}

// Python ints are unbounded; ours are 64-bit, so overflow is an error rather than wrapping.
int64_t checked(bool overflowed, int64_t value) {
  if (overflowed) throw JinjaError("integer overflow (values are limited to 64 bits)");
  return value;
}

int64_t checked_add(int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflowed = __builtin_add_overflow(x, y, &r);
  return checked(overflowed, r);
}
int64_t checked_sub(int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflowed = __builtin_sub_overflow(x, y, &r);
  return checked(overflowed, r);
}
int64_t checked_mul(int64_t x, int64_t y) {
  int64_t r = 0;
  bool overflowed = __builtin_mul_overflow(x, y, &r);
  return checked(overflowed, r);
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) throw_undefined(a);
  if (b.is_undefined()) throw_undefined(b);
  auto unsupported = [&]() -> Value {
    throw JinjaError("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  bool nums = a.is_number() && b.is_number();
  bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) return Value(checked_add(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_float() + b.as_float());
    if (a.is_string() && b.is_string()) {
      budget_check(a.as_string().size() + b.as_string().size());
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_string()) throw JinjaError("can only concatenate str (not \"" + b.type_name() + "\") to str");
    if (a.is_sequence() && a.kind() == b.kind()) {
      budget_check((a.items().size() + b.items().size()) * sizeof(Value));
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      return a.is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
    }
    return unsupported();
  }
  if (op == "-") {
    if (ints) return Value(checked_sub(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_float() - b.as_float());
    return unsupported();
  }
  if (op == "*") {
    if (ints) return Value(checked_mul(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_float() * b.as_float());
    const Value* seq = (a.is_string() || a.is_sequence()) ? &a : (b.is_string() || b.is_sequence()) ? &b : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (!seq || !(count->is_int() || count->is_bool())) return unsupported();
    int64_t n = std::max<int64_t>(0, count->as_int());
    __int128 unit = std::max<int64_t>(1, seq->is_string() ? static_cast<int64_t>(seq->as_string().size()) : static_cast<int64_t>(seq->items().size()));
    if (static_cast<__int128>(n) * unit > (__int128{1} << 26)) {
      throw JinjaError("repetition result too large");
    }
    // Checked against the render's memory before anything is built (a list slot is a Value).
    budget_check(static_cast<size_t>(n * unit) * (seq->is_string() ? 1 : sizeof(Value)));
    if (seq->is_string()) {
      // Doubling: a few large copies instead of n small appends ('a' * 2**25 is 25 copies).
      const std::string& unit_text = seq->as_string();
      const size_t total = static_cast<size_t>(n) * unit_text.size();
      std::string out;
      out.reserve(total);
      if (total > 0) out = unit_text;
      while (out.size() < total) out.append(out, 0, std::min(out.size(), total - out.size()));
      return Value(std::move(out));
    }
    List out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->items().begin(), seq->items().end());
    return seq->is_list() ? Value::list(std::move(out)) : Value::tuple(std::move(out));
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_float() == 0) throw JinjaError("division by zero");
    return Value(a.as_float() / b.as_float());
  }
  if (op == "//" || op == "%") {
    if (op == "%" && a.is_string()) {
      CallArgs args;
      args.positional = b.is_tuple() ? b.items() : List{b};
      return apply_filter("format", a, args);
    }
    if (!nums) return unsupported();
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) throw JinjaError("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) {
        if (op == "%") return Value(0);
        throw JinjaError("integer overflow (values are limited to 64 bits)");
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {
        --q;
        r += y;
      }
      return op == "//" ? Value(q) : Value(r);
    }
    double x = a.as_float(), y = b.as_float();
    if (y == 0) throw JinjaError("float modulo or division by zero");
    if (op == "//") return Value(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value(r);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t result = 1, base = a.as_int();
      if (base == 0 || base == 1) return Value(b.as_int() == 0 ? int64_t{1} : base);
      if (base == -1) return Value(b.as_int() % 2 == 0 ? int64_t{1} : int64_t{-1});
      for (int64_t i = 0; i < b.as_int(); ++i) result = checked_mul(result, base);  // |base| >= 2: at most 63 steps
      return Value(result);
    }
    if (nums) return Value(std::pow(a.as_float(), b.as_float()));
    return unsupported();
  }
  return unsupported();
}

class Interpreter {
 public:
  Interpreter(RenderBudget& budget, std::string* out) : budget_(budget), limits_(budget.limits()), out_(out) {}

  Flow exec_body(const Body& body, const ScopePtr& scope) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, scope);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  void step() { budget_.step(); }

  // Output is bounded by max_output_bytes rather than the memory budget; copying it costs steps.
  void emit(const std::string& s) {
    if (out_->size() + s.size() > limits_.max_output_bytes) {
      throw JinjaError("rendered output exceeds the limit of " + std::to_string(limits_.max_output_bytes) + " bytes");
    }
    if (limits_.bytes_per_step > 0) budget_.step(static_cast<int64_t>(s.size()) / limits_.bytes_per_step);
    out_->append(s);
  }

  // Runs `body` with output captured into a string.
  std::string capture(const Body& body, const ScopePtr& scope) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    exec_body(body, scope);
    out_ = saved;
    return buf;
  }

  Flow exec(const Stmt& s, const ScopePtr& scope) {
    step();
    try {
      return exec_impl(s, scope);
    } catch (const JinjaError& e) {
      if (e.located()) throw;
      rethrow_located(e, s.line, s.column);
    }
  }

  static void unpack(const std::vector<std::string>& targets, const Value& value, Scope& into) {
    if (targets.size() == 1) {
      into.vars[targets[0]] = value;
      return;
    }
    if (!value.is_sequence() && !value.is_string() && !value.is_dict() && !value.is_undefined()) {
      throw JinjaError("cannot unpack non-iterable " + value.type_name() + " object");
    }
    List items = iterate(value);
    if (items.size() != targets.size()) {
      throw JinjaError(items.size() > targets.size() ? "too many values to unpack (expected " + std::to_string(targets.size()) + ")"
                                                     : "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) into.vars[targets[i]] = items[i];
  }

  Flow exec_impl(const Stmt& s, const ScopePtr& scope) {
    switch (s.kind) {
      case StmtKind::kText: emit(s.text); return Flow::kNormal;
      case StmtKind::kOutput: emit(eval(*s.expr, scope).to_str()); return Flow::kNormal;
      case StmtKind::kIf:
        for (size_t i = 0; i < s.conds.size(); ++i) {
          if (eval(*s.conds[i], scope).truthy()) return exec_body(s.bodies[i], scope);
        }
        if (s.bodies.size() > s.conds.size()) return exec_body(s.bodies.back(), scope);
        return Flow::kNormal;
      case StmtKind::kFor: return exec_for(s, scope);
      case StmtKind::kSet: {
        Value v = eval(*s.expr, scope);
        if (!s.attr.empty()) {
          const Value* target = scope->lookup(s.targets[0]);
          if (!target || !target->is_namespace()) throw JinjaError("cannot assign attribute on non-namespace object");
          if (v.reaches_namespace()) {
            std::string what = v.is_namespace() ? "a namespace" : "a " + v.type_name() + " that holds a namespace";
            throw JinjaError("cannot set namespace attribute '" + s.attr + "' to " + what +
                             ": a namespace could then hold itself");
          }
          target->entries().set(Value(s.attr), std::move(v));
        } else {
          unpack(s.targets, v, *scope);
        }
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        Value v(capture(s.bodies[0], inner));
        if (s.expr) v = eval_with_subject(*s.expr, scope, v);
        scope->vars[s.targets[0]] = v;
        return Flow::kNormal;
      }
      case StmtKind::kMacro: scope->vars[s.name] = make_macro(s, scope, nullptr); return Flow::kNormal;
      case StmtKind::kCallBlock: {
        Value caller = make_macro(s, scope, nullptr);
        const Expr& call = *s.expr;
        Value callee = eval(*call.args[0], scope);
        CallArgs args = eval_args(call, scope, 1);
        args.keyword.emplace_back("caller", caller);
        emit(invoke(callee, args).to_str());
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope;
        Value body(capture(s.bodies[0], inner));
        emit(eval_with_subject(*s.expr, scope, body).to_str());
        return Flow::kNormal;
      }
      case StmtKind::kBreak: return Flow::kBreak;
      case StmtKind::kContinue: return Flow::kContinue;
      case StmtKind::kScope: return exec_body(s.bodies[0], scope);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Stmt& s, const ScopePtr& scope) {
    List items = iterate(eval(*s.expr, scope));
    if (s.cond) {
      List kept;
      for (const Value& item : items) {
        step();
        auto probe = std::make_shared<Scope>();
        probe->parent = scope;
        unpack(s.targets, item, *probe);
        if (eval(*s.cond, probe).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      step();
      auto frame = std::make_shared<Scope>();
      frame->parent = scope;
      unpack(s.targets, items[static_cast<size_t>(i)], *frame);
      Dict loop;
      loop.set(Value("index"), Value(i + 1));
      loop.set(Value("index0"), Value(i));
      loop.set(Value("revindex"), Value(n - i));
      loop.set(Value("revindex0"), Value(n - i - 1));
      loop.set(Value("first"), Value(i == 0));
      loop.set(Value("last"), Value(i == n - 1));
      loop.set(Value("length"), Value(n));
      loop.set(Value("depth"), Value(1));
      loop.set(Value("depth0"), Value(0));
      loop.set(Value("previtem"), i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item"));
      loop.set(Value("nextitem"), i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item"));
      loop.set(Value("cycle"), Value::callable("loop.cycle", [i](CallArgs& a) {
        if (a.positional.empty()) throw JinjaError("no items for cycling given");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      }));
      frame->vars["loop"] = Value::dict(std::move(loop));
      if (exec_body(s.bodies[0], frame) == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) {
      auto frame = std::make_shared<Scope>();
      frame->parent = scope;
      exec_body(s.bodies[1], frame);
    }
    return Flow::kNormal;
  }

  // A macro (or a call block's `caller`) as a callable value that renders its body.
  Value make_macro(const Stmt& m, const ScopePtr& scope, const Value*) {
    const Stmt* macro = &m;
    std::string name = m.kind == StmtKind::kMacro ? m.name : "caller";
    // The scope usually holds the macro itself; a weak reference avoids a reference cycle and
    // keep_alive_ keeps the scope valid until the render ends.
    keep_alive_.push_back(scope);
    std::weak_ptr<Scope> weak_scope = scope;
    return Value::callable(name, [this, macro, weak_scope, name](CallArgs& args) -> Value {
      if (++call_depth_ > limits_.max_call_depth) throw JinjaError("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
      budget_.step(kMacroCallSteps);
      auto frame = std::make_shared<Scope>();
      frame->parent = weak_scope.lock();
      const auto& params = macro->params;
      if (args.positional.size() > params.size()) {
        throw JinjaError("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
      }
      std::vector<bool> bound(params.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        frame->vars[params[i]] = args.positional[i];
        bound[i] = true;
      }
      for (auto& [k, v] : args.keyword) {
        if (k == "caller") {
          frame->vars["caller"] = v;
          continue;
        }
        size_t idx = 0;
        while (idx < params.size() && params[idx] != k) ++idx;
        if (idx == params.size()) throw JinjaError("macro '" + name + "' takes no keyword argument '" + k + "'");
        frame->vars[k] = v;
        bound[idx] = true;
      }
      for (size_t i = 0; i < params.size(); ++i) {
        if (bound[i]) continue;
        frame->vars[params[i]] = macro->defaults[i] ? eval(*macro->defaults[i], frame)
                                                    : Value::undefined("parameter '" + params[i] + "' was not provided");
      }
      std::string out = capture(macro->bodies[0], frame);
      --call_depth_;
      return Value(out);
    });
  }

  static Value invoke(const Value& callee, CallArgs& args) {
    if (callee.is_callable()) return callee.call(args);
    if (callee.is_undefined()) throw_undefined(callee);
    throw JinjaError("'" + callee.type_name() + "' object is not callable");
  }

  CallArgs eval_args(const Expr& e, const ScopePtr& scope, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) args.positional.push_back(eval(*e.args[i], scope));
    for (size_t i = 0; i < e.kwargs.size(); ++i) args.keyword.emplace_back(e.kwnames[i], eval(*e.kwargs[i], scope));
    return args;
  }

  // Evaluates a filter chain whose innermost subject is left out (filter blocks, set blocks).
  Value eval_with_subject(const Expr& e, const ScopePtr& scope, const Value& subject) {
    const Value* saved = block_subject_;
    block_subject_ = &subject;
    Value v = eval(e, scope);
    block_subject_ = saved;
    return v;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    step();
    try {
      return eval_impl(e, scope);
    } catch (const JinjaError& err) {
      if (err.located()) throw;
      rethrow_located(err, e.line, e.column);
    }
  }

  Value eval_impl(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: {
        const Value* v = scope->lookup(e.name);
        return v ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        List items;
        for (const auto& a : e.args) items.push_back(eval(*a, scope));
        return e.kind == ExprKind::kList ? Value::list(std::move(items)) : Value::tuple(std::move(items));
      }
      case ExprKind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.set(eval(*e.args[i], scope), eval(*e.args[i + 1], scope));
        return Value::dict(std::move(d));
      }
      case ExprKind::kGetAttr: return get_attr(eval(*e.args[0], scope), e.name);
      case ExprKind::kGetItem: {
        Value obj = eval(*e.args[0], scope);
        return get_item(obj, eval(*e.args[1], scope));
      }
      case ExprKind::kSlice: {
        Value obj = eval(*e.args[0], scope);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.args[static_cast<size_t>(i) + 1]) parts[i] = eval(*e.args[static_cast<size_t>(i) + 1], scope);
        }
        return slice_value(obj, parts[0], parts[1], parts[2]);
      }
      case ExprKind::kCall: {
        Value callee = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope, 1);
        return invoke(callee, args);
      }
      case ExprKind::kFilter: {
        Value subject = e.args[0] ? eval(*e.args[0], scope) : (block_subject_ ? *block_subject_ : Value());
        CallArgs args = eval_args(e, scope, 1);
        return apply_filter(e.name, subject, args);
      }
      case ExprKind::kTest: {
        Value subject = eval(*e.args[0], scope);
        CallArgs args = eval_args(e, scope, 1);
        return Value(apply_test(e.name, subject, args) != e.negated);
      }
      case ExprKind::kUnary: {
        Value v = eval(*e.args[0], scope);
        if (e.name == "not") return Value(!v.truthy());
        if (v.is_undefined()) throw_undefined(v);
        if (!v.is_number()) throw JinjaError("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        return v.is_float() ? Value(-v.as_float()) : Value(checked_sub(0, v.as_int()));
      }
      case ExprKind::kBinary: {
        Value a = eval(*e.args[0], scope);
        if (e.name == "and") return a.truthy() ? eval(*e.args[1], scope) : a;
        if (e.name == "or") return a.truthy() ? a : eval(*e.args[1], scope);
        Value b = eval(*e.args[1], scope);
        if (e.name == "~") {
          std::string sa = a.to_str(), sb = b.to_str();
          budget_check(sa.size() + sb.size());
          std::string s = sa + sb;
          if (s.size() > limits_.max_output_bytes) throw JinjaError("string exceeds the output limit");
          return Value(std::move(s));
        }
        Value r = arithmetic(e.name, a, b);
        if (r.is_string() && r.as_string().size() > limits_.max_output_bytes) throw JinjaError("string exceeds the output limit");
        return r;
      }
      case ExprKind::kCompare: {
        Value left = eval(*e.args[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case ExprKind::kCondExpr: {
        if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
        return e.args[2] ? eval(*e.args[2], scope) : Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return Value();
  }

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return a.equals(b);
    if (op == "!=") return !a.equals(b);
    if (op == "in" || op == "not in") {
      CallArgs args;
      args.positional.push_back(b);
      return apply_test("in", a, args) == (op == "in");
    }
    if (a.is_undefined()) throw_undefined(a);
    if (b.is_undefined()) throw_undefined(b);
    int c = compare_values(a, b);
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }

  RenderBudget& budget_;
  const RenderLimits& limits_;
  std::string* out_;
  const Value* block_subject_ = nullptr;
  int call_depth_ = 0;
  std::vector<ScopePtr> keep_alive_;
};

// Unknown filters and tests are errors when the template is loaded, as in Jinja2.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::kFilter && !has_filter(e->name)) {
    throw JinjaError("error at line " + std::to_string(e->line) + ", column " + std::to_string(e->column) + ": no filter named '" + e->name + "'", true);
  }
  if (e->kind == ExprKind::kTest && !has_test(e->name)) {
    throw JinjaError("error at line " + std::to_string(e->line) + ", column " + std::to_string(e->column) + ": no test named '" + e->name + "'", true);
  }
  for (const auto& a : e->args) check_names(a.get());
  for (const auto& a : e->kwargs) check_names(a.get());
}

void check_names(const Body& body) {
  for (const auto& s : body) {
    check_names(s->expr.get());
    check_names(s->cond.get());
    for (const auto& c : s->conds) check_names(c.get());
    for (const auto& d : s->defaults) check_names(d.get());
    for (const auto& b : s->bodies) check_names(b);
  }
}

}  // namespace

Expected<Template> Template::parse(const std::string& source, const LexerOptions& options) {
  try {
    auto body = std::make_shared<Body>(parse_template(source, options));
    check_names(*body);
    Template t;
    t.body_ = std::move(body);
    return t;
  } catch (const JinjaError& e) {
    return invalid_file(std::string("jinja template: ") + e.what());
  } catch (const std::exception& e) {
    return internal_error(std::string("jinja template: ") + e.what());
  }
}

Expected<std::string> Template::render(const Value& variables, const RenderLimits& limits) const {
  try {
    auto globals = std::make_shared<Scope>();
    for (auto& [k, v] : builtin_globals().items) globals->vars[k.as_string()] = v;
    if (variables.is_dict()) {
      for (const auto& [k, v] : variables.entries().items) {
        if (k.is_string()) globals->vars[k.as_string()] = v;
      }
    }
    // The inputs were built by the caller and are not charged; they widen the budget instead (a
    // long conversation is copied a few times by any template). Everything below is charged.
    RenderBudget budget(limits, held_bytes(variables));
    ActiveBudget active(&budget);
    auto root = std::make_shared<Scope>();
    root->parent = globals;
    std::string out;
    Interpreter interp(budget, &out);
    interp.exec_body(*body_, root);
    return out;
  } catch (const JinjaError& e) {
    return invalid_argument(std::string("jinja template: ") + e.what());
  } catch (const std::exception& e) {
    return internal_error(std::string("jinja template: ") + e.what());
  }
}

}  // namespace origami::jinja
