#include "policy/policy_registry.h"

#include <algorithm>

#include "core/check.h"

// The built-in policies in registration order (`origami policies` lists them so): one line per
// policy file, naming its `register_<...>` function.
#define ORIGAMI_BUILTIN_POLICIES(X) \
  X(full_policy)                    \
  X(streaming_policy)               \
  X(snapkv_policy)                  \
  X(zipage_policies)                \
  X(knorm_policy)                    \
  X(h2o_policy)                      \
  X(tova_policy)                     \
  X(keydiff_policy)                  \
  X(rkv_policy)                      \
  X(pagedeviction_policy)            \
  X(kvllm_policy)                    \
  X(fastkvzip_policy)                \
  X(kvzip_policy)                    \
  X(tangram_policy)                  \
  X(adakv_policy)

namespace origami {

#define ORIGAMI_DECLARE_POLICY(fn) void register_##fn(PolicyRegistry* registry);
ORIGAMI_BUILTIN_POLICIES(ORIGAMI_DECLARE_POLICY)
#undef ORIGAMI_DECLARE_POLICY

const PolicyRegistry& PolicyRegistry::builtin() {
  static const PolicyRegistry* registry = [] {
    auto* r = new PolicyRegistry();
#define ORIGAMI_REGISTER_POLICY(fn) register_##fn(r);
    ORIGAMI_BUILTIN_POLICIES(ORIGAMI_REGISTER_POLICY)
#undef ORIGAMI_REGISTER_POLICY
    return r;
  }();
  return *registry;
}

Status PolicyRegistry::add(PolicyInfo info) {
  if (info.name.empty() || !info.build) return invalid_argument("a policy needs a name and a builder");
  if (find(info.name) != nullptr) return invalid_argument("policy " + info.name + " is already registered");
  policies_.push_back(std::move(info));
  return Status::ok();
}

Status PolicyRegistry::add_alias(const std::string& name, const std::string& base, const std::string& summary,
                                 const PolicyOptionMap& defaults) {
  const PolicyInfo* base_info = find(base);
  if (base_info == nullptr) return invalid_argument("alias " + name + ": no policy named " + base);
  PolicyInfo info = *base_info;
  info.name = name;
  info.summary = summary;
  info.alias_of = base;
  for (const auto& entry : defaults) {
    // Plain references: clang < 16 cannot capture a structured binding in a lambda.
    const std::string& key = entry.first;
    const std::string& value = entry.second;
    auto it = std::find_if(info.options.begin(), info.options.end(), [&](const PolicyOptionSpec& s) { return s.name == key; });
    if (it == info.options.end()) return invalid_argument("alias " + name + ": " + base + " has no option " + key);
    it->default_value = value;
  }
  // The new defaults must themselves be valid values.
  Expected<PolicyOptions> check = PolicyOptions::resolve(name, info.options, {});
  if (!check) return check.status();
  return add(std::move(info));
}

const PolicyInfo* PolicyRegistry::find(const std::string& name) const {
  for (const PolicyInfo& p : policies_)
    if (p.name == name) return &p;
  return nullptr;
}

std::string PolicyRegistry::names() const {
  std::string s;
  for (const PolicyInfo& p : policies_) s += (s.empty() ? "" : ", ") + p.name;
  return s;
}

Expected<std::shared_ptr<const KVPolicy>> PolicyRegistry::create(const std::string& name,
                                                                 const PolicyOptionMap& options) const {
  const PolicyInfo* info = find(name);
  if (info == nullptr)
    return invalid_argument("unknown KV policy '" + name + "' (registered: " + names() + ")");
  Expected<PolicyOptions> resolved = PolicyOptions::resolve(name, info->options, options);
  if (!resolved) return resolved.status();
  Expected<std::unique_ptr<KVPolicy>> policy = info->build(name, *resolved);
  if (!policy) return policy.status();
  ORIGAMI_CHECK(*policy != nullptr);
  return std::shared_ptr<const KVPolicy>(std::move(*policy));
}

}  // namespace origami
