#pragma once
// Reads per-request options from a JSON object (JSONL batch lines, HTTP bodies):
//   "kv_policy": "zipage", "kv_budget": 2048, "kv_policy_options": {"window": 16, "global": 0},
//   "forced_output_tokens": [ids...], "return_forced_logprobs": true,
//   "kv_head_budgets": {head budget file's object} or "name" (resolved by the caller's resolver)
// Wrong types are errors naming the field; policy names and values are checked by the engine.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/request_options.h"

namespace origami {

// What a string "kv_head_budgets" names: the server looks it up among the budget files its
// operator loaded at start (never a path a client chose); `generate --input` reads the file the
// operator's JSONL line names (read_head_budgets_file). Errors say why it names nothing usable.
using HeadBudgetsResolver = std::function<Expected<std::shared_ptr<const HeadBudgets>>(const std::string& name)>;

// Without a resolver a string "kv_head_budgets" is an error (only inline objects are accepted).
Expected<RequestOptions> request_options_from_json(const nlohmann::json& obj, const RequestOptions& defaults = {},
                                                   const HeadBudgetsResolver& head_budgets = {});
// A resolver reading each path once (a regular file of at most kMaxHeadBudgetsFileBytes, never
// a FIFO or device, so a request line cannot stall or exhaust the reader) and caching it.
HeadBudgetsResolver head_budgets_file_resolver();
// The request fields request_options_from_json() reads.
const std::vector<std::string>& request_options_json_fields();

}  // namespace origami
