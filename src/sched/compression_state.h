#pragma once
// When a request compresses and which of its tokens' queries that compression needs: this file
// only describes the Request to its policy (TriggerState, policy/triggers.h), which decides
// (KVPolicy::compression_due / capture_from). Counts are KV entries, not logical tokens: a
// compressed request holds fewer entries than its positions.
#include "policy/triggers.h"
#include "sched/request.h"

namespace origami {

// The head group holding the most entries (the first such): the one whose length a policy's
// trigger and budget describe. Every group holds as many entries under uniform budgets; with
// non-uniform budgets the groups with budget ratio 1 lead. From the request's table summary
// (RequestKV::summary): no walk over its groups unless they changed since the last reader.
int lead_group(const Request& request);

// Entries head group `group` keeps per (layer, head) when the request is compressed:
// ceil(group_ratios[group] x num_keep), at least 1 (num_keep itself with uniform budgets).
int group_num_keep(const RequestCompression& compression, int group);
// The same for a request keeping `num_keep` (the lead group's count): a prefill-end request compressed
// chunk by chunk keeps its chunk count (RequestCompression::chunk_threshold) at a chunk's end and its
// budget at the prompt's end.
int group_keep_of(const RequestCompression& compression, int group, int num_keep);
// Prefill-end requests: the lead group's count the prompt's end compresses to (the budget), and the
// count a prefill chunk's end compresses to (chunk_threshold: the budget x (1 + chunk_slack)).
int final_keep(const RequestCompression& compression);
int chunk_keep(const RequestCompression& compression);

// The budget the request's trigger compares its lead group's entries with: the budget, except
// for a prefill-end policy under non-uniform group budgets, where it is the smallest group's keep.
// Groups with smaller keeps never hold more entries than groups with larger ones (all grow by the
// same tokens, and a compression cuts each to its own keep), so the lead holding more than the
// smallest keep means exactly that some group holds more than its own keep: the trigger compresses
// every group over its keep (those within theirs are left as is, Scheduler::try_start_compression).
int trigger_budget(const RequestCompression& compression);

// Entries a compression keeps per (layer, KV head), averaged over the `num_groups` head groups:
// every head of a group keeps its group's count (group_num_keep), so this is what the grouped
// layout really holds, group padding included; with `paged`, each group's count rounded up to
// whole blocks of `block_size` (the pages it occupies). For a document longer than every keep.
double mean_kept_entries(const RequestCompression& compression, int num_groups, int block_size, bool paged);

// Entries the request's cache holds: its lead group's; under a runtime allocation
// (RequestCompression::runtime_allocated) the entries per (layer, KV head) on average over its
// head groups (rounded up; every group has as many heads), the count its trigger and budget
// describe. Every group grows by the same tokens, so any of these counts moves with the tokens:
// kept in the request's table summary, walked for only after its tables changed otherwise.
int num_cache_entries(const Request& request);

// Whether the request can ever capture queries for a compression: only with a query window
// (every trigger's capture_from is -1 without one). Lets the scheduler skip num_cache_entries,
// which walks every head group's table (288 with per-head pages) when they changed.
inline bool may_capture_queries(const Request& request) {
  const RequestCompression& c = request.compression;
  return c.enabled() && c.policy != nullptr && c.window > 0;
}

// Entries the cache will hold once every known token is computed: the end of the current
// prefill, or the entry the next decode step writes.
int entries_after_known_tokens(const Request& request);

// The request as its policy's trigger sees it, with `num_entries` entries in its cache.
// `step` and `due_this_step` describe the step across requests (TriggerState); `num_new_tokens`
// the chunk about to be computed (-1: not known).
TriggerState trigger_state(const Request& request, int block_size, int num_entries, long long step = 0,
                           int due_this_step = 0, int num_new_tokens = -1);

// The entry index from which computed tokens must capture their queries into the request's
// query slot, because they form the observation window of its next compression; -1 when no
// compression that needs queries is coming (KVPolicy::capture_from; e.g. cache_full_capture_from).
// `num_entries` is what the cache holds before the tokens about to be computed (the engine
// passes it explicitly: by then the scheduler has already grown the table for this step).
// `num_new_tokens`: the chunk about to be computed, whose end a prefill chunk compression's window
// follows (-1: not known; prefill_chunk_capture_from).
int query_capture_from(const Request& request, int block_size, int num_entries, int num_new_tokens = -1);
inline int query_capture_from(const Request& request, int block_size) {
  return query_capture_from(request, block_size, num_cache_entries(request));
}

// The most tokens (<= num_new_tokens) the request can compute from `num_entries` entries without
// capturing a query (no query slot needed): all of them, or those before its next window. A
// window that moves with the chunk's end (prefill chunk compression) is searched for.
int tokens_before_capture(const Request& request, int block_size, int num_entries, int num_new_tokens);

// Entries the request holds at most while prefilling `num_tokens` tokens in chunks of at most
// `max_chunk`: all of them, or with prefill chunk compression its threshold plus one chunk.
int max_prefill_entries(const RequestCompression& compression, int num_tokens, int max_chunk);

// After step `step`: whether the request has reached its trigger (KVPolicy::compression_due; never
// while a compression of it is in flight), `due_this_step` requests under a policy of the same
// name having been found due in this step already. A one-off decision marks prefill_checked; a
// decision that keeps a count of its own sets num_keep.
bool reached_compression_trigger(Request& request, int block_size, long long step = 0, int due_this_step = 0);

}  // namespace origami
