#pragma once
// Jinja's built-in filters, tests and global functions, and Python's attribute/item access on
// values (str, dict and list methods), as an HF chat-template environment provides them.
#include <optional>
#include <string>

#include "tokenizer/jinja_value.h"

namespace origami::jinja {

// obj.name: a method or attribute first, then a key (Jinja's getattr). Undefined when missing;
// throws when obj itself is undefined.
Value get_attr(const Value& obj, const std::string& name);
// obj[key]: a key or index first, then an attribute (Jinja's getitem).
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's slice rules, on str, list and tuple.
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The items that `for x in value` visits (dict keys, str characters); throws when not iterable.
List iterate(const Value& value);
// len(value); throws for values without a length.
int64_t length_of(const Value& value);

bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& subject, CallArgs& args);
bool apply_test(const std::string& name, const Value& subject, CallArgs& args);

// Functions every template sees: range, namespace, dict, raise_exception, strftime_now.
Dict builtin_globals();

// Message of the error an operation on an undefined value raises.
[[noreturn]] void throw_undefined(const Value& undefined);

// Python string helpers shared by methods and filters.
bool is_py_space(uint32_t cp);
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
uint32_t cp_upper(uint32_t c);
uint32_t cp_lower(uint32_t c);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
int64_t int_arg(const Value& v, const char* what);

}  // namespace origami::jinja
