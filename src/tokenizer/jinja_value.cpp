#include "tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace origami::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& [k, v] : items) {
    if (k.equals(key)) return &v;
  }
  return nullptr;
}

Value* Dict::find(const Value& key) {
  for (auto& [k, v] : items) {
    if (k.equals(key)) return &v;
  }
  return nullptr;
}

void Dict::set(const Value& key, Value value) {
  if (Value* slot = find(key)) {
    *slot = std::move(value);
  } else {
    items.emplace_back(key, std::move(value));
  }
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return index < positional.size() ? &positional[index] : nullptr;
}

Value::Value(const Value& other)
    : kind_(other.kind_),
      holds_namespace_(other.holds_namespace_),
      depth_(other.depth_),
      int_(other.int_),
      float_(other.float_),
      str_((budget_charge(other.str_.size()), other.str_)),
      list_(other.list_),
      dict_(other.dict_),
      fn_(other.fn_) {}

Value& Value::operator=(const Value& other) {
  if (this != &other) *this = Value(other);
  return *this;
}

void Value::account_container(size_t storage_bytes, const Value* items, size_t count, size_t stride) {
  budget_charge(storage_bytes);
  uint32_t deepest = 0;
  const char* p = reinterpret_cast<const char*>(items);
  for (size_t i = 0; i < count; ++i) {
    const Value& item = *reinterpret_cast<const Value*>(p + i * stride);
    deepest = std::max(deepest, item.depth_);
    holds_namespace_ = holds_namespace_ || item.reaches_namespace();
  }
  depth_ = deepest + 1;
  int limit = budget_max_nesting();
  if (limit > 0 && depth_ > static_cast<uint32_t>(limit)) {
    throw JinjaError("lists and dicts nest deeper than " + std::to_string(limit));
  }
}

Value Value::list(List items) {
  Value v(Kind::kList);
  v.account_container(items.capacity() * sizeof(Value), items.data(), items.size(), sizeof(Value));
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v(Kind::kTuple);
  v.account_container(items.capacity() * sizeof(Value), items.data(), items.size(), sizeof(Value));
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

// A dict's (or namespace's) depth is its values' (keys are hashable scalars in practice; a list
// key nests too); whether it reaches a namespace counts keys and values.
Value Value::keyed(Kind kind, Dict d) {
  Value v(kind);
  for (const auto& [key, value] : d.items) v.holds_namespace_ = v.holds_namespace_ || key.reaches_namespace();
  v.account_container(d.items.capacity() * sizeof(d.items[0]), d.items.empty() ? nullptr : &d.items[0].second,
                      d.items.size(), sizeof(d.items[0]));
  v.dict_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::dict(Dict d) { return keyed(Kind::kDict, std::move(d)); }

Value Value::ns(Dict d) { return keyed(Kind::kNamespace, std::move(d)); }

Value Value::callable(std::string name, NativeFunction fn, const Value* captured) {
  Value v(Kind::kCallable);
  v.holds_namespace_ = captured != nullptr && captured->reaches_namespace();
  v.str_ = std::move(name);
  v.fn_ = std::make_shared<NativeFunction>(std::move(fn));
  return v;
}

Value Value::call(CallArgs& args) const { return (*fn_)(args); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return int_ != 0;
    case Kind::kFloat: return float_ != 0.0;
    case Kind::kString: return !str_.empty();
    case Kind::kList:
    case Kind::kTuple: return !list_->empty();
    case Kind::kDict: return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string format_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // e.g. "-1.2345e+17", shortest round-trip digits
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (size_t i = 0; i < e_pos; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  } else if (exponent < 0) {
    out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else {
    size_t int_len = static_cast<size_t>(exponent) + 1;
    if (digits.size() <= int_len) {
      out += digits + std::string(int_len - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_len) + "." + digits.substr(int_len);
    }
  }
  return out;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::repr() const {
  if (kind_ == Kind::kString) return repr_string(str_);
  if (kind_ == Kind::kUndefined) return "Undefined";
  return to_str();
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return int_ ? "True" : "False";
    case Kind::kInt: return std::to_string(int_);
    case Kind::kFloat: return format_float(float_);
    case Kind::kString: return str_;
    case Kind::kList:
    case Kind::kTuple: {
      // A list may hold the same list twice: printing visits every path, so each element is a
      // step and the text is checked against the memory budget as it grows.
      std::string out = kind_ == Kind::kList ? "[" : "(";
      for (size_t i = 0; i < list_->size(); ++i) {
        budget_step();
        if (i) out += ", ";
        std::string item = (*list_)[i].repr();
        budget_charge(item.size());  // every level copies its items' text: charged as it is
        out += item;
      }
      if (kind_ == Kind::kTuple && list_->size() == 1) out += ",";
      out += kind_ == Kind::kList ? "]" : ")";
      return out;
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        budget_step();
        if (!first) out += ", ";
        first = false;
        std::string item = k.repr() + ": " + v.repr();
        budget_charge(item.size());
        out += item;
      }
      out += kind_ == Kind::kNamespace ? "}>" : "}";
      return out;
    }
    case Kind::kCallable: return "<function " + str_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() == other.as_float();
    return int_ == other.int_;
  }
  if (is_sequence() && other.is_sequence()) {
    if (kind_ != other.kind_ || list_->size() != other.list_->size()) return false;
    for (size_t i = 0; i < list_->size(); ++i) {
      budget_step();
      if (!(*list_)[i].equals((*other.list_)[i])) return false;
    }
    return true;
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return str_ == other.str_;
    case Kind::kDict: {
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [k, v] : dict_->items) {
        budget_step(static_cast<int64_t>(other.dict_->items.size()));
        const Value* o = other.dict_->find(k);
        if (!o || !v.equals(*o)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return dict_ == other.dict_;
    case Kind::kCallable: return fn_ == other.fn_;
    default: return false;
  }
}

int compare_values(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order equals code point order.
    int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_sequence() && b.is_sequence() && a.kind() == b.kind()) {
    const List& x = a.items();
    const List& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      budget_step();
      if (!x[i].equals(y[i])) return compare_values(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw JinjaError("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {

template <typename J>
Value from_json_impl(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.template get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value(j.template get<double>());
    case nlohmann::json::value_t::string: return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_impl(e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value(it.key()), from_json_impl(it.value()));
      return Value::dict(std::move(d));
    }
    default: return Value::none();
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  // An escape is at most 6 bytes per input byte ("\u001f"; ensure_ascii: 12 per 4-byte code
  // point); the bound is checked against the render's memory before the text is built.
  size_t bound = s.size() + 2;
  if (ensure_ascii) {
    bound = 6 * s.size() + 2;
  } else {
    for (unsigned char c : s) bound += c < 0x20 ? 5 : 0;
  }
  budget_check(out.size() + bound);
  out += '"';
  std::vector<uint32_t> cps = ensure_ascii ? utf8_decode(s) : std::vector<uint32_t>{};
  auto put = [&](uint32_t c) {
    switch (c) {
      case '"': out += "\\\""; return;
      case '\\': out += "\\\\"; return;
      case '\n': out += "\\n"; return;
      case '\r': out += "\\r"; return;
      case '\t': out += "\\t"; return;
      case '\b': out += "\\b"; return;
      case '\f': out += "\\f"; return;
      default: break;
    }
    char buf[16];
    if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
      if (c >= 0x10000) {
        uint32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      }
      out += buf;
    } else if (ensure_ascii) {
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(c);
    }
  };
  if (ensure_ascii) {
    for (uint32_t c : cps) put(c);
  } else {
    for (unsigned char c : s) {
      if (c < 0x80) put(c); else out += static_cast<char>(c);
    }
  }
  out += '"';
}

void json_dump(std::string& out, const Value& v, const JsonOptions& o, int depth) {
  const std::string& item_sep = o.item_separator;
  const std::string& key_sep = o.key_separator;
  // Containers may be shared (a list holding one list twice): every element visited is a step,
  // and the text is checked against the memory budget before each indent and after each item.
  auto newline = [&](int d) {
    if (o.indent >= 0) {
      budget_check(out.size() + 1 + static_cast<size_t>(o.indent) * static_cast<size_t>(d));
      out += '\n';
      out.append(static_cast<size_t>(o.indent * d), ' ');
    }
  };
  switch (v.kind()) {
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.as_int()); return;
    case Kind::kFloat: {
      double f = v.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += format_float(f);
      return;
    }
    case Kind::kString: json_string(out, v.as_string(), o.ensure_ascii); return;
    case Kind::kList:
    case Kind::kTuple: {
      const List& items = v.items();
      if (items.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        budget_step();
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(out, items[i], o, depth + 1);
        budget_check(out.size());
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::kDict: {
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.entries().items) entries.push_back(&e);
      if (entries.empty()) { out += "{}"; return; }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return compare_values(a->first, b->first) < 0; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        budget_step();
        budget_check(out.size());
        if (i) out += item_sep;
        newline(depth + 1);
        const Value& k = entries[i]->first;
        if (k.is_string()) {
          json_string(out, k.as_string(), o.ensure_ascii);
        } else if (k.is_bool()) {
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else if (k.is_none()) {
          out += "\"null\"";
        } else if (k.is_number()) {
          out += "\"" + k.to_str() + "\"";
        } else {
          throw JinjaError("keys must be str, int, float, bool or None, not " + k.type_name());
        }
        out += key_sep;
        json_dump(out, entries[i]->second, o, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    default:
      throw JinjaError("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

size_t held_bytes(const Value& v) {
  size_t n = sizeof(Value) + (v.is_string() ? v.as_string().size() : 0);
  if (v.is_sequence()) {
    for (const Value& x : v.items()) n += held_bytes(x);
  } else if (v.is_dict() || v.is_namespace()) {
    for (const auto& [k, x] : v.entries().items) n += held_bytes(k) + held_bytes(x);
  }
  return n;
}

Value from_json(const nlohmann::ordered_json& j) { return from_json_impl(j); }
Value from_json(const nlohmann::json& j) { return from_json_impl(j); }

std::string to_json(const Value& v, const JsonOptions& options) {
  JsonOptions o = options;
  if (o.item_separator.empty()) o.item_separator = o.indent >= 0 ? "," : ", ";
  if (o.key_separator.empty()) o.key_separator = ": ";
  std::string out;
  json_dump(out, v, o, 0);
  return out;
}

std::vector<uint32_t> utf8_decode(const std::string& s) {
  budget_charge(s.size() * sizeof(uint32_t));  // 4 bytes per byte: worth charging for a large string
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
    if (i + static_cast<size_t>(len) > s.size()) len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += static_cast<size_t>(len);
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end && i < cps.size(); ++i) utf8_append(out, cps[i]);
  return out;
}

}  // namespace origami::jinja
