#pragma once
// When a request compresses and which of its tokens' queries that compression needs, from its
// policy's trigger (see RequestCompression). Counts are KV entries, not logical tokens: a
// compressed request holds fewer entries than its positions.
#include "sched/request.h"

namespace origami {

// Entries the request's cache holds (group 0; equal across groups for uniform budgets).
int num_cache_entries(const Request& request);

// Entries the cache will hold once every known token is computed: the end of the current
// prefill, or the entry the next decode step writes.
int entries_after_known_tokens(const Request& request);

// The entry index from which computed tokens must capture their queries into the request's
// query slot, because they form the observation window of its next compression; -1 when no
// compression that needs queries is coming.
//   kCacheFull:  E - w with E = max(N_max * b, entries_after_known_tokens): the last w entries of
//                block N_max (Zipage's "b - w tokens in the last block"), or of a prompt that
//                overshoots N_max blocks (it compresses right after its prefill).
//   kPrefillEnd: E - w with E = entries_after_known_tokens, while the prefill decision is still
//                to come and the prompt is longer than the budget.
// `num_entries` is what the cache holds before the tokens about to be computed (the engine
// passes it explicitly: by then the scheduler has already grown the table for this step).
int query_capture_from(const Request& request, int block_size, int num_entries);
inline int query_capture_from(const Request& request, int block_size) {
  return query_capture_from(request, block_size, num_cache_entries(request));
}

// After a step: whether the request has reached its trigger (it must not be prefilling).
// kPrefillEnd decides once (marks prefill_checked).
bool reached_compression_trigger(Request& request, int block_size);

}  // namespace origami
