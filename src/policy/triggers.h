#pragma once
// Triggers: when a request's cache is compressed, decided by its policy
// (KVPolicy::compression_due / capture_from) from a TriggerState, plain counts that
// sched/compression_state.cpp builds from the Request, so policies never reach into the
// scheduler. Counts are KV entries, not logical tokens: a compressed request holds fewer entries
// than its positions. The built-in triggers (CompressionTrigger) are the functions below; a policy
// with another trigger overrides the two KVPolicy methods.
namespace origami {

struct TriggerState {
  int entries = 0;                // entries the cache holds (before the tokens about to be computed)
  int entries_after_known = 0;    // entries once every known token is computed (end of the current
                                  // prefill, or the entry the next decode step writes)
  bool tokens_pending = false;    // known tokens are still to be computed (prefilling, or the
                                  // newest sampled token not yet written)
  int budget = 0;                 // tokens of KV after a compression
  int max_blocks = 0;             // N_max: blocks held at most while decoding (cache-full triggers)
  int block_size = 0;
  int window = 0;                 // query window w (0: the policy needs no queries)
  bool prefill_checked = false;   // the one-off end-of-prefill decision was taken
  // Where the uncompressed tail starts: entries [tail_from, entries) were never compressed (the
  // protected tail a compression kept verbatim, then the newer entries); 0 before any compression.
  int tail_from = 0;
  // Across requests (periodic triggers): the scheduler's step counter (steps that computed tokens,
  // this one included), and how many requests under a policy of the same name this step already
  // found due (a per-step cap).
  long long step = 0;
  int due_this_step = 0;
  // Prefill chunk compression (a policy's prefill_chunk_compression option): the entry count above
  // which the end of a prefill chunk compresses the request (KVPolicy::prefill_chunk_threshold);
  // -1: off.
  int chunk_threshold = -1;
  // Entries once the chunk being scheduled is computed; -1 when not known (between steps: then
  // the shortest chunk, one token, is assumed).
  int chunk_end = -1;
  // Entries before it came from the prefix cache: no query of theirs was ever captured (0 once
  // the request has been compressed).
  int computed_from = 0;
};

// A policy's answer after a step.
struct TriggerDecision {
  bool compress = false;          // compress the request now
  bool prefill_checked = false;   // the one-off end-of-prefill decision is taken (never asked again)
  // With compress: drop one whole block instead of compacting (CompressionKind::kEvictBlock).
  bool evict_block = false;
  // Entries this compression keeps per (layer, KV head), for triggers whose compressions keep a
  // count of their own (a sliding window); -1: the request's budget decides (RequestCompression).
  int num_keep = -1;
};

// kCacheFull (Zipage): due once all known tokens are computed and the cache holds N_max full blocks
// (N_max * b entries); it is then compressed to k = (N_max - 1) * b entries per (layer, KV head).
TriggerDecision cache_full_due(const TriggerState& state);
// Queries from E - w on, E = max(N_max * b, entries_after_known): the last w entries of block
// N_max (Zipage's "b - w tokens in the last block"), or of a prompt that overshoots N_max blocks
// (it compresses right after its prefill). -1 without a window.
int cache_full_capture_from(const TriggerState& state);

// kPrefillEnd (SnapKV): decided once, when all known tokens are computed (the prompt is
// prefilled): due if the cache holds more entries than the budget.
TriggerDecision prefill_end_due(const TriggerState& state);
// Queries from E - w on, E = entries_after_known, while the decision is still to come and the
// prompt is longer than the budget; else -1 (and -1 without a window).
int prefill_end_capture_from(const TriggerState& state);

// PagedEviction: once all known tokens are computed, at the end of a prefill (decided once) a cache
// holding more than k = (N_max - 1) * b entries is compacted token-wise to k; afterwards, a cache
// holding exactly N_max full blocks drops one whole block (evict_block), leaving k entries; one
// holding more (a retained context's next prompt) is compacted token-wise to k. Either way the
// request holds at most N_max blocks while it decodes.
TriggerDecision paged_eviction_due(const TriggerState& state);

// kPeriodic (KvLLM): every `period` steps (step % period == 0), due if all known tokens are
// computed, the uncompressed tail holds at least `window` entries and fewer than `max_per_step`
// requests of the policy were found due this step. The policy sets the count kept.
TriggerDecision periodic_due(const TriggerState& state, int period, int max_per_step);
// Queries from max(tail_from, entries_after_known - window) on: the window of a periodic
// compression is the trailing `window` entries, all within the uncompressed tail, and it comes
// no earlier than once the known tokens are computed. -1 without a window.
int periodic_capture_from(const TriggerState& state);

// Prefill chunk compression (TANGRAM Fig. 6a, Fast KVzip, KeyDiff's block-wise prompt): while a
// prompt is still being prefilled (tokens pending) and chunk_threshold >= 0, the end of each chunk
// that leaves more than chunk_threshold entries compresses the request to its budget, so that it
// never holds more than the threshold plus one chunk. The prompt's last chunk and everything
// after are decided by the policy's own trigger (the scheduler asks prefill_chunk_due only while
// prefill_chunk_applies). A compression also needs its window of queries captured: the window's
// entries must not be prefix-cache hits.
bool prefill_chunk_applies(const TriggerState& state);
TriggerDecision prefill_chunk_due(const TriggerState& state);
// The window of a chunk compression is the chunk's last `window` entries (earlier ones when the
// chunk is shorter: the previous chunk captured its own last `window`): queries from
// chunk_end - window on, for a chunk that is not the prompt's last and ends above
// chunk_threshold - window while a compression is still ahead in the prompt; else
// `policy_capture_from`, the policy's own rule.
int prefill_chunk_capture_from(const TriggerState& state, int policy_capture_from);

}  // namespace origami
