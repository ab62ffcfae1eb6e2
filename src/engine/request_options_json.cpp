#include "engine/request_options_json.h"

#include <limits>

#include "engine/json_token_ids.h"

namespace origami {
namespace {

Status type_error(const char* field, const char* expected, const nlohmann::json& got) {
  return invalid_argument(std::string("field '") + field + "' must be " + expected + ", got " + got.dump());
}

bool present(const nlohmann::json& obj, const char* field) { return obj.contains(field) && !obj[field].is_null(); }

}  // namespace

const std::vector<std::string>& request_options_json_fields() {
  static const std::vector<std::string> kFields = {"kv_policy",           "kv_budget",           "kv_policy_options",
                                                   "kv_head_budgets",     "forced_output_tokens",
                                                   "return_forced_logprobs"};
  return kFields;
}

Expected<RequestOptions> request_options_from_json(const nlohmann::json& obj, const RequestOptions& defaults) {
  if (!obj.is_object()) return invalid_argument("a request must be a JSON object, got " + obj.dump());
  RequestOptions o = defaults;
  if (present(obj, "kv_policy")) {
    if (!obj["kv_policy"].is_string()) return type_error("kv_policy", "a policy name", obj["kv_policy"]);
    o.kv_policy = obj["kv_policy"].get<std::string>();
  }
  if (present(obj, "kv_budget")) {
    const auto& v = obj["kv_budget"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
        (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max())))
      return type_error("kv_budget", "a non-negative integer (tokens)", v);
    o.kv_budget = static_cast<int>(v.get<int64_t>());
  }
  if (present(obj, "kv_head_budgets")) {
    if (!obj["kv_head_budgets"].is_string() || obj["kv_head_budgets"].get<std::string>().empty())
      return type_error("kv_head_budgets", "the path of a head budget file (origami calibrate)", obj["kv_head_budgets"]);
    o.kv_head_budgets = obj["kv_head_budgets"].get<std::string>();
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
        o.kv_policy_options[key] = value.dump();
      } else {
        return invalid_argument("field 'kv_policy_options." + key + "' must be a string, number or boolean, got " +
                                value.dump());
      }
    }
  }
  if (present(obj, "forced_output_tokens")) {
    ORIGAMI_ASSIGN_OR_RETURN(o.forced_output_tokens, token_ids_from_json(obj["forced_output_tokens"], "forced_output_tokens"));
  }
  if (present(obj, "return_forced_logprobs")) {
    if (!obj["return_forced_logprobs"].is_boolean())
      return type_error("return_forced_logprobs", "true or false", obj["return_forced_logprobs"]);
    o.return_forced_logprobs = obj["return_forced_logprobs"].get<bool>();
  }
  return o;
}

}  // namespace origami
