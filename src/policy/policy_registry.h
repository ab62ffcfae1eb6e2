#pragma once
// Policies by name, so that the CLI, the server and the eval harness can list and build them.
// An alias is a registered name whose option defaults differ from its base policy's
// (`zipage-attn` = `zipage` with global=0, redundancy=none); users may still override them.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "policy/kv_policy.h"
#include "policy/policy_options.h"

namespace origami {

struct PolicyInfo {
  std::string name;
  std::string summary;  // one line for `origami policies`
  std::vector<PolicyOptionSpec> options;
  // Builds the policy from options already checked against `options` (every one present);
  // may still reject combinations (an even pooling kernel, ...).
  std::function<Expected<std::unique_ptr<KVPolicy>>(const std::string& name, const PolicyOptions& options)> build;
  std::string alias_of;  // empty for a base policy
};

class PolicyRegistry {
 public:
  // full, streaming, snapkv, zipage and the zipage aliases, knorm (registration order).
  static const PolicyRegistry& builtin();

  Status add(PolicyInfo info);
  // Registers `name` as `base` with other defaults; every key of `defaults` must be an option
  // of `base`.
  Status add_alias(const std::string& name, const std::string& base, const std::string& summary,
                   const PolicyOptionMap& defaults);

  // Checks the options and builds the policy; an unknown name is an error listing the names.
  Expected<std::shared_ptr<const KVPolicy>> create(const std::string& name, const PolicyOptionMap& options = {}) const;
  const PolicyInfo* find(const std::string& name) const;
  const std::vector<PolicyInfo>& policies() const { return policies_; }  // in registration order
  std::string names() const;  // "full, streaming, ..."

 private:
  std::vector<PolicyInfo> policies_;
};

// Built-in policies: one file each defining `void register_<name>(PolicyRegistry*)`, listed once
// in policy_registry.cpp (ORIGAMI_BUILTIN_POLICIES), which declares and calls them.

}  // namespace origami
