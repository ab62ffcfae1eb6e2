#include "policy/policy_options.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/check.h"

namespace origami {
namespace {

std::string format_number(double v) {
  std::ostringstream s;
  s.precision(10);  // integer bounds such as 1048576 print whole
  s << v;
  return s.str();
}

bool parse_int(const std::string& text, long long* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Bools accept the spellings people type on a command line; stored canonically as "0"/"1".
bool parse_bool(const std::string& text, bool* out) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (t == "1" || t == "true" || t == "on" || t == "yes") {
    *out = true;
    return true;
  }
  if (t == "0" || t == "false" || t == "off" || t == "no") {
    *out = false;
    return true;
  }
  return false;
}

// Checks one value and returns it in canonical form, or the error.
Expected<std::string> check_value(const std::string& policy, const PolicyOptionSpec& spec, const std::string& value) {
  const std::string where = "policy " + policy + ": option " + spec.name + "=" + value;
  switch (spec.kind) {
    case OptionKind::kInt: {
      long long v = 0;
      if (!parse_int(value, &v)) return invalid_argument(where + " is not an integer (" + spec.accepted() + ")");
      if (v < spec.min || v > spec.max) return invalid_argument(where + " is out of range (" + spec.accepted() + ")");
      return std::to_string(v);
    }
    case OptionKind::kFloat: {
      double v = 0;
      if (!parse_float(value, &v)) return invalid_argument(where + " is not a number (" + spec.accepted() + ")");
      if (v < spec.min || v > spec.max) return invalid_argument(where + " is out of range (" + spec.accepted() + ")");
      return value;
    }
    case OptionKind::kBool: {
      bool v = false;
      if (!parse_bool(value, &v)) return invalid_argument(where + " is not a boolean (" + spec.accepted() + ")");
      return std::string(v ? "1" : "0");
    }
    case OptionKind::kEnum: {
      if (std::find(spec.choices.begin(), spec.choices.end(), value) == spec.choices.end())
        return invalid_argument(where + " is not one of " + spec.accepted());
      return value;
    }
  }
  return internal_error("unknown option kind");
}

}  // namespace

std::string PolicyOptionSpec::accepted() const {
  switch (kind) {
    case OptionKind::kInt: return "an integer in [" + format_number(min) + ", " + format_number(max) + "]";
    case OptionKind::kFloat: return "a number in [" + format_number(min) + ", " + format_number(max) + "]";
    case OptionKind::kBool: return "0|1";
    case OptionKind::kEnum: {
      std::string s;
      for (const std::string& c : choices) s += (s.empty() ? "" : "|") + c;
      return s;
    }
  }
  return "";
}

Expected<PolicyOptions> PolicyOptions::resolve(const std::string& policy, const std::vector<PolicyOptionSpec>& specs,
                                               const PolicyOptionMap& given) {
  PolicyOptions out;
  for (const auto& entry : given) {
    const std::string& key = entry.first;  // a plain reference: clang < 16 cannot capture a structured binding
    auto it = std::find_if(specs.begin(), specs.end(), [&](const PolicyOptionSpec& s) { return s.name == key; });
    if (it == specs.end()) {
      std::string known;
      for (const PolicyOptionSpec& s : specs) known += (known.empty() ? "" : ", ") + s.name;
      return invalid_argument("policy " + policy + ": unknown option '" + key + "' (" +
                              (known.empty() ? std::string("it takes no options") : "its options: " + known) + ")");
    }
  }
  for (const PolicyOptionSpec& spec : specs) {
    auto it = given.find(spec.name);
    const std::string& text = it != given.end() ? it->second : spec.default_value;
    Expected<std::string> value = check_value(policy, spec, text);
    if (!value) return value.status();
    out.values_[spec.name] = std::move(*value);
  }
  return out;
}

const std::string& PolicyOptions::get(const std::string& name) const {
  auto it = values_.find(name);
  ORIGAMI_CHECK_MSG(it != values_.end(), "policy option not declared");
  return it->second;
}

int PolicyOptions::get_int(const std::string& name) const { return std::atoi(get(name).c_str()); }
float PolicyOptions::get_float(const std::string& name) const { return std::strtof(get(name).c_str(), nullptr); }
bool PolicyOptions::get_bool(const std::string& name) const { return get(name) == "1"; }

Status parse_policy_option(const std::string& text, PolicyOptionMap* out) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    return invalid_argument("policy option '" + text + "' is not of the form key=value");
  (*out)[text.substr(0, eq)] = text.substr(eq + 1);
  return Status::ok();
}

}  // namespace origami
