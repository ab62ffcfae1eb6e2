#include "engine/sampling_json.h"

#include <cmath>
#include <limits>

namespace origami {
namespace {

Status type_error(const char* field, const char* expected, const nlohmann::json& got) {
  return invalid_argument(std::string("field '") + field + "' must be " + expected + ", got " + got.dump());
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
  const int64_t x = v.get<int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    return invalid_argument(std::string("field '") + field + "' is out of range: " + v.dump());
  *out = static_cast<int>(x);
  return Status::ok();
}

Status read_bool(const nlohmann::json& obj, const char* field, bool* out) {
  if (!obj.contains(field) || obj[field].is_null()) return Status::ok();
  if (!obj[field].is_boolean()) return type_error(field, "true or false", obj[field]);
  *out = obj[field].get<bool>();
  return Status::ok();
}

}  // namespace

Expected<SamplingParams> sampling_params_from_json(const nlohmann::json& obj, const SamplingParams& defaults) {
  if (!obj.is_object()) return invalid_argument("a request must be a JSON object, got " + obj.dump());
  SamplingParams p = defaults;
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "temperature", &p.temperature));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "top_p", &p.top_p));
  ORIGAMI_RETURN_IF_ERROR(read_int(obj, "top_k", &p.top_k));
  ORIGAMI_RETURN_IF_ERROR(read_float(obj, "min_p", &p.min_p));
  ORIGAMI_RETURN_IF_ERROR(read_int(obj, "max_tokens", &p.max_tokens));
  ORIGAMI_RETURN_IF_ERROR(read_bool(obj, "ignore_eos", &p.ignore_eos));
  ORIGAMI_RETURN_IF_ERROR(read_bool(obj, "include_stop_str_in_output", &p.include_stop_str_in_output));
  if (obj.contains("seed") && !obj["seed"].is_null()) {
    if (!obj["seed"].is_number_integer()) return type_error("seed", "an integer", obj["seed"]);
    p.seed = obj["seed"].get<uint64_t>();
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
    const auto& s = obj["stop_token_ids"];
    if (!s.is_array()) return type_error("stop_token_ids", "a list of integers", s);
    p.stop_token_ids.clear();
    for (const auto& e : s) {
      // An id beyond int would wrap to another token; negative ids are left to validate().
      if (!e.is_number_integer() || e.get<int64_t>() < std::numeric_limits<int>::min() ||
          e.get<int64_t>() > std::numeric_limits<int>::max())
        return type_error("stop_token_ids", "a list of token ids", s);
      p.stop_token_ids.push_back(static_cast<int>(e.get<int64_t>()));
    }
  }
  ORIGAMI_RETURN_IF_ERROR(p.validate());
  return p;
}

}  // namespace origami
