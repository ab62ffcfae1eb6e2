#include "policy/triggers.h"

#include <algorithm>
#include <cstdint>

namespace origami {
namespace {

// N_max * b entries, in 64 bits: budgets are bounded (kMaxKvBudget) well inside int, but a trigger
// must not wrap into firing on an unchecked one.
int64_t full_level(const TriggerState& s) { return int64_t{s.max_blocks} * s.block_size; }

}  // namespace

TriggerDecision cache_full_due(const TriggerState& s) {
  TriggerDecision d;
  d.compress = !s.tokens_pending && s.entries >= full_level(s);
  return d;
}

int cache_full_capture_from(const TriggerState& s) {
  if (s.window <= 0) return -1;
  return static_cast<int>(std::max<int64_t>(full_level(s), s.entries_after_known) - s.window);
}

TriggerDecision prefill_end_due(const TriggerState& s) {
  TriggerDecision d;
  if (s.tokens_pending || s.prefill_checked) return d;
  d.prefill_checked = true;
  d.compress = s.entries > s.budget;
  return d;
}

int prefill_end_capture_from(const TriggerState& s) {
  if (s.window <= 0 || s.prefill_checked || s.entries_after_known <= s.budget) return -1;
  return s.entries_after_known - s.window;
}

TriggerDecision paged_eviction_due(const TriggerState& s) {
  TriggerDecision d;
  if (s.tokens_pending) return d;
  if (!s.prefill_checked) {
    d.prefill_checked = true;
    d.compress = s.entries > full_level(s) - s.block_size;
    return d;
  }
  // Decoding: one whole block leaves when the request holds exactly N_max full blocks. A retained
  // context's next turn (kv/retained_contexts.h) appends a prompt that can carry the cache past
  // N_max blocks, to a count no whole block evens out: that prompt's end is compacted token-wise
  // to k, as the first prompt's end is.
  d.compress = s.entries >= full_level(s);
  d.evict_block = s.entries == full_level(s);
  return d;
}

TriggerDecision periodic_due(const TriggerState& s, int period, int max_per_step) {
  TriggerDecision d;
  d.compress = !s.tokens_pending && period > 0 && s.step > 0 && s.step % period == 0 &&
               s.entries - s.tail_from >= s.window && s.window > 0 && s.due_this_step < max_per_step;
  return d;
}

int periodic_capture_from(const TriggerState& s) {
  if (s.window <= 0) return -1;
  return std::max(s.tail_from, s.entries_after_known - s.window);
}

bool prefill_chunk_applies(const TriggerState& s) { return s.chunk_threshold >= 0 && s.tokens_pending; }

TriggerDecision prefill_chunk_due(const TriggerState& s) {
  TriggerDecision d;
  d.compress = prefill_chunk_applies(s) && s.entries > s.chunk_threshold && s.entries - s.window >= s.computed_from;
  return d;
}

int prefill_chunk_capture_from(const TriggerState& s, int policy_capture_from) {
  if (s.window <= 0 || !prefill_chunk_applies(s)) return policy_capture_from;
  const int end = s.chunk_end >= 0 ? s.chunk_end : s.entries + 1;
  const bool last_chunk = end >= s.entries_after_known;
  const bool compression_ahead = s.entries_after_known > s.chunk_threshold;
  if (last_chunk || !compression_ahead || end <= s.chunk_threshold - s.window) return policy_capture_from;
  return end - s.window;
}

}  // namespace origami
