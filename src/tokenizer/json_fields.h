#pragma once
// Optional typed fields of tokenizer.json / tokenizer_config.json objects. Absent or null gives
// the fallback; a value of another type is an error naming the field (nlohmann's value() would
// throw instead, which a hostile or mistyped file must not be able to cause).
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace origami {

inline Expected<bool> optional_bool(const nlohmann::json& obj, const char* key, bool fallback, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return invalid_file(where + "." + key + " must be true or false, got " + it->dump());
  return it->get<bool>();
}

inline Expected<std::string> optional_string(const nlohmann::json& obj, const char* key, const std::string& fallback,
                                             const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return invalid_file(where + "." + key + " must be a string, got " + it->dump());
  return it->get<std::string>();
}

inline Expected<int> optional_int(const nlohmann::json& obj, const char* key, int fallback, int min, int max,
                                  const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < min || it->get<int64_t>() > max) {
    return invalid_file(where + "." + key + " must be an integer in [" + std::to_string(min) + ", " +
                        std::to_string(max) + "], got " + it->dump());
  }
  return static_cast<int>(it->get<int64_t>());
}

}  // namespace origami
