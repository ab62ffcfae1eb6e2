#include "engine/json_token_ids.h"

#include <limits>

#include "core/json_excerpt.h"

namespace origami {

Expected<std::vector<int32_t>> token_ids_from_json(const nlohmann::json& value, const std::string& field) {
  if (!value.is_array())
    return invalid_argument("field '" + field + "' must be a list of token ids (integers), got " + json_excerpt(value));
  constexpr int64_t kMaxId = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const nlohmann::json& e = value[i];
    // Unsigned JSON integers above 2^63 - 1 do not fit int64_t; they are out of range anyway.
    const bool in_range = e.is_number_unsigned() ? e.get<uint64_t>() <= static_cast<uint64_t>(kMaxId)
                          : e.is_number_integer() ? e.get<int64_t>() >= 0 && e.get<int64_t>() <= kMaxId
                                                  : false;
    if (!e.is_number_integer())
      return invalid_argument("field '" + field + "'[" + std::to_string(i) + "] must be a token id (an integer), got " +
                              json_excerpt(e));
    if (!in_range)
      return invalid_argument("field '" + field + "'[" + std::to_string(i) + "] = " + json_excerpt(e) +
                              " is not a token id (ids are integers in [0, " + std::to_string(kMaxId) + "])");
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  return ids;
}

}  // namespace origami
