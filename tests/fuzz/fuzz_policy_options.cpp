// Fuzzes the KV-policy option parsers: the first line is a policy name, each further line a
// `--kv-policy-opt key=value`. The options are parsed, then resolved and the policy built, both
// for the named policy and for every registered one. Accepted options must come back in
// canonical form and every declared option must be present.
#include "fuzz_util.h"
#include "policy/policy_registry.h"

using namespace origami;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  auto [name, rest] = fuzz::split_once(fuzz::as_text(data, size), "\n");
  PolicyOptionMap given;
  while (!rest.empty()) {
    auto [line, next] = fuzz::split_once(rest, "\n");
    rest = next;
    Status st = parse_policy_option(std::string(line), &given);
    if (!st.is_ok()) FUZZ_CHECK(st.message().find("key=value") != std::string::npos, st.message());
  }
  (void)registry.create(std::string(name), given);
  for (const PolicyInfo& info : registry.policies()) {
    Expected<PolicyOptions> resolved = PolicyOptions::resolve(info.name, info.options, given);
    if (!resolved) {
      FUZZ_CHECK(resolved.status().message().rfind("policy " + info.name, 0) == 0, resolved.status().message());
      continue;
    }
    FUZZ_CHECK(resolved->values().size() == info.options.size(), "an option missing after resolve");
    for (const PolicyOptionSpec& spec : info.options) {
      const std::string& v = resolved->get(spec.name);
      if (spec.kind == OptionKind::kInt) {
        const int i = resolved->get_int(spec.name);
        FUZZ_CHECK(std::to_string(i) == v, "int option not canonical: " + v);
        FUZZ_CHECK(i >= spec.min && i <= spec.max, "int option out of range: " + v);
      } else if (spec.kind == OptionKind::kFloat) {
        const float f = resolved->get_float(spec.name);
        FUZZ_CHECK(f >= static_cast<float>(spec.min) && f <= static_cast<float>(spec.max), spec.name + " out of range: " + v);
      } else if (spec.kind == OptionKind::kBool) {
        FUZZ_CHECK(v == "0" || v == "1", "bool option not canonical: " + v);
      }
    }
    (void)info.build(info.name, *resolved);
  }
  return 0;
}
