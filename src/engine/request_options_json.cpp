#include "engine/request_options_json.h"

#include <limits>
#include <map>

#include "core/json_excerpt.h"
#include "engine/json_token_ids.h"
#include "policy/kv_budget.h"

namespace origami {
namespace {

Status type_error(const char* field, const char* expected, const nlohmann::json& got) {
  return invalid_argument(std::string("field '") + field + "' must be " + expected + ", got " + json_excerpt(got));
}

bool present(const nlohmann::json& obj, const char* field) { return obj.contains(field) && !obj[field].is_null(); }

}  // namespace

const std::vector<std::string>& request_options_json_fields() {
  static const std::vector<std::string> kFields = {"kv_policy",           "kv_budget",           "kv_policy_options",
                                                   "kv_head_budgets",     "forced_output_tokens",
                                                   "return_forced_logprobs", "kv_retain"};
  return kFields;
}

Expected<RequestOptions> request_options_from_json(const nlohmann::json& obj, const RequestOptions& defaults,
                                                   const HeadBudgetsResolver& head_budgets) {
  if (!obj.is_object()) return invalid_argument("a request must be a JSON object, got " + json_excerpt(obj));
  RequestOptions o = defaults;
  if (present(obj, "kv_policy")) {
    if (!obj["kv_policy"].is_string()) return type_error("kv_policy", "a policy name", obj["kv_policy"]);
    o.kv_policy = obj["kv_policy"].get<std::string>();
  }
  if (present(obj, "kv_budget")) {
    const auto& v = obj["kv_budget"];
    // Compared as unsigned when it is one: a value above 2^63 - 1 does not fit int64_t.
    const bool in_range = v.is_number_unsigned()  ? v.get<uint64_t>() <= static_cast<uint64_t>(kMaxKvBudget)
                          : v.is_number_integer() ? v.get<int64_t>() >= 0 && v.get<int64_t>() <= kMaxKvBudget
                                                  : false;
    if (!in_range)
      return type_error("kv_budget", ("an integer in [0, " + std::to_string(kMaxKvBudget) + "] (tokens)").c_str(), v);
    o.kv_budget = static_cast<int>(v.get<int64_t>());
  }
  if (present(obj, "kv_head_budgets")) {
    const auto& v = obj["kv_head_budgets"];
    if (v.is_object()) {
      Expected<HeadBudgets> inline_budgets = parse_head_budgets_json(v, "kv_head_budgets");
      if (!inline_budgets) return invalid_argument(inline_budgets.status().message());
      o.kv_head_budgets = std::make_shared<const HeadBudgets>(std::move(*inline_budgets));
      o.kv_head_budgets_source = "kv_head_budgets";
    } else if (v.is_string() && !v.get<std::string>().empty() && head_budgets) {
      const std::string name = v.get<std::string>();
      ORIGAMI_ASSIGN_OR_RETURN(o.kv_head_budgets, head_budgets(name));
      o.kv_head_budgets_source = name.size() > 100 ? name.substr(0, 100) + "..." : name;
    } else {
      return type_error("kv_head_budgets",
                        head_budgets ? "a head budget object (origami calibrate's format) or the name of budgets loaded at start"
                                     : "a head budget object (origami calibrate's format)",
                        v);
    }
  }
  if (present(obj, "kv_policy_options")) {
    const auto& v = obj["kv_policy_options"];
    if (!v.is_object()) return type_error("kv_policy_options", "an object of option values", v);
    for (const auto& [key, value] : v.items()) {
      // Options are text to the policy; numbers and booleans are accepted as such.
      if (value.is_string()) {
        o.kv_policy_options[key] = value.get<std::string>();
      } else if (value.is_boolean()) {
        o.kv_policy_options[key] = value.get<bool>() ? "1" : "0";
      } else if (value.is_number()) {
        o.kv_policy_options[key] = value.dump();  // a number: short
      } else {
        return invalid_argument("field 'kv_policy_options." + text_excerpt(key) +
                                "' must be a string, number or boolean, got " + json_excerpt(value));
      }
    }
  }
  if (present(obj, "forced_output_tokens")) {
    ORIGAMI_ASSIGN_OR_RETURN(o.forced_output_tokens, token_ids_from_json(obj["forced_output_tokens"], "forced_output_tokens"));
  }
  // kv_retain: false keeps the request off retained contexts (neither continues one nor is kept);
  // true is the default (retain-only requests are read by the server: max_tokens 0).
  if (present(obj, "kv_retain")) {
    if (!obj["kv_retain"].is_boolean()) return type_error("kv_retain", "true or false", obj["kv_retain"]);
    o.retain_context = obj["kv_retain"].get<bool>();
  }
  if (present(obj, "return_forced_logprobs")) {
    if (!obj["return_forced_logprobs"].is_boolean())
      return type_error("return_forced_logprobs", "true or false", obj["return_forced_logprobs"]);
    o.return_forced_logprobs = obj["return_forced_logprobs"].get<bool>();
  }
  return o;
}

HeadBudgetsResolver head_budgets_file_resolver() {
  auto cache = std::make_shared<std::map<std::string, std::shared_ptr<const HeadBudgets>>>();
  return [cache](const std::string& path) -> Expected<std::shared_ptr<const HeadBudgets>> {
    auto it = cache->find(path);
    if (it != cache->end()) return it->second;
    Expected<HeadBudgets> loaded = load_head_budgets(path);
    if (!loaded) return invalid_argument("kv_head_budgets: " + loaded.status().message());
    auto budgets = std::make_shared<const HeadBudgets>(std::move(*loaded));
    cache->emplace(path, budgets);
    return budgets;
  };
}

}  // namespace origami
