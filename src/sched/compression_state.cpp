#include "sched/compression_state.h"

#include <algorithm>

namespace origami {

int lead_group(const Request& request) {
  return request.kv.groups.empty() ? 0 : request.kv.entries_summary().lead_table;
}

int num_cache_entries(const Request& request) {
  if (request.kv.groups.empty()) return 0;
  const TableSummary& s = request.kv.entries_summary();
  if (request.compression.runtime_allocated()) {
    const int64_t n = static_cast<int64_t>(request.kv.groups.size());
    return static_cast<int>((s.entries_sum + n - 1) / n);
  }
  return s.max_entries;
}

int entries_after_known_tokens(const Request& request) {
  return num_cache_entries(request) + (request.num_tokens() - request.num_computed_tokens);
}

int final_keep(const RequestCompression& c) { return c.budget; }

int chunk_keep(const RequestCompression& c) { return std::max(c.chunk_threshold, c.budget); }

namespace {

// The smallest group's keep when the lead keeps `keep` (prefill-end under non-uniform group budgets).
int smallest_group_keep(const RequestCompression& c, int keep) {
  int smallest = keep;
  for (size_t g = 0; g < c.group_ratios.size(); ++g) smallest = std::min(smallest, group_keep_of(c, static_cast<int>(g), keep));
  return smallest;
}

}  // namespace

int trigger_budget(const RequestCompression& c) {
  // A runtime allocation's trigger counts the average entries per head (num_cache_entries).
  if (c.trigger != CompressionTrigger::kPrefillEnd || c.group_ratios.empty() || c.runtime_allocated()) return c.budget;
  // The prompt's end compresses to the budget, whatever the chunks kept (num_keep may hold a chunk's).
  return smallest_group_keep(c, final_keep(c));
}

double mean_kept_entries(const RequestCompression& c, int num_groups, int block_size, bool paged) {
  double sum = 0.0;
  for (int g = 0; g < num_groups; ++g) {
    const int keep = group_num_keep(c, g);
    sum += paged ? static_cast<double>((keep + block_size - 1) / block_size * block_size) : keep;
  }
  return num_groups > 0 ? sum / num_groups : 0.0;
}

TriggerState trigger_state(const Request& request, int block_size, int num_entries, long long step,
                           int due_this_step, int num_new_tokens) {
  const RequestCompression& c = request.compression;
  const int pending = request.num_tokens() - request.num_computed_tokens;
  TriggerState s;
  s.entries = num_entries;
  s.entries_after_known = num_entries + pending;
  s.tokens_pending = pending > 0;
  s.budget = trigger_budget(c);
  s.max_blocks = c.max_blocks;
  // Runtime allocation under a cache-full trigger: groups hold their heads' largest count, so the
  // average after a compression may stay above the budget; the next compression comes once one
  // more block per head has been written on average, at the earliest.
  if (c.runtime_allocated() && c.trigger == CompressionTrigger::kCacheFull && c.compressed())
    s.max_blocks = std::max(c.max_blocks, (c.entries_after_compression + block_size - 1) / block_size + 1);
  s.block_size = block_size;
  s.window = c.window;
  s.prefill_checked = c.prefill_checked;
  s.tail_from = c.tail_from;
  s.step = step;
  s.due_this_step = due_this_step;
  // A prefill-end policy's chunk threshold is the count a chunk keeps (KVPolicy::prefill_chunk_threshold:
  // its budget, or more with chunk_slack), the smallest group's under non-uniform group budgets.
  if (c.chunk_threshold >= 0 && c.trigger == CompressionTrigger::kPrefillEnd) {
    const bool grouped = !c.group_ratios.empty() && !c.runtime_allocated();
    s.chunk_threshold = grouped ? smallest_group_keep(c, chunk_keep(c)) : chunk_keep(c);
  } else {
    s.chunk_threshold = c.chunk_threshold;
  }
  s.chunk_end = num_new_tokens >= 0 ? num_entries + num_new_tokens : -1;
  s.computed_from = c.compressed() ? 0 : request.num_cached_prefix_tokens;
  return s;
}

int query_capture_from(const Request& request, int block_size, int num_entries, int num_new_tokens) {
  const RequestCompression& c = request.compression;
  if (!may_capture_queries(request)) return -1;
  const TriggerState s = trigger_state(request, block_size, num_entries, 0, 0, num_new_tokens);
  return prefill_chunk_capture_from(s, c.policy->capture_from(s));
}

int tokens_before_capture(const Request& request, int block_size, int num_entries, int num_new_tokens) {
  auto captures = [&](int n) {
    const int from = query_capture_from(request, block_size, num_entries, n);
    return from >= 0 && num_entries + n > from;
  };
  if (!captures(num_new_tokens)) return num_new_tokens;
  // Capturing is monotone in the chunk's length (a longer chunk ends later, and its window with
  // it): the longest chunk that captures nothing, by bisection. 0 when every chunk would (a
  // window that moves with the chunk's end and already reaches the current entries).
  int lo = 0, hi = num_new_tokens;  // captures(hi) is true; lo is the answer unless a longer one is
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (captures(mid) ? hi : lo) = mid;
  }
  return lo;
}

int max_prefill_entries(const RequestCompression& c, int num_tokens, int max_chunk) {
  if (c.chunk_threshold < 0) return num_tokens;
  return std::min(num_tokens, c.chunk_threshold + max_chunk);
}

bool reached_compression_trigger(Request& request, int block_size, long long step, int due_this_step) {
  RequestCompression& c = request.compression;
  if (!c.enabled() || c.policy == nullptr || c.in_flight) return false;
  const TriggerState s = trigger_state(request, block_size, num_cache_entries(request), step, due_this_step);
  // A prompt still being prefilled under prefill chunk compression: the chunk rule; else the
  // policy's own trigger.
  const bool chunk_rule = prefill_chunk_applies(s);
  const TriggerDecision d = chunk_rule ? prefill_chunk_due(s) : c.policy->compression_due(s);
  if (d.prefill_checked) c.prefill_checked = true;
  if (d.compress) {
    c.pending_kind = d.evict_block ? CompressionKind::kEvictBlock : CompressionKind::kCompact;
    c.pending_chunk = chunk_rule && c.trigger == CompressionTrigger::kPrefillEnd;
  }
  if (d.compress && d.num_keep >= 0) {
    c.num_keep = d.num_keep;
  } else if (d.compress && c.trigger == CompressionTrigger::kPrefillEnd) {
    // A prompt's chunk keeps its chunk count (the budget plus the slack that lets the prompt's last
    // window, its question, choose among more); the prompt's end keeps the budget.
    c.num_keep = chunk_rule ? chunk_keep(c) : final_keep(c);
  }
  return d.compress;
}

}  // namespace origami
