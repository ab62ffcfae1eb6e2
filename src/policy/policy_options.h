#pragma once
// Policy options as users give them (`--kv-policy-opt window=16`, JSON "kv_policy_options"):
// string key/value pairs, checked against each policy's declared options so that a typo or a
// bad value is an error that names the policy, the option and what it accepts.
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace origami {

using PolicyOptionMap = std::map<std::string, std::string>;

enum class OptionKind { kInt, kFloat, kBool, kEnum };

// One option a policy declares: its name, default (as text), documentation and accepted values.
struct PolicyOptionSpec {
  std::string name;
  OptionKind kind = OptionKind::kInt;
  std::string default_value;
  std::string help;
  double min = 0;  // kInt / kFloat: inclusive bounds
  double max = 0;
  std::vector<std::string> choices;  // kEnum

  // "int in [1, 1024]", "0|1", "none|flash|lightning", ...
  std::string accepted() const;
};

// Resolved option values of one policy: every declared option present, each value valid.
class PolicyOptions {
 public:
  // Checks `given` against `specs` (unknown keys and bad values are errors naming `policy`) and
  // fills in defaults for the rest.
  static Expected<PolicyOptions> resolve(const std::string& policy, const std::vector<PolicyOptionSpec>& specs,
                                         const PolicyOptionMap& given);

  int get_int(const std::string& name) const;
  float get_float(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  const std::string& get(const std::string& name) const;  // kEnum (or any option as text)
  const PolicyOptionMap& values() const { return values_; }

 private:
  PolicyOptionMap values_;
};

// Parses "key=value" (the CLI's --kv-policy-opt) into `out`; the error names the text.
Status parse_policy_option(const std::string& text, PolicyOptionMap* out);

}  // namespace origami
