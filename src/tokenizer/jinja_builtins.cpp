#include <locale.h>
#include <wctype.h>

#include <cctype>
#include <cmath>
#include <ctime>
#include <unordered_set>

#include "tokenizer/jinja_builtins.h"

namespace origami::jinja {

void throw_undefined(const Value& undefined) {
  const std::string& msg = undefined.undefined_name();
  throw JinjaError(msg.empty() ? "value is undefined" : msg);
}

int64_t int_arg(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  throw JinjaError(std::string(what) + " must be an integer, not " + v.type_name());
}

bool is_py_space(uint32_t cp) {
  return cp == ' ' || (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 || cp == 0xa0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
         cp == 0x205f || cp == 0x3000;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<uint32_t> set;
  bool use_set = !chars.is_undefined() && !chars.is_none();
  if (use_set) {
    if (!chars.is_string()) throw JinjaError("strip arg must be None or str");
    set = utf8_decode(chars.as_string());
  }
  auto strip_it = [&](uint32_t c) {
    if (!use_set) return is_py_space(c);
    for (uint32_t x : set) if (x == c) return true;
    return false;
  };
  size_t b = 0, e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return utf8_encode(cps, b, e);
}

namespace {

// Unicode simple case mapping from the C library's C.UTF-8 locale (ASCII only if it is missing).
locale_t utf8_locale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return loc;
}

}  // namespace

uint32_t cp_upper(uint32_t c) {
  if (c < 0x80 || !utf8_locale()) return c < 0x80 ? static_cast<uint32_t>(std::toupper(static_cast<int>(c))) : c;
  return static_cast<uint32_t>(towupper_l(static_cast<wint_t>(c), utf8_locale()));
}

uint32_t cp_lower(uint32_t c) {
  if (c < 0x80 || !utf8_locale()) return c < 0x80 ? static_cast<uint32_t>(std::tolower(static_cast<int>(c))) : c;
  return static_cast<uint32_t>(towlower_l(static_cast<wint_t>(c), utf8_locale()));
}

bool cp_is_alpha(uint32_t c) {
  if (c < 0x80 || !utf8_locale()) return c < 0x80 && std::isalpha(static_cast<int>(c));
  return iswalpha_l(static_cast<wint_t>(c), utf8_locale()) != 0;
}

std::string py_lower(const std::string& s) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) utf8_append(out, cp_lower(c));
  return out;
}

std::string py_upper(const std::string& s) {
  std::string out;
  for (uint32_t c : utf8_decode(s)) utf8_append(out, cp_upper(c));
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out;
  bool first = true;
  for (uint32_t c : utf8_decode(s)) {
    utf8_append(out, first ? cp_upper(c) : cp_lower(c));
    first = false;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` around every character
    std::vector<uint32_t> cps = utf8_decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        budget_check(out.size() + repl.size());
        out += repl;
        ++done;
      }
      if (i < cps.size()) utf8_append(out, cps[i]);
    }
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    budget_check(out.size() + (hit - pos) + repl.size());
    out.append(s, pos, hit - pos);
    out += repl;
    pos = hit + old.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

namespace {

const Value& arg_at(CallArgs& args, size_t index, const char* name) {
  static const Value kUndefined;
  const Value* v = args.get(index, name);
  return v ? *v : kUndefined;
}

bool given(const Value& v) { return !v.is_undefined() && !v.is_none(); }

// Code-point index of a byte offset within s.
int64_t cp_index(const std::string& s, size_t byte_offset) {
  int64_t n = 0;
  for (size_t i = 0; i < byte_offset && i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) ++n;
  }
  return n;
}

List py_split(const std::string& s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (!given(sep)) {
    std::vector<uint32_t> cps = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      size_t b = i;
      while (i < cps.size() && !is_py_space(cps[i])) ++i;
      words.emplace_back(b, i);
      if ((words.size() & 0xFFF) == 0) budget_charge(0x1000 * sizeof(words[0]));
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        // Remainder keeps its internal whitespace but loses leading whitespace.
        size_t rest_begin = words[static_cast<size_t>(maxsplit)].first;
        size_t e = cps.size();
        while (e > rest_begin && is_py_space(cps[e - 1])) --e;
        for (int64_t k = 0; k < maxsplit; ++k) parts.emplace_back(utf8_encode(cps, words[k].first, words[k].second));
        parts.emplace_back(utf8_encode(cps, rest_begin, e));
      } else {
        size_t first_kept = words.size() - static_cast<size_t>(maxsplit);
        size_t rest_end = words[first_kept - 1].second;
        size_t b = 0;
        while (b < rest_end && is_py_space(cps[b])) ++b;
        parts.emplace_back(utf8_encode(cps, b, rest_end));
        for (size_t k = first_kept; k < words.size(); ++k) parts.emplace_back(utf8_encode(cps, words[k].first, words[k].second));
      }
      return parts;
    }
    budget_check(words.size() * sizeof(Value));
    for (auto& [b, e] : words) parts.emplace_back(utf8_encode(cps, b, e));
    return parts;
  }
  if (!sep.is_string()) throw JinjaError("must be str or None, not " + sep.type_name());
  const std::string& d = sep.as_string();
  if (d.empty()) throw JinjaError("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t pos = 0;
    int64_t n = 0;
    while (maxsplit < 0 || n < maxsplit) {
      size_t hit = s.find(d, pos);
      if (hit == std::string::npos) break;
      pieces.push_back(s.substr(pos, hit - pos));
      budget_charge(sizeof(std::string) + pieces.back().size());
      pos = hit + d.size();
      ++n;
    }
    pieces.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    int64_t n = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || n < maxsplit) {
      if (end < d.size()) break;
      size_t hit = s.rfind(d, end - d.size());
      if (hit == std::string::npos) break;
      rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
      budget_charge(sizeof(std::string) + rev.back().size());
      end = hit;
      ++n;
    }
    rev.push_back(s.substr(0, end));
    pieces.assign(rev.rbegin(), rev.rend());
  }
  budget_check(pieces.size() * sizeof(Value));
  for (auto& p : pieces) parts.emplace_back(std::move(p));
  return parts;
}

bool matches_affix(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) throw JinjaError(std::string(prefix ? "startswith" : "endswith") + " first arg must be str or a tuple of str, not " + a.type_name());
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_sequence()) {
    for (const Value& a : affix.items()) if (one(a)) return true;
    return false;
  }
  return one(affix);
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (uint32_t c : utf8_decode(s)) {
    if (cp_is_alpha(c)) {
      utf8_append(out, prev_cased ? cp_lower(c) : cp_upper(c));
      prev_cased = true;
    } else {
      utf8_append(out, c);
      prev_cased = false;
    }
  }
  return out;
}

std::string py_format(const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') { out += '{'; ++i; continue; }
    if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') { out += '}'; ++i; continue; }
    if (c != '{') { out += c; continue; }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw JinjaError("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!") != std::string::npos) throw JinjaError("format specifications are not supported: {" + field + "}");
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < args.positional.size() ? &args.positional[auto_index] : nullptr;
      ++auto_index;
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t k = std::stoul(field);
      v = k < args.positional.size() ? &args.positional[k] : nullptr;
    } else {
      for (auto& [name, val] : args.keyword) if (name == field) v = &val;
    }
    if (!v) throw JinjaError("format: missing argument for {" + field + "}");
    out += v->to_str();
    budget_check(out.size());
    i = close;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name) {
  auto method = [&](NativeFunction fn) { return Value::callable("str." + name, std::move(fn)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return method([s, l, r](CallArgs& a) { return Value(py_strip(s, arg_at(a, 0, "chars"), l, r)); });
  }
  if (name == "upper") return method([s](CallArgs&) { return Value(py_upper(s)); });
  if (name == "lower") return method([s](CallArgs&) { return Value(py_lower(s)); });
  if (name == "title") return method([s](CallArgs&) { return Value(py_title(s)); });
  if (name == "capitalize") {
    return method([s](CallArgs&) { return Value(py_capitalize(s)); });
  }
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return method([s, prefix](CallArgs& a) { return Value(matches_affix(s, arg_at(a, 0, "prefix"), prefix)); });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return method([s, right](CallArgs& a) {
      const Value& m = arg_at(a, 1, "maxsplit");
      return Value::list(py_split(s, arg_at(a, 0, "sep"), given(m) ? int_arg(m, "maxsplit") : -1, right));
    });
  }
  if (name == "replace") {
    return method([s](CallArgs& a) {
      const Value& o = arg_at(a, 0, "old");
      const Value& n = arg_at(a, 1, "new");
      if (!o.is_string() || !n.is_string()) throw JinjaError("replace() arguments must be str");
      const Value& c = arg_at(a, 2, "count");
      return Value(py_replace(s, o.as_string(), n.as_string(), given(c) ? int_arg(c, "count") : -1));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method([s, name](CallArgs& a) {
      const Value& sub = arg_at(a, 0, "sub");
      if (!sub.is_string()) throw JinjaError("must be str, not " + sub.type_name());
      const std::string& x = sub.as_string();
      if (name == "count") {
        if (x.empty()) return Value(cp_index(s, s.size()) + 1);
        int64_t n = 0;
        for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++n;
        return Value(n);
      }
      size_t hit = (name == "find" || name == "index") ? s.find(x) : s.rfind(x);
      if (hit == std::string::npos) {
        if (name == "index" || name == "rindex") throw JinjaError("substring not found");
        return Value(static_cast<int64_t>(-1));
      }
      return Value(cp_index(s, hit));
    });
  }
  if (name == "join") {
    return method([s](CallArgs& a) {
      std::string out;
      bool first = true;
      for (const Value& v : iterate(arg_at(a, 0, "iterable"))) {
        if (!v.is_string()) throw JinjaError("sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += v.as_string();
        budget_check(out.size() + s.size());
      }
      return Value(out);
    });
  }
  if (name == "format") return method([s](CallArgs& a) { return Value(py_format(s, a)); });
  if (name == "splitlines") {
    return method([s](CallArgs&) {
      List out;
      size_t b = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          budget_check((out.size() + 1) * sizeof(Value));
          out.emplace_back(s.substr(b, i - b));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          b = i + 1;
        }
      }
      if (b < s.size()) out.emplace_back(s.substr(b));
      return Value::list(std::move(out));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" || name == "isupper") {
    return method([s, name](CallArgs&) {
      if (s.empty()) return Value(false);
      bool any_cased = false;
      for (unsigned char c : s) {
        if (name == "isdigit" && !std::isdigit(c)) return Value(false);
        if (name == "isalpha" && !std::isalpha(c)) return Value(false);
        if (name == "isalnum" && !std::isalnum(c)) return Value(false);
        if (name == "isspace" && !std::isspace(c)) return Value(false);
        if (name == "islower" && std::isupper(c)) return Value(false);
        if (name == "isupper" && std::islower(c)) return Value(false);
        if (std::isalpha(c)) any_cased = true;
      }
      return Value((name == "islower" || name == "isupper") ? any_cased : true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& d, const std::string& name) {
  if (name == "items") {
    return Value::callable("dict.items", [d](CallArgs&) {
      List out;
      for (const auto& [k, v] : d.entries().items) out.push_back(Value::tuple({k, v}));
      return Value::list(std::move(out));
    }, &d);
  }
  if (name == "keys" || name == "values") {
    bool keys = name == "keys";
    return Value::callable("dict." + name, [d, keys](CallArgs&) {
      List out;
      for (const auto& [k, v] : d.entries().items) out.push_back(keys ? k : v);
      return Value::list(std::move(out));
    }, &d);
  }
  if (name == "get") {
    return Value::callable("dict.get", [d](CallArgs& a) {
      const Value* v = d.entries().find(arg_at(a, 0, "key"));
      if (v) return *v;
      const Value& dflt = arg_at(a, 1, "default");
      return dflt.is_undefined() ? Value::none() : dflt;
    }, &d);
  }
  return Value();
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Kind::kUndefined: throw_undefined(obj);
    case Kind::kDict: {
      Value m = dict_method(obj, name);
      if (m.is_callable()) return m;
      if (const Value* v = obj.entries().find(Value(name))) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Kind::kNamespace: {
      if (const Value* v = obj.entries().find(Value(name))) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Kind::kString: return string_method(obj.as_string(), name);
    default: return Value::undefined("'" + obj.type_name() + " object' has no attribute '" + name + "'");
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::kUndefined: throw_undefined(obj);
    case Kind::kDict: {
      if (const Value* v = obj.entries().find(key)) return *v;
      if (key.is_string()) {
        Value m = dict_method(obj, key.as_string());
        if (m.is_callable()) return m;
      }
      return Value::undefined("'dict object' has no attribute " + key.repr());
    }
    case Kind::kNamespace: return key.is_string() ? get_attr(obj, key.as_string()) : Value::undefined("no item " + key.repr());
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kString: {
      if (key.is_string()) return get_attr(obj, key.as_string());
      if (!key.is_int() && !key.is_bool()) return Value::undefined(obj.type_name() + " indices must be integers, not " + key.type_name());
      int64_t i = key.as_int();
      if (obj.is_string()) {
        std::vector<uint32_t> cps = utf8_decode(obj.as_string());
        int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("string index out of range");
        return Value(utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
      }
      const List& items = obj.items();
      int64_t n = static_cast<int64_t>(items.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(obj.type_name() + " object has no element " + key.to_str());
      return items[static_cast<size_t>(i)];
    }
    default:
      return key.is_string() ? get_attr(obj, key.as_string()) : Value::undefined("'" + obj.type_name() + " object' has no attribute " + key.repr());
  }
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) throw_undefined(obj);
  int64_t st = given(step) ? int_arg(step, "slice step") : 1;
  if (st == 0) throw JinjaError("slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t n;
  if (obj.is_string()) {
    cps = utf8_decode(obj.as_string());
    n = static_cast<int64_t>(cps.size());
  } else if (obj.is_sequence()) {
    n = static_cast<int64_t>(obj.items().size());
  } else {
    throw JinjaError("'" + obj.type_name() + "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t dflt, bool is_start) {
    if (!given(v)) return dflt;
    int64_t i = int_arg(v, "slice index");
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    (void)is_start;
    return i;
  };
  int64_t b = adjust(start, st < 0 ? n - 1 : 0, true);
  int64_t e = adjust(stop, st < 0 ? -1 : n, false);
  std::vector<int64_t> idx;
  if (st > 0) for (int64_t i = b; i < e; i += st) idx.push_back(i);
  else for (int64_t i = b; i > e; i += st) idx.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : idx) utf8_append(out, cps[static_cast<size_t>(i)]);
    return Value(out);
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return obj.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

List iterate(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return {};
    // The copy is charged (a loop over a big list, repeated, is work proportional to its size).
    case Kind::kList:
    case Kind::kTuple: budget_charge(value.items().size() * sizeof(Value)); return value.items();
    case Kind::kDict: {
      budget_charge(value.entries().items.size() * sizeof(Value));
      List keys;
      for (const auto& [k, v] : value.entries().items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List out;
      std::vector<uint32_t> cps = utf8_decode(value.as_string());
      budget_charge(cps.size() * sizeof(Value));
      for (size_t i = 0; i < cps.size(); ++i) out.emplace_back(utf8_encode(cps, i, i + 1));
      return out;
    }
    default: throw JinjaError("'" + value.type_name() + "' object is not iterable");
  }
}

int64_t length_of(const Value& value) {
  switch (value.kind()) {
    case Kind::kUndefined: return 0;
    case Kind::kString: {
      int64_t n = 0;  // code points: the bytes that do not continue a UTF-8 sequence
      for (unsigned char c : value.as_string()) n += (c & 0xC0) != 0x80;
      budget_step(static_cast<int64_t>(value.as_string().size() / 64));
      return n;
    }
    case Kind::kList:
    case Kind::kTuple: return static_cast<int64_t>(value.items().size());
    case Kind::kDict: return static_cast<int64_t>(value.entries().items.size());
    default: throw JinjaError("object of type '" + value.type_name() + "' has no len()");
  }
}

bool has_test(const std::string& name) {
  static const std::unordered_set<std::string> kTests = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string",
      "mapping", "iterable", "sequence", "callable", "sameas", "escaped", "even", "odd", "divisibleby",
      "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan", ">",
      "ge", ">=", "in", "lower", "upper", "filter", "test"};
  return kTests.count(name) > 0;
}

bool apply_test(const std::string& name, const Value& v, CallArgs& args) {
  const Value& other = arg_at(args, 0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "sameas") {
    if (v.kind() != other.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool() || v.is_int()) return v.as_int() == other.as_int();
    return v.is_string() ? v.as_string() == other.as_string() : false;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (v.is_undefined()) throw_undefined(v);
    if (!v.is_number()) throw JinjaError("unsupported operand type(s) for %: '" + v.type_name() + "' and 'int'");
    double d = name == "divisibleby" ? other.as_float() : 2.0;
    if (name == "divisibleby" && !other.is_number()) throw JinjaError("divisibleby needs a number");
    if (d == 0) throw JinjaError("integer division or modulo by zero");
    double r = std::fmod(v.as_float(), d);
    if (name == "odd") return r != 0;
    return r == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return v.equals(other);
  if (name == "ne" || name == "!=") return !v.equals(other);
  if (name == "lt" || name == "lessthan" || name == "<") return compare_values(v, other) < 0;
  if (name == "le" || name == "<=") return compare_values(v, other) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare_values(v, other) > 0;
  if (name == "ge" || name == ">=") return compare_values(v, other) >= 0;
  if (name == "in") {
    if (other.is_string()) {
      if (!v.is_string()) throw JinjaError("'in <string>' requires string as left operand, not " + v.type_name());
      return other.as_string().find(v.as_string()) != std::string::npos;
    }
    if (other.is_dict()) {
      budget_step(static_cast<int64_t>(other.entries().items.size()));
      return other.entries().find(v) != nullptr;
    }
    if (other.is_sequence()) {
      for (const Value& x : other.items()) {
        budget_step();
        if (x.equals(v)) return true;
      }
      return false;
    }
    for (const Value& x : iterate(other)) if (x.equals(v)) return true;
    return false;
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    std::string s = v.as_string();
    return name == "lower" ? py_lower(s) == s && py_upper(s) != s : py_upper(s) == s && py_lower(s) != s;
  }
  if (name == "filter") return other.is_string() && has_filter(other.as_string());
  if (name == "test") return other.is_string() && has_test(other.as_string());
  throw JinjaError("no test named '" + name + "'");
}

Dict builtin_globals() {
  Dict g;
  g.set(Value("range"), Value::callable("range", [](CallArgs& a) {
    if (!a.keyword.empty()) throw JinjaError("range() takes no keyword arguments");
    if (a.positional.empty() || a.positional.size() > 3) throw JinjaError("range expected 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = int_arg(a.positional[0], "range() argument");
    } else {
      start = int_arg(a.positional[0], "range() argument");
      stop = int_arg(a.positional[1], "range() argument");
      if (a.positional.size() == 3) step = int_arg(a.positional[2], "range() argument");
    }
    if (step == 0) throw JinjaError("range() arg 3 must not be zero");
    // Same cap as the sandbox Jinja environment uses.
    __int128 lo = start, hi = stop, st = step;
    __int128 count = st > 0 ? (hi > lo ? (hi - lo + st - 1) / st : 0) : (lo > hi ? (lo - hi - st - 1) / -st : 0);
    if (count > 100000) throw JinjaError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    budget_check(static_cast<size_t>(count) * sizeof(Value));
    List out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out.emplace_back(start + i * step);
    return Value::list(std::move(out));
  }));
  g.set(Value("namespace"), Value::callable("namespace", [](CallArgs& a) {
    Dict d;
    for (const Value& p : a.positional) {
      if (!p.is_dict()) throw JinjaError("namespace() positional argument must be a dict");
      for (const auto& [k, v] : p.entries().items) d.set(k, v);
    }
    for (auto& [k, v] : a.keyword) d.set(Value(k), v);
    return Value::ns(std::move(d));
  }));
  g.set(Value("dict"), Value::callable("dict", [](CallArgs& a) {
    Dict d;
    for (const Value& p : a.positional) {
      if (!p.is_dict()) throw JinjaError("dict() positional argument must be a dict");
      for (const auto& [k, v] : p.entries().items) d.set(k, v);
    }
    for (auto& [k, v] : a.keyword) d.set(Value(k), v);
    return Value::dict(std::move(d));
  }));
  g.set(Value("raise_exception"), Value::callable("raise_exception", [](CallArgs& a) -> Value {
    const Value& m = arg_at(a, 0, "message");
    throw JinjaError("raise_exception: " + m.to_str());
  }));
  g.set(Value("strftime_now"), Value::callable("strftime_now", [](CallArgs& a) {
    const Value& f = arg_at(a, 0, "format");
    if (!f.is_string()) throw JinjaError("strftime_now() needs a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof(buf), f.as_string().c_str(), &tm);
    return Value(std::string(buf, n));
  }));
  return g;
}

}  // namespace origami::jinja
