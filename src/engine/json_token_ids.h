#pragma once
// Token id lists in JSON requests ("prompt" as ids, "stop_token_ids", "forced_output_tokens"):
// every element is range-checked as a 64-bit integer before it is narrowed, so 4294967301 is an
// error rather than id 5, and 2^63 - 1 rather than id -1. Whether an id is inside the model's
// vocabulary is the engine's check (it knows the vocabulary).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace origami {

// `value` must be a list of integers in [0, 2^31 - 1]; errors name `field` and the element.
Expected<std::vector<int32_t>> token_ids_from_json(const nlohmann::json& value, const std::string& field);

}  // namespace origami
