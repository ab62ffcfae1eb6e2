#pragma once
// Reads the body of POST /v1/completions and /v1/chat/completions into what the engine runs:
// prompt token ids (prompt as a string, a list of strings, token ids or lists of token ids;
// or chat messages rendered with the model's chat template), sampling parameters (OpenAI and
// vLLM names, through sampling_params_from_json), log-probabilities (completions' `logprobs: N`,
// chat's `logprobs: true` + `top_logprobs: N`, into RequestOptions::logprobs), n, streaming
// options, vLLM's return_token_ids, and origami's per-request kv_policy / kv_budget / kv_policy_options
// (request_options_from_json).
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/prompt_builder.h"
#include "engine/request_options.h"
#include "engine/request_options_json.h"
#include "sampling/sampling_params.h"
#include "server/api_error.h"

namespace origami::server {

enum class ApiKind { kCompletion, kChat };

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<std::vector<int32_t>> prompts;  // one per prompt; each runs n choices
  int n = 1;
  SamplingParams sampling;
  RequestOptions options;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool continuous_usage = false;  // stream_options.continuous_usage_stats (vLLM)
  // vLLM's "return_token_ids": the response also carries the prompt's ids as the engine saw
  // them and each choice's generated ids (streaming: the ids of each chunk).
  bool return_token_ids = false;
};

// What parsing needs from the server; prompt building is serialized (the chat template is
// parsed lazily by PromptBuilder).
struct RequestContext {
  const PromptBuilder* builder = nullptr;
  std::mutex* builder_mutex = nullptr;
  std::string served_model_name;
  int max_model_len = 0;
  int max_n = 128;
  // What a string "kv_head_budgets" names (the budgets the operator loaded at start); null: only
  // inline objects are accepted.
  const HeadBudgetsResolver* head_budgets = nullptr;
  bool retain_contexts = false;  // the engine retains contexts (retain-only requests need it)
};

// Parses a JSON body (any route's) or produces the 400 for it: not JSON, or not an object.
std::optional<ApiError> parse_json_body(std::string_view body, nlohmann::json* out);
// nullopt on success.
std::optional<ApiError> parse_generation_request(const nlohmann::json& body, ApiKind kind, const RequestContext& ctx,
                                                 GenerationRequest* out);
// "model" absent or naming the served model; else a 404 error.
std::optional<ApiError> check_model(const nlohmann::json& body, const std::string& served_model_name);
// Chat messages with content parts joined into strings ("content": [{"type": "text", ...}]).
std::optional<ApiError> normalize_messages(const nlohmann::json& messages, nlohmann::json* out);

}  // namespace origami::server
