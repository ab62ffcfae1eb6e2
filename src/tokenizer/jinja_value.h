#pragma once
// The dynamic value of the Jinja interpreter, modelled on the Python objects that Jinja2 templates
// see: None, bool, int, float, str, list, tuple, dict (insertion-ordered), namespace, callables and
// Jinja's Undefined. Lists and dicts are shared by reference, as in Python. A namespace is the only
// value a template can change after it is built, and an attribute may not be set to a value that
// reaches a namespace (Value::reaches_namespace): so no value can come to hold itself (a reference
// cycle, which would leak, and print or compare forever), and the nesting depth counted when a
// container is built stays within one layer of namespace contents of the truth. During a render, every
// string a value holds (on construction and on every copy) and every container's storage is
// charged to the render's budget (jinja_budget.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja_budget.h"

namespace origami::jinja {

// A template error (syntax or runtime). Thrown inside the interpreter only; the public API turns it
// into a Status. `located` says whether the line/column has been added to the message yet.
class JinjaError : public std::runtime_error {
 public:
  explicit JinjaError(const std::string& message, bool located = false)
      : std::runtime_error(message), located_(located) {}
  bool located() const { return located_; }

 private:
  bool located_;
};

class Value;
using List = std::vector<Value>;

struct Dict {
  std::vector<std::pair<Value, Value>> items;  // insertion order, as Python dicts keep it
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The keyword `name`, else positional `index`, else nullptr.
  const Value* get(size_t index, const std::string& name) const;
};

using NativeFunction = std::function<Value(CallArgs&)>;

enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict, kNamespace, kCallable };

class Value {
 public:
  Value() = default;  // Undefined
  static Value undefined(std::string name = "") {
    Value v;
    v.str_ = std::move(name);
    return v;
  }
  static Value none() { return Value(Kind::kNone); }
  Value(bool b) : kind_(Kind::kBool), int_(b ? 1 : 0) {}
  Value(int v) : kind_(Kind::kInt), int_(v) {}
  Value(int64_t v) : kind_(Kind::kInt), int_(v) {}
  Value(double v) : kind_(Kind::kFloat), float_(v) {}
  Value(std::string s) : kind_(Kind::kString), str_(charged(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(const Value& other);
  Value& operator=(const Value& other);
  Value(Value&&) noexcept = default;
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;
  static Value list(List items = {});
  static Value tuple(List items);
  static Value dict(Dict d = {});
  static Value ns(Dict d = {});
  // `captured`: a value `fn` holds on to (a dict's methods hold the dict), for reaches_namespace().
  static Value callable(std::string name, NativeFunction fn, const Value* captured = nullptr);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's bool is an int: True + 1 == 2.
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_sequence() const { return kind_ == Kind::kList || kind_ == Kind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // int or bool
  double as_float() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return str_; }
  const std::string& undefined_name() const { return str_; }
  List& items() const { return *list_; }  // list or tuple
  Dict& entries() const { return *dict_; }  // dict or namespace
  Value call(CallArgs& args) const;
  const std::string& callable_name() const { return str_; }

  // Whether this is a namespace or holds one (in a list, tuple, dict or captured by a callable).
  // Known when the value is built: only namespaces change afterwards, and they may not be given
  // a value that reaches a namespace.
  bool reaches_namespace() const { return kind_ == Kind::kNamespace || holds_namespace_; }

  bool truthy() const;
  // str(value) as Python/Jinja prints it; Undefined prints as "".
  std::string to_str() const;
  // repr(value), used for items inside printed containers.
  std::string repr() const;
  std::string type_name() const;

  // Python ==.
  bool equals(const Value& other) const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  // A dict or namespace holding `d`.
  static Value keyed(Kind kind, Dict d);
  static std::string charged(std::string s) {
    budget_charge(s.size());
    return s;
  }
  // Charges a container of `items` and sets its nesting depth (throws past the render's limit).
  void account_container(size_t storage_bytes, const Value* items, size_t count, size_t stride);

  Kind kind_ = Kind::kUndefined;
  bool holds_namespace_ = false;  // see reaches_namespace(); with kind_, fits before depth_
  uint32_t depth_ = 0;  // lists/dicts: 1 + the deepest element's depth
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<NativeFunction> fn_;
};

// Python's ordering (<) for numbers, strings and sequences; throws JinjaError on other types.
int compare_values(const Value& a, const Value& b);

// Python's repr() of a float ("1.0", "1e+20", "0.30000000000000004").
std::string format_float(double v);

// Bytes `v` holds (strings and container slots, recursively): the size of a render's inputs.
size_t held_bytes(const Value& v);

// JSON <-> Value. Key order of ordered_json is kept; nlohmann::json arrives sorted.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

struct JsonOptions {
  int indent = -1;  // < 0: single line
  std::string item_separator;  // empty: Python's default for the indent mode
  std::string key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(value, ...) with Python's spacing rules.
std::string to_json(const Value& v, const JsonOptions& options);

// UTF-8 helpers: strings are indexed by code point, as Python str is.
std::vector<uint32_t> utf8_decode(const std::string& s);
std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end);
void utf8_append(std::string& out, uint32_t cp);

}  // namespace origami::jinja
