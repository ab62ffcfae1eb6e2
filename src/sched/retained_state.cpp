#include "sched/retained_state.h"

#include "policy/kv_policy.h"

namespace origami {

std::string retained_policy_key(const RequestCompression& c) {
  if (!c.enabled() || c.policy == nullptr) return {};
  std::string key = c.policy->name();
  key += "|budget=" + std::to_string(c.budget) + "|max_blocks=" + std::to_string(c.max_blocks) + "|window=" + std::to_string(c.window) +
         "|chunk=" + std::to_string(c.chunk_threshold) + "|groups=";
  for (float r : c.group_ratios) key += std::to_string(r) + ",";
  return key;
}

RetainedPolicyState retained_policy_state(const Request& request) {
  const RequestCompression& c = request.compression;
  RetainedPolicyState s;
  s.policy_key = retained_policy_key(c);
  s.num_compressions = c.num_compressions;
  s.num_scored_entries = c.num_scored_entries;
  s.prefill_checked = c.prefill_checked && !c.pending;
  s.tail_from = c.tail_from;
  s.entries_after_compression = c.entries_after_compression;
  return s;
}

void resume_retained_policy_state(const RetainedPolicyState& s, RequestCompression* c) {
  c->num_compressions = s.num_compressions;
  c->num_scored_entries = s.num_scored_entries;
  c->prefill_checked = s.prefill_checked;
  c->tail_from = s.tail_from;
  c->entries_after_compression = s.entries_after_compression;
}

}  // namespace origami
