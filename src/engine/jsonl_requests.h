#pragma once
// A JSONL file of requests (`generate --input`, `bench --input`): one JSON object per line with
// "prompt" (text or token ids) or "messages", sampling fields and request options. Every line
// gets an item, so that item i is line i + 1: a line that cannot become a request (not JSON, a
// blank line, an unknown field, a bad value) gets an item whose error names "<file>:<line>:" and
// what is wrong; the other lines still run.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/batch_runner.h"
#include "engine/prompt_builder.h"

namespace origami {

struct JsonlRequest {
  BatchItem item;       // item.error set when the line is not a valid request
  nlohmann::json id;    // the line's "id" (echoed in results), null when absent
};

// Fields a request line may carry besides those of PromptBuilder, sampling_json and
// request_options_json: "id", any JSON value, echoed back in the result.
inline constexpr const char* kRequestIdField = "id";

// Reads every line of `path`; not_found when the file cannot be opened. `defaults` are the
// sampling values of fields a line leaves out.
Expected<std::vector<JsonlRequest>> read_jsonl_requests(const std::string& path, const PromptBuilder& builder,
                                                        const SamplingParams& defaults);

// The error for one parsed line, "" when it is a valid request. Unknown fields are errors (as in
// OpenAI's API; a typo such as "max_tokns" must not be dropped silently) and name the closest
// known field.
std::string check_request_fields(const nlohmann::json& request);

}  // namespace origami
