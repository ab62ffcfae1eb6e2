#pragma once
// Reads per-request options from a JSON object (JSONL batch lines, HTTP bodies):
//   "kv_policy": "zipage", "kv_budget": 2048, "kv_policy_options": {"window": 16, "global": 0},
//   "forced_output_tokens": [ids...], "return_forced_logprobs": true
// Wrong types are errors naming the field; policy names and values are checked by the engine.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/request_options.h"

namespace origami {

Expected<RequestOptions> request_options_from_json(const nlohmann::json& obj, const RequestOptions& defaults = {});
// The request fields request_options_from_json() reads.
const std::vector<std::string>& request_options_json_fields();

}  // namespace origami
