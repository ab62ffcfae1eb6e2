#pragma once
// Reads sampling fields from a JSON object (JSONL batch lines, HTTP bodies), OpenAI/vLLM names.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "sampling/sampling_params.h"

namespace origami {

// Starts from `defaults` and overrides each field present: temperature, top_p, top_k, min_p,
// seed, max_tokens, ignore_eos, stop (string or list), stop_token_ids, include_stop_str_in_output,
// presence_penalty, frequency_penalty, repetition_penalty, min_tokens, logit_bias
// ({"token id": bias}, OpenAI's form).
// Wrong types are errors naming the field; the result is validated.
Expected<SamplingParams> sampling_params_from_json(const nlohmann::json& obj, const SamplingParams& defaults);
// The request fields sampling_params_from_json() reads.
const std::vector<std::string>& sampling_json_fields();

}  // namespace origami
