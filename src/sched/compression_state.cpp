#include "sched/compression_state.h"

namespace origami {

int lead_group(const Request& request) {
  int lead = 0;
  for (size_t g = 1; g < request.kv.groups.size(); ++g)
    if (request.kv.groups[g].num_entries > request.kv.groups[static_cast<size_t>(lead)].num_entries)
      lead = static_cast<int>(g);
  return lead;
}

int num_cache_entries(const Request& request) {
  return request.kv.groups.empty() ? 0 : request.kv.groups[static_cast<size_t>(lead_group(request))].num_entries;
}

int entries_after_known_tokens(const Request& request) {
  return num_cache_entries(request) + (request.num_tokens() - request.num_computed_tokens);
}

TriggerState trigger_state(const Request& request, int block_size, int num_entries, long long step,
                           int due_this_step) {
  const RequestCompression& c = request.compression;
  const int pending = request.num_tokens() - request.num_computed_tokens;
  TriggerState s;
  s.entries = num_entries;
  s.entries_after_known = num_entries + pending;
  s.tokens_pending = pending > 0;
  s.budget = c.budget;
  s.max_blocks = c.max_blocks;
  s.block_size = block_size;
  s.window = c.window;
  s.prefill_checked = c.prefill_checked;
  s.tail_from = c.tail_from;
  s.step = step;
  s.due_this_step = due_this_step;
  return s;
}

int query_capture_from(const Request& request, int block_size, int num_entries) {
  const RequestCompression& c = request.compression;
  if (!c.enabled() || c.policy == nullptr) return -1;
  return c.policy->capture_from(trigger_state(request, block_size, num_entries));
}

bool reached_compression_trigger(Request& request, int block_size, long long step, int due_this_step) {
  RequestCompression& c = request.compression;
  if (!c.enabled() || c.policy == nullptr || c.in_flight) return false;
  const TriggerDecision d = c.policy->compression_due(
      trigger_state(request, block_size, num_cache_entries(request), step, due_this_step));
  if (d.prefill_checked) c.prefill_checked = true;
  if (d.compress) c.pending_kind = d.evict_block ? CompressionKind::kEvictBlock : CompressionKind::kCompact;
  if (d.compress && d.num_keep >= 0) c.num_keep = d.num_keep;
  return d.compress;
}

}  // namespace origami
