#include "sched/compression_state.h"

#include <algorithm>

namespace origami {

int num_cache_entries(const Request& request) {
  return request.kv.groups.empty() ? 0 : request.kv.groups[0].num_entries;
}

int entries_after_known_tokens(const Request& request) {
  return num_cache_entries(request) + (request.num_tokens() - request.num_computed_tokens);
}

int query_capture_from(const Request& request, int block_size, int num_entries) {
  const RequestCompression& c = request.compression;
  if (c.window <= 0) return -1;
  const int end = num_entries + (request.num_tokens() - request.num_computed_tokens);
  switch (c.trigger) {
    case CompressionTrigger::kNever: return -1;
    case CompressionTrigger::kCacheFull: return std::max(c.max_blocks * block_size, end) - c.window;
    case CompressionTrigger::kPrefillEnd:
      if (c.prefill_checked || end <= c.budget) return -1;
      return end - c.window;
  }
  return -1;
}

bool reached_compression_trigger(Request& request, int block_size) {
  RequestCompression& c = request.compression;
  if (!c.enabled() || c.in_flight || request.num_computed_tokens < request.num_tokens()) return false;
  const int entries = num_cache_entries(request);
  switch (c.trigger) {
    case CompressionTrigger::kNever: return false;
    case CompressionTrigger::kCacheFull: return entries >= c.max_blocks * block_size;
    case CompressionTrigger::kPrefillEnd:
      if (c.prefill_checked) return false;
      c.prefill_checked = true;
      return entries > c.budget;
  }
  return false;
}

}  // namespace origami
