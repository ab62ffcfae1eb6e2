#include "engine/request_fields.h"

#include <algorithm>

#include "core/json_excerpt.h"

namespace origami {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string closest_field(std::string_view name, const std::vector<std::string>& known) {
  // A name far longer than every field is no near miss; skip the quadratic distance.
  constexpr size_t kMaxDistance = 2;
  std::string closest;
  size_t best = kMaxDistance + 1;
  for (const std::string& k : known) {
    if (name.size() > k.size() + kMaxDistance) continue;
    const size_t d = edit_distance(name, k);
    if (d < best) {
      best = d;
      closest = k;
    }
  }
  return closest;
}

std::string field_excerpt(std::string_view name) { return text_excerpt(name); }  // cut at a UTF-8 boundary

std::string unknown_field_error(const nlohmann::json& request, const std::vector<std::string>& known,
                                std::string* unknown) {
  for (const auto& [key, value] : request.items()) {
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    if (unknown != nullptr) *unknown = field_excerpt(key);
    std::string msg = "unknown field '" + field_excerpt(key) + "'";
    if (const std::string closest = closest_field(key, known); !closest.empty())
      msg += " (did you mean '" + closest + "'?)";
    return msg;
  }
  return "";
}

}  // namespace origami
