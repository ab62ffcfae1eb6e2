#include "server/named_head_budgets.h"

#include <cctype>

#include "engine/head_budget_loader.h"

namespace origami::server {
namespace {

bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

}  // namespace

Expected<NamedHeadBudgets> load_named_head_budgets(const std::vector<std::string>& specs) {
  NamedHeadBudgets out;
  for (const std::string& spec : specs) {
    const size_t eq = spec.find('=');
    const std::string name = spec.substr(0, eq);
    if (eq == std::string::npos || eq + 1 == spec.size() || !valid_name(name))
      return invalid_argument("--kv-head-budgets-file '" + spec.substr(0, 200) +
                              "': expected NAME=PATH, NAME of letters, digits, '.', '_' or '-' (at most 64)");
    if (out.count(name)) return invalid_argument("--kv-head-budgets-file: the name '" + name + "' is given twice");
    Expected<HeadBudgets> loaded = load_head_budgets(spec.substr(eq + 1));
    if (!loaded) return invalid_argument("--kv-head-budgets-file " + name + ": " + loaded.status().message());
    out.emplace(name, std::make_shared<const HeadBudgets>(std::move(*loaded)));
  }
  return out;
}

Status check_named_head_budgets(const NamedHeadBudgets& budgets, const ModelConfig& model) {
  const ModelIdentity id = model_identity(model);
  for (const auto& [name, b] : budgets) {
    const Status st = check_head_budgets_model(*b, id);
    if (!st.is_ok()) return invalid_argument("--kv-head-budgets-file " + name + ": " + st.message());
  }
  return Status::ok();
}

HeadBudgetsResolver named_head_budgets_resolver(const NamedHeadBudgets& budgets) {
  return [&budgets](const std::string& name) -> Expected<std::shared_ptr<const HeadBudgets>> {
    auto it = budgets.find(name);
    if (it != budgets.end()) return it->second;
    std::string loaded;
    for (const auto& [n, b] : budgets) loaded += (loaded.empty() ? "" : ", ") + n;
    return invalid_argument(
        "field 'kv_head_budgets' names no head budgets this server loaded ('" + name.substr(0, 100) +
        (name.size() > 100 ? "...'" : "'") + "; loaded: " + (loaded.empty() ? "none" : loaded) +
        "). The server never opens a path a request names: send the budgets inline as an object, or name budgets the "
        "server was started with (--kv-head-budgets-file NAME=PATH)");
  };
}

}  // namespace origami::server
