#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja_builtins.h"

namespace origami::jinja {
namespace {

using FilterFn = Value (*)(const Value& v, CallArgs& a);

const Value& arg(CallArgs& a, size_t index, const char* name) {
  static const Value kUndefined;
  const Value* v = a.get(index, name);
  return v ? *v : kUndefined;
}

bool flag(CallArgs& a, size_t index, const char* name) { return arg(a, index, name).truthy(); }

std::string str_of(const Value& v) { return v.to_str(); }

bool in_int_range(double f) { return std::isfinite(f) && f > -9.2e18 && f < 9.2e18; }

// Widths and counts that would build strings beyond any sane prompt are refused up front.
int64_t bounded(int64_t n, const char* what) {
  if (n > (int64_t{1} << 24)) throw JinjaError(std::string(what) + " is too large");
  return n;
}

// Jinja's make_attrgetter: "a.b.0" looks up each part, items first.
Value lookup_path(const Value& item, const Value& attribute) {
  if (attribute.is_int()) return get_item(item, attribute);
  std::string path = attribute.to_str();
  Value cur = item;
  size_t b = 0;
  while (true) {
    size_t dot = path.find('.', b);
    std::string part = path.substr(b, dot == std::string::npos ? std::string::npos : dot - b);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    b = dot + 1;
  }
}

// Sort/unique keys: strings lower-cased unless case-sensitive.
Value fold_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(py_lower(v.as_string())) : v;
}

Value f_abs(const Value& v, CallArgs&) {
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
  throw JinjaError("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_attr(const Value& v, CallArgs& a) { return get_attr(v, arg(a, 0, "name").to_str()); }

Value f_batch(const Value& v, CallArgs& a) {
  int64_t n = bounded(int_arg(arg(a, 0, "linecount"), "linecount"), "linecount");
  if (n <= 0) throw JinjaError("batch size must be positive");
  const Value& fill = arg(a, 1, "fill_with");
  budget_check(static_cast<size_t>(n) * sizeof(Value));  // one batch, padded
  List out, cur;
  for (const Value& x : iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (!fill.is_undefined() && !fill.is_none()) while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value f_capitalize(const Value& v, CallArgs&) { return Value(py_capitalize(str_of(v))); }

Value f_center(const Value& v, CallArgs& a) {
  const Value& w = arg(a, 0, "width");
  int64_t width = bounded(w.is_undefined() ? 80 : int_arg(w, "width"), "width");
  std::string s = str_of(v);
  int64_t len = length_of(Value(s));
  if (width <= len) return Value(s);
  budget_check(s.size() + static_cast<size_t>(width - len));
  int64_t pad = width - len;
  int64_t left = pad / 2 + (pad & width & 1);  // Python's str.center rounding
  return Value(std::string(static_cast<size_t>(left), ' ') + s + std::string(static_cast<size_t>(pad - left), ' '));
}

Value f_default(const Value& v, CallArgs& a) {
  const Value& d = arg(a, 0, "default_value");
  bool boolean = flag(a, 1, "boolean");
  if (v.is_undefined() || (boolean && !v.truthy())) return d.is_undefined() ? Value("") : d;
  return v;
}

Value f_dictsort(const Value& v, CallArgs& a) {
  if (!v.is_dict()) throw JinjaError("dictsort expects a dict, got " + v.type_name());
  bool cs = flag(a, 0, "case_sensitive");
  const Value& by = arg(a, 1, "by");
  bool by_value = by.is_string() && by.as_string() == "value";
  if (by.is_string() && !by_value && by.as_string() != "key") throw JinjaError("You can only sort by either \"key\" or \"value\"");
  bool rev = flag(a, 2, "reverse");
  std::vector<std::pair<Value, Value>> items = v.entries().items;
  std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
    const Value& kx = by_value ? x.second : x.first;
    const Value& ky = by_value ? y.second : y.first;
    int c = compare_values(fold_case(kx, cs), fold_case(ky, cs));
    return rev ? c > 0 : c < 0;
  });
  List out;
  for (auto& [k, val] : items) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_escape(const Value& v, CallArgs&) {
  std::string in = str_of(v), out;
  budget_check(in.size() * 5);  // "&amp;" is the longest escape: checked before building
  for (char c : in) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return Value(out);
}

Value f_first(const Value& v, CallArgs&) {
  List items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(const Value& v, CallArgs&) {
  List items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

bool parse_float(const std::string& s, double* out) {
  std::string t = py_strip(s, Value(), true, true);
  if (t.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size();
}

Value f_float(const Value& v, CallArgs& a) {
  const Value& d = arg(a, 0, "default");
  Value dflt = d.is_undefined() ? Value(0.0) : d;
  if (v.is_number()) return Value(v.as_float());
  double f;
  if (v.is_string() && parse_float(v.as_string(), &f)) return Value(f);
  return dflt;
}

Value f_int(const Value& v, CallArgs& a) {
  const Value& d = arg(a, 0, "default");
  Value dflt = d.is_undefined() ? Value(0) : d;
  const Value& b = arg(a, 1, "base");
  int base = b.is_undefined() ? 10 : static_cast<int>(int_arg(b, "base"));
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return in_int_range(v.as_float()) ? Value(static_cast<int64_t>(v.as_float())) : dflt;
  if (!v.is_string()) return dflt;
  std::string t = py_strip(v.as_string(), Value(), true, true);
  std::string digits;
  for (char c : t) if (c != '_') digits += c;
  char* end = nullptr;
  errno = 0;
  long long n = std::strtoll(digits.c_str(), &end, base);
  if (!digits.empty() && end == digits.c_str() + digits.size() && errno == 0) return Value(static_cast<int64_t>(n));
  double f;
  if (base == 10 && parse_float(t, &f) && in_int_range(f)) return Value(static_cast<int64_t>(f));
  return dflt;
}

Value f_format(const Value& v, CallArgs& a) {
  // printf-style "%s" formatting, as Python's str % args.
  std::string fmt = str_of(v), out;
  size_t next = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') { out += fmt[i]; continue; }
    if (i + 1 >= fmt.size()) throw JinjaError("incomplete format");
    char c = fmt[++i];
    if (c == '%') { out += '%'; continue; }
    if (next >= a.positional.size()) throw JinjaError("not enough arguments for format string");
    const Value& x = a.positional[next++];
    budget_check(out.size());
    if (c == 's') out += x.to_str();
    else if (c == 'r') out += x.repr();
    else if (c == 'd' || c == 'i') {
      if (!x.is_number()) throw JinjaError("%d format: a real number is required, not " + x.type_name());
      if (x.is_float() && !in_int_range(x.as_float())) throw JinjaError("%d format: number out of range");
      out += std::to_string(x.is_float() ? static_cast<int64_t>(x.as_float()) : x.as_int());
    } else {
      throw JinjaError(std::string("unsupported format character '") + c + "'");
    }
  }
  return Value(out);
}

Value f_indent(const Value& v, CallArgs& a) {
  const Value& w = arg(a, 0, "width");
  std::string ind = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, bounded(w.is_undefined() ? 4 : int_arg(w, "width"), "width"))), ' ');
  bool first = flag(a, 1, "first");
  bool blank = flag(a, 2, "blank");
  std::string s = str_of(v) + "\n";
  std::vector<std::string> lines;
  size_t b = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\n' || s[i] == '\r') {
      lines.push_back(s.substr(b, i - b));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      b = i + 1;
    }
  }
  if (b < s.size()) lines.push_back(s.substr(b));
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    budget_check(rv.size() + ind.size() + lines[i].size() + 1);
    if (i) rv += "\n";
    if (i > 0 && (blank || !lines[i].empty())) rv += ind;
    rv += lines[i];
  }
  if (first) rv = ind + rv;
  return Value(rv);
}

Value f_items(const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list();
  if (!v.is_dict()) throw JinjaError("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, val] : v.entries().items) out.push_back(Value::tuple({k, val}));
  return Value::list(std::move(out));
}

Value f_join(const Value& v, CallArgs& a) {
  const Value& d = arg(a, 0, "d");
  const Value& attribute = arg(a, 1, "attribute");
  std::string sep = d.is_undefined() ? "" : d.to_str(), out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    budget_check(out.size() + sep.size());
    if (!first) out += sep;
    first = false;
    out += (attribute.is_undefined() || attribute.is_none()) ? x.to_str() : lookup_path(x, attribute).to_str();
  }
  return Value(out);
}

Value f_length(const Value& v, CallArgs&) { return Value(length_of(v)); }
Value f_list(const Value& v, CallArgs&) { return Value::list(iterate(v)); }
Value f_lower(const Value& v, CallArgs&) { return Value(py_lower(str_of(v))); }
Value f_upper(const Value& v, CallArgs&) { return Value(py_upper(str_of(v))); }

Value f_map(const Value& v, CallArgs& a) {
  List out;
  const Value* attribute = nullptr;
  for (auto& [k, val] : a.keyword) if (k == "attribute") attribute = &val;
  if (attribute) {
    Value dflt;
    for (auto& [k, val] : a.keyword) if (k == "default") dflt = val;
    for (const Value& x : iterate(v)) {
      Value r = lookup_path(x, *attribute);
      out.push_back(r.is_undefined() && !dflt.is_undefined() ? dflt : r);
    }
    return Value::list(std::move(out));
  }
  if (a.positional.empty()) throw JinjaError("map requires a filter argument");
  std::string filter = a.positional[0].to_str();
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keyword = a.keyword;
  for (const Value& x : iterate(v)) {
    budget_step();
    CallArgs call = rest;
    out.push_back(apply_filter(filter, x, call));
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, CallArgs& a, bool want_max) {
  bool cs = flag(a, 0, "case_sensitive");
  const Value& attribute = arg(a, 1, "attribute");
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) { return fold_case(attribute.is_undefined() || attribute.is_none() ? x : lookup_path(x, attribute), cs); };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    int c = compare_values(key(items[i]), key(items[best]));
    if (want_max ? c > 0 : c < 0) best = i;
  }
  return items[best];
}

Value f_max(const Value& v, CallArgs& a) { return min_max(v, a, true); }
Value f_min(const Value& v, CallArgs& a) { return min_max(v, a, false); }

// select/reject(test, args...) and selectattr/rejectattr(attr, test, args...).
Value select_impl(const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.positional.empty()) throw JinjaError("selectattr/rejectattr need an attribute name");
    attribute = a.positional[next++];
  }
  std::string test;
  if (next < a.positional.size()) test = a.positional[next++].to_str();
  CallArgs test_args;
  test_args.positional.assign(a.positional.begin() + static_cast<long>(std::min(next, a.positional.size())), a.positional.end());
  test_args.keyword = a.keyword;
  if (!test.empty() && !has_test(test)) throw JinjaError("no test named '" + test + "'");
  List out;
  for (const Value& x : iterate(v)) {
    budget_step();
    Value subject = by_attr ? lookup_path(x, attribute) : x;
    CallArgs call = test_args;
    bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, call);
    if (ok == keep) out.push_back(x);
  }
  return Value::list(std::move(out));
}

Value f_select(const Value& v, CallArgs& a) { return select_impl(v, a, false, true); }
Value f_reject(const Value& v, CallArgs& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, CallArgs& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, CallArgs& a) { return select_impl(v, a, true, false); }

Value f_replace(const Value& v, CallArgs& a) {
  const Value& c = arg(a, 2, "count");
  return Value(py_replace(str_of(v), str_of(arg(a, 0, "old")), str_of(arg(a, 1, "new")),
                          (c.is_undefined() || c.is_none()) ? -1 : int_arg(c, "count")));
}

Value f_reverse(const Value& v, CallArgs&) {
  if (v.is_string()) {
    std::vector<uint32_t> cps = utf8_decode(v.as_string());
    std::reverse(cps.begin(), cps.end());
    return Value(utf8_encode(cps, 0, cps.size()));
  }
  List items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(const Value& v, CallArgs& a) {
  const Value& p = arg(a, 0, "precision");
  int64_t precision = p.is_undefined() ? 0 : int_arg(p, "precision");
  const Value& m = arg(a, 1, "method");
  std::string method = m.is_undefined() ? "common" : m.to_str();
  if (method != "common" && method != "ceil" && method != "floor") throw JinjaError("method must be 'common', 'ceil' or 'floor'");
  if (!v.is_number()) throw JinjaError("type " + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) return Value(v.as_int());  // round(int, n) stays an int for n >= 0
    // Correctly rounded decimal conversion, half-to-even on the exact binary value, as Python does.
    if (!std::isfinite(v.as_float())) return v;
    int digits = static_cast<int>(std::clamp<int64_t>(precision, 0, 340));
    int len = std::snprintf(nullptr, 0, "%.*f", digits, v.as_float());
    std::string buf(static_cast<size_t>(len) + 1, '\0');
    std::snprintf(buf.data(), buf.size(), "%.*f", digits, v.as_float());
    return Value(std::strtod(buf.c_str(), nullptr));
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(const Value& v, CallArgs&) { return Value(str_of(v)); }
Value f_string(const Value& v, CallArgs&) { return Value(str_of(v)); }

Value f_sort(const Value& v, CallArgs& a) {
  bool rev = flag(a, 0, "reverse");
  bool cs = flag(a, 1, "case_sensitive");
  const Value& attribute = arg(a, 2, "attribute");
  List items = iterate(v);
  auto key = [&](const Value& x) { return fold_case(attribute.is_undefined() || attribute.is_none() ? x : lookup_path(x, attribute), cs); };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    int c = compare_values(key(x), key(y));
    return rev ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_sum(const Value& v, CallArgs& a) {
  const Value& attribute = arg(a, 0, "attribute");
  const Value& start = arg(a, 1, "start");
  Value total = start.is_undefined() ? Value(0) : start;
  for (const Value& x : iterate(v)) {
    Value item = attribute.is_undefined() || attribute.is_none() ? x : lookup_path(x, attribute);
    if (!total.is_number() || !item.is_number()) throw JinjaError("unsupported operand type(s) for +: '" + total.type_name() + "' and '" + item.type_name() + "'");
    total = (total.is_float() || item.is_float()) ? Value(total.as_float() + item.as_float()) : Value(total.as_int() + item.as_int());
  }
  return total;
}

// Jinja's title filter: words start after runs of whitespace, '-', '(', '{', '[' or '<'.
Value f_title(const Value& v, CallArgs&) {
  std::string out;
  bool word_start = true;
  for (uint32_t c : utf8_decode(str_of(v))) {
    bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
    if (sep) {
      utf8_append(out, c);
      word_start = true;
    } else {
      utf8_append(out, word_start ? cp_upper(c) : cp_lower(c));
      word_start = false;
    }
  }
  return Value(out);
}

// HF's override: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(const Value& v, CallArgs& a) {
  JsonOptions o;
  const Value& ensure_ascii = arg(a, 0, "ensure_ascii");
  o.ensure_ascii = ensure_ascii.truthy();
  const Value& indent = arg(a, 1, "indent");
  if (indent.is_int()) o.indent = static_cast<int>(std::max<int64_t>(0, indent.as_int()));
  else if (!indent.is_undefined() && !indent.is_none()) throw JinjaError("tojson: indent must be an integer");
  const Value& seps = arg(a, 2, "separators");
  if (seps.is_sequence()) {
    if (seps.items().size() != 2) throw JinjaError("tojson: separators must be a pair");
    o.item_separator = seps.items()[0].to_str();
    o.key_separator = seps.items()[1].to_str();
  }
  o.sort_keys = flag(a, 3, "sort_keys");
  return Value(to_json(v, o));
}

Value f_trim(const Value& v, CallArgs& a) { return Value(py_strip(str_of(v), arg(a, 0, "chars"), true, true)); }

Value f_truncate(const Value& v, CallArgs& a) {
  std::string s = str_of(v);
  const Value& l = arg(a, 0, "length");
  int64_t length = l.is_undefined() ? 255 : int_arg(l, "length");
  bool killwords = flag(a, 1, "killwords");
  const Value& e = arg(a, 2, "end");
  std::string end = e.is_undefined() ? "..." : e.to_str();
  const Value& lw = arg(a, 3, "leeway");
  int64_t leeway = lw.is_undefined() || lw.is_none() ? 5 : int_arg(lw, "leeway");
  std::vector<uint32_t> cps = utf8_decode(s);
  int64_t n = static_cast<int64_t>(cps.size());
  int64_t end_len = length_of(Value(end));
  if (n <= length + leeway) return Value(s);
  size_t cut = static_cast<size_t>(std::max<int64_t>(0, length - end_len));
  std::string head = utf8_encode(cps, 0, cut);
  if (killwords) return Value(head + end);
  size_t space = head.rfind(' ');
  return Value((space == std::string::npos ? head : head.substr(0, space)) + end);
}

Value f_unique(const Value& v, CallArgs& a) {
  bool cs = flag(a, 0, "case_sensitive");
  const Value& attribute = arg(a, 1, "attribute");
  List out, seen;
  for (const Value& x : iterate(v)) {
    Value key = fold_case(attribute.is_undefined() || attribute.is_none() ? x : lookup_path(x, attribute), cs);
    bool dup = false;
    budget_step(static_cast<int64_t>(seen.size()));  // quadratic: every comparison is work
    for (const Value& s : seen) if (s.equals(key)) dup = true;
    if (!dup) {
      seen.push_back(key);
      out.push_back(x);
    }
  }
  return Value::list(std::move(out));
}

Value f_wordcount(const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : str_of(v)) {
    bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || (static_cast<unsigned char>(c) & 0x80);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
      {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
      {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_escape}, {"format", f_format},
      {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
      {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
      {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
      {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
      {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
      {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
  };
  return kFilters;
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& subject, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw JinjaError("no filter named '" + name + "'");
  return it->second(subject, args);
}

}  // namespace origami::jinja
