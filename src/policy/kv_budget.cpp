#include "policy/kv_budget.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/check.h"

namespace origami {

int resolve_kv_budget(int request_budget, int engine_budget, int policy_default) {
  if (request_budget > 0) return request_budget;
  return engine_budget > 0 ? engine_budget : policy_default;
}

int max_blocks_for_budget(int budget, int block_size) {
  ORIGAMI_CHECK(budget >= 0 && block_size >= 1);
  return budget / block_size + 1;
}

int entries_kept_for_budget(int budget, int block_size) {
  return (max_blocks_for_budget(budget, block_size) - 1) * block_size;
}

int lead_budget_for_average(int average, const std::vector<float>& group_ratios) {
  if (group_ratios.empty()) return average;
  double sum = 0.0;
  for (float r : group_ratios) sum += r;
  ORIGAMI_CHECK(sum > 0.0);
  // Within float rounding of an integer (the ratios are floats) is that integer.
  const double exact = static_cast<double>(average) * static_cast<double>(group_ratios.size()) / sum;
  const double lead = std::ceil(exact - 1e-6 * exact - 1e-9);
  return static_cast<int>(std::min(lead, static_cast<double>(std::numeric_limits<int>::max())));
}

QuerySlotSizing size_query_slots(int64_t available_bytes, int64_t block_bytes, int64_t score_page_bytes,
                                 int max_blocks, int64_t slot_bytes, int max_slots) {
  ORIGAMI_CHECK(block_bytes > 0 && score_page_bytes >= 0 && slot_bytes >= 0 && max_blocks >= 1 && max_slots >= 0);
  QuerySlotSizing out;
  if (available_bytes <= 0) return out;
  const int64_t m_block = block_bytes + score_page_bytes;
  const int64_t per_request = m_block * max_blocks + slot_bytes;
  const int64_t m = std::min<int64_t>(available_bytes / per_request, max_slots);
  out.num_query_slots = static_cast<int>(m);
  out.num_blocks = static_cast<int>((available_bytes - m * slot_bytes) / m_block);
  return out;
}

}  // namespace origami
