// `origami policies`: the registered KV compression policies, their triggers, base scorers and
// options with defaults, as text or JSON.
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "policy/policy_registry.h"

namespace origami::cli {
namespace {

const char* kind_name(OptionKind kind) {
  switch (kind) {
    case OptionKind::kInt: return "int";
    case OptionKind::kFloat: return "float";
    case OptionKind::kBool: return "bool";
    case OptionKind::kEnum: return "enum";
  }
  return "?";
}

int run_policies(bool json) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  nlohmann::json list = nlohmann::json::array();
  for (const PolicyInfo& info : registry.policies()) {
    auto policy = registry.create(info.name);
    if (!policy) {
      std::fprintf(stderr, "origami: error: %s\n", policy.status().to_string().c_str());
      return 1;
    }
    const KVPolicy& p = **policy;
    nlohmann::json j;
    j["name"] = info.name;
    j["summary"] = info.summary;
    if (!info.alias_of.empty()) j["alias_of"] = info.alias_of;
    j["trigger"] = trigger_name(p.trigger());
    if (p.compresses()) j["scorer"] = scorer_name(p.score_recipe().scorer);
    j["needs_queries"] = p.needs().window_queries;
    j["needs_global_scores"] = p.needs().global_scores;
    j["needs_gates"] = p.needs().gate_scores;                // --kv-gates (CPU and CUDA)
    j["needs_reconstruction"] = p.needs().reconstruction;    // CPU only
    j["needs_joint_selection"] = p.needs().joint_selection;  // runtime head budgets, CPU only
    j["default_budget"] = p.takes_budget() ? p.default_budget() : 0;  // 0: takes no budget
    j["budget_split"] = budget_split_name(p.budget_split());
    // Runs only with calibrated head budgets (--kv-head-budgets or a request's kv_head_budgets).
    j["needs_head_budgets"] = p.budget_split() == BudgetSplit::kCalibrated;
    nlohmann::json opts = nlohmann::json::array();
    for (const PolicyOptionSpec& s : info.options)
      opts.push_back({{"name", s.name}, {"type", kind_name(s.kind)}, {"default", s.default_value},
                      {"accepted", s.accepted()}, {"help", s.help}});
    j["options"] = opts;
    list.push_back(j);
  }
  if (json) {
    std::cout << list.dump(2) << std::endl;
    return 0;
  }
  std::printf("KV compression policies (--kv-policy NAME --kv-budget TOKENS --kv-policy-opt key=value):\n");
  for (const nlohmann::json& j : list) {
    std::printf("\n%s", j["name"].get<std::string>().c_str());
    if (j.contains("alias_of")) std::printf(" (= %s with other defaults)", j["alias_of"].get<std::string>().c_str());
    std::printf("\n  %s\n", j["summary"].get<std::string>().c_str());
    std::printf("  trigger: %s", j["trigger"].get<std::string>().c_str());
    if (j["needs_head_budgets"].get<bool>()) std::printf("; needs --kv-head-budgets FILE");
    if (j.contains("scorer")) std::printf("; scorer %s", j["scorer"].get<std::string>().c_str());
    if (j["default_budget"].get<int>() > 0) std::printf("; default budget %d tokens", j["default_budget"].get<int>());
    if (j["needs_queries"].get<bool>()) std::printf("; uses query slots");
    if (j["needs_global_scores"].get<bool>()) std::printf("; uses global scores");
    if (j["needs_gates"].get<bool>()) std::printf("; needs --kv-gates");
    if (j["needs_reconstruction"].get<bool>()) std::printf("; runs a reconstruction pass (CPU)");
    if (j["needs_joint_selection"].get<bool>()) std::printf("; head budgets chosen at run time (CPU)");
    std::printf("\n");
    for (const nlohmann::json& o : j["options"])
      std::printf("    %-11s = %-9s %s (%s)\n", o["name"].get<std::string>().c_str(),
                  o["default"].get<std::string>().c_str(), o["help"].get<std::string>().c_str(),
                  o["accepted"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace

void register_policies_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("policies", "List the KV compression policies and their options");
  cmd->add_flag("--json", *json, "Print them as JSON");
  cmd->callback([json] { set_exit_code(run_policies(*json)); });
}

}  // namespace origami::cli
