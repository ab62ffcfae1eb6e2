#include "sampling/stop_checker.h"

#include <algorithm>

namespace origami {

StopMatch find_stop_string(std::string_view text, size_t new_text_begin, const std::vector<std::string>& stops,
                           bool include_stop_str_in_output) {
  StopMatch best;
  new_text_begin = std::min(new_text_begin, text.size());
  if (new_text_begin == text.size()) return best;  // nothing new can complete a stop string
  for (size_t s = 0; s < stops.size(); ++s) {
    const std::string& stop = stops[s];
    if (stop.empty() || stop.size() > text.size()) continue;
    // The earliest start whose end (start + size) lies past new_text_begin.
    const size_t from = new_text_begin + 1 > stop.size() ? new_text_begin + 1 - stop.size() : 0;
    // For one stop string the first occurrence from `from` is also its earliest-ending one.
    const size_t pos = text.find(stop, from);
    if (pos == std::string_view::npos) continue;
    const size_t end = pos + stop.size();
    if (!best.found || end < best.match_end || (end == best.match_end && pos < best.match_begin)) {
      best.found = true;
      best.stop_index = s;
      best.match_begin = pos;
      best.match_end = end;
    }
  }
  if (best.found) best.truncate_at = include_stop_str_in_output ? best.match_end : best.match_begin;
  return best;
}

size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    // Longest proper prefix of `stop` that the text ends with; longer than `hold` to matter.
    const size_t longest = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size());
    for (size_t len = longest; len > hold; --len) {
      if (text.compare(text.size() - len, len, stop, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  return hold;
}

bool is_stop_token(const SamplingParams& params, int32_t token, std::span<const int32_t> eos_token_ids) {
  if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), token) != params.stop_token_ids.end())
    return true;
  if (params.ignore_eos) return false;
  return std::find(eos_token_ids.begin(), eos_token_ids.end(), token) != eos_token_ids.end();
}

}  // namespace origami
