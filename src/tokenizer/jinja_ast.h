#pragma once
// The syntax tree of a parsed template: expressions and statements.
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace origami::jinja {

enum class ExprKind {
  kLiteral,    // literal
  kName,       // name
  kList,       // args = items
  kTuple,      // args = items
  kDict,       // args = key, value, key, value, ...
  kGetAttr,    // args[0] . name
  kGetItem,    // args[0] [ args[1] ]
  kSlice,      // args[0] [ args[1] : args[2] : args[3] ]  (null = omitted)
  kCall,       // args[0] ( args[1..], kwargs )
  kFilter,     // args[0] | name ( args[1..], kwargs ); args[0] null inside a filter block
  kTest,       // args[0] is [not] name ( args[1..], kwargs )
  kUnary,      // name in {"-", "+", "not"} applied to args[0]
  kBinary,     // args[0] name args[1]: + - * / // % ** ~ and or
  kCompare,    // args[0] ops[0] args[1] ops[1] args[2] ... (chained)
  kCondExpr,   // args[0] if args[1] else args[2] (null = undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::string> kwnames;
  std::vector<ExprPtr> kwargs;
  std::vector<std::string> ops;
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conds[i] -> bodies[i]; a trailing extra body is the else
  kFor,          // for targets in expr [if cond] body=bodies[0] else=bodies[1]
  kSet,          // set targets = expr, or set targets[0].attr = expr
  kSetBlock,     // set targets[0] %} bodies[0] {% endset, optional filter chain in expr
  kMacro,        // macro name(params=defaults) bodies[0]
  kCallBlock,    // call(params) expr %} bodies[0]
  kFilterBlock,  // filter expr %} bodies[0]
  kBreak,
  kContinue,
  kScope,        // bodies[0] run as is (e.g. HF's generation block)
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;  // for-loop filter
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attr;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
};

}  // namespace origami::jinja
