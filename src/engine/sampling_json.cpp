#include "engine/sampling_json.h"

#include "core/json_excerpt.h"
#include "engine/json_token_ids.h"

#include <cmath>
#include <limits>

namespace origami {
namespace {

Status type_error(const char* field, const char* expected, const nlohmann::json& got) {
  return invalid_argument(std::string("field '") + field + "' must be " + expected + ", got " + json_excerpt(got));
}

Status read_float(const nlohmann::json& obj, const char* field, float* out) {
  if (!obj.contains(field) || obj[field].is_null()) return Status::ok();
  if (!obj[field].is_number()) return type_error(field, "a number", obj[field]);
  *out = obj[field].get<float>();
  return Status::ok();
}

Status read_int(const nlohmann::json& obj, const char* field, int* out) {
  if (!obj.contains(field) || obj[field].is_null()) return Status::ok();
  const auto& v = obj[field];
  if (!v.is_number_integer()) return type_error(field, "an integer", v);
  // Range-checked in 64 bits (unsigned above 2^63 - 1 first) before narrowing to int.
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int>::max());
  const int64_t x = huge ? 0 : v.get<int64_t>();
  if (huge || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    return invalid_argument(std::string("field '") + field + "' is out of range: " + json_excerpt(v));
  *out = static_cast<int>(x);
  return Status::ok();
}

Status read_bool(const nlohmann::json& obj, const char* field, bool* out) {
  if (!obj.contains(field) || obj[field].is_null()) return Status::ok();
  if (!obj[field].is_boolean()) return type_error(field, "true or false", obj[field]);
  *out = obj[field].get<bool>();
  return Status::ok();
}

// OpenAI's {"token id as a string": bias}; JSON object keys are strings, so the ids are parsed
// here (plain decimal digits only). Range checks are SamplingParams::validate()'s and the engine's.
Status read_logit_bias(const nlohmann::json& obj, std::vector<std::pair<int32_t, float>>* out) {
  if (!obj.contains("logit_bias") || obj["logit_bias"].is_null()) return Status::ok();
  const auto& v = obj["logit_bias"];
  if (!v.is_object()) return invalid_argument("field 'logit_bias' must be an object {\"token id\": bias}");
  if (v.size() > static_cast<size_t>(SamplingParams::kMaxLogitBiasEntries))
    return invalid_argument("field 'logit_bias' has " + std::to_string(v.size()) + " entries; at most " +
                            std::to_string(SamplingParams::kMaxLogitBiasEntries) + " are allowed");
  out->clear();
  for (const auto& [key, bias] : v.items()) {
    const bool digits = !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
    if (!digits)
      return invalid_argument("field 'logit_bias' has key '" + text_excerpt(key) +
                              "'; keys must be token ids (non-negative integers, as strings)");
    if (!bias.is_number())
      return invalid_argument("field 'logit_bias' entry '" + key + "' must be a number in [-100, 100]");
    out->emplace_back(static_cast<int32_t>(std::stol(key)), bias.get<float>());
  }
  return Status::ok();
}

}  // namespace

const std::vector<std::string>& sampling_json_fields() {
  static const std::vector<std::string> kFields = {"temperature", "top_p",          "top_k", "min_p",
                                                   "max_tokens",  "ignore_eos",     "seed",  "stop",
                                                   "stop_token_ids", "include_stop_str_in_output",
                                                   "presence_penalty", "frequency_penalty", "repetition_penalty",
                                                   "min_tokens", "logit_bias"};
  return kFields;
}

Expected<SamplingParams> sampling_params_from_json(const nlohmann::json& obj, const SamplingParams& defaults) {
  if (!obj.is_object()) return invalid_argument("a request must be a JSON object, got " + json_excerpt(obj));
  SamplingParams p = defaults;
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "temperature", &p.temperature));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "top_p", &p.top_p));
  ORIGAMI_RETURN_IF_ERROR(read_int(obj, "top_k", &p.top_k));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "min_p", &p.min_p));
  ORIGAMI_RETURN_IF_ERROR(read_int(obj, "max_tokens", &p.max_tokens));
  ORIGAMI_RETURN_IF_ERROR(read_bool(obj, "ignore_eos", &p.ignore_eos));
  ORIGAMI_RETURN_IF_ERROR(read_bool(obj, "include_stop_str_in_output", &p.include_stop_str_in_output));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "presence_penalty", &p.presence_penalty));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "frequency_penalty", &p.frequency_penalty));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "repetition_penalty", &p.repetition_penalty));
  ORIGAMI_RETURN_IF_ERROR(read_int(obj, "min_tokens", &p.min_tokens));
  ORIGAMI_RETURN_IF_ERROR(read_logit_bias(obj, &p.logit_bias));
  if (obj.contains("seed") && !obj["seed"].is_null()) {
    // A negative seed (llama.cpp's -1 = "random") would wrap to a fixed 64-bit seed: omit the
    // field for an unseeded request instead.
    const auto& v = obj["seed"];
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0))
      return type_error("seed", "a non-negative integer (omit it for an unseeded request)", v);
    p.seed = v.get<uint64_t>();
  }
  if (obj.contains("stop") && !obj["stop"].is_null()) {
    const auto& s = obj["stop"];
    p.stop.clear();
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& e : s) {
        if (!e.is_string()) return type_error("stop", "a string or a list of strings", s);
        p.stop.push_back(e.get<std::string>());
      }
    } else {
      return type_error("stop", "a string or a list of strings", s);
    }
  }
  if (obj.contains("stop_token_ids") && !obj["stop_token_ids"].is_null()) {
    ORIGAMI_ASSIGN_OR_RETURN(std::vector<int32_t> ids, token_ids_from_json(obj["stop_token_ids"], "stop_token_ids"));
    p.stop_token_ids.assign(ids.begin(), ids.end());
  }
  ORIGAMI_RETURN_IF_ERROR(p.validate());
  return p;
}

}  // namespace origami
