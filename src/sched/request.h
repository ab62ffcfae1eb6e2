#pragma once
// A request's life: WAITING -> RUNNING -> FINISHED, with RUNNING -> WAITING on preemption
// (its KV is dropped and recomputed later). Positions are logical: `num_computed_tokens` counts
// tokens whose KV has been produced, whatever the cache keeps of them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/block_table.h"
#include "kv/kv_sequence.h"
#include "policy/kv_policy.h"
#include "sampling/logit_adjustments.h"
#include "sampling/sampling_params.h"

namespace origami {

using RequestId = uint64_t;

enum class RequestStatus { kWaiting, kRunning, kPreempted, kFinished };
enum class FinishReason { kNone, kLength, kStop, kEos, kAborted, kError };
const char* finish_reason_name(FinishReason reason);

// One head group's part of a compaction (grouped layouts, kv/kv_layout.h). Group 0's tables are
// RequestCompression's src_blocks / dst_blocks / next_table; the tables here serve groups >= 1.
struct GroupCompaction {
  bool compress = false;       // the group holds more entries than its num_keep (else left as is)
  int num_keep = 0;            // ceil(budget ratio x the policy's num_keep)
  int num_scored_entries = 0;  // leading entries whose global score is valid
  int src_entries = 0;
  int src_scored_entries = 0;
  std::vector<BlockId> src_blocks;
  std::vector<BlockId> dst_blocks;
  std::vector<BlockId> next_table;
};

// A request's KV compression: its policy and budget, resolved once at admission, and where it
// stands (query slot, compressions done, a compression in flight).
struct RequestCompression {
  std::shared_ptr<const KVPolicy> policy;  // nullptr or a kNever policy: full KV
  CompressionTrigger trigger = CompressionTrigger::kNever;
  int budget = 0;      // tokens of KV after a compression
  int max_blocks = 0;  // N_max (kCacheFull): blocks held at most while decoding
  int num_keep = 0;    // entries kept per (layer, KV head) by a compression
  int window = 0;      // query window w (0: the policy needs no queries)
  // Prefill chunk compression: entries above which a prefill chunk's end compresses the request
  // (KVPolicy::prefill_chunk_threshold); -1: the prompt is compressed by the policy's own trigger.
  int chunk_threshold = -1;

  int query_slot = -1;        // held query slot, or -1
  int num_compressions = 0;   // since admission (reset by preemption: the KV is recomputed)
  int num_scored_entries = 0; // leading entries whose global score is valid
  bool prefill_checked = false;  // kPrefillEnd: the end-of-prefill decision was taken
  int tail_from = 0;             // entries [tail_from, ...) were never compressed (TriggerState)
  bool pending = false;          // reached its trigger; waits (unscheduled) until compressed
  // What the pending compression does: compact, or drop one whole block (PagedEviction's decode).
  CompressionKind pending_kind = CompressionKind::kCompact;
  // The pending compression ends a prefill chunk before the prompt's end (the chunk rule): it is
  // scored by the policy's chunk_score_recipe().
  bool pending_chunk = false;
  bool in_flight = false;        // a compression of this request is running in the backend
  // Switched to its compacted table when the compression started, ahead of a backend that
  // compacts before the step's forward pass (SchedulerConfig::compress_before_forward); the
  // backend has not reported it yet. It computes in that same step but is never preempted then.
  bool switched_early = false;
  // The compression in flight: the table it reads (a copy of the request's table when it
  // started, and its entries), where its kept entries go, and the table it leaves (dst blocks,
  // plus for kCacheFull a spare block for the next tokens). Alive until it is reported.
  std::vector<BlockId> src_blocks;
  int src_entries = 0;
  int src_scored_entries = 0;     // num_scored_entries when it started
  int src_query_slot = -1;        // the slot holding its window's queries
  bool src_first_compression = true;
  bool src_chunk = false;  // pending_chunk when it started
  std::vector<BlockId> dst_blocks;
  std::vector<BlockId> next_table;
  CompressionKind src_kind = CompressionKind::kCompact;
  // kEvictBlock: a fresh block taken when the eviction started, because some candidate block is
  // shared (dropping it frees nothing, yet the request needs a block for its next tokens); given
  // back if an own block is evicted (that one is reused). kNullBlock when none was needed.
  BlockId fresh_spare = kNullBlock;
  // Head groups: each group's share of the budget (group g keeps ceil(group_ratios[g] x num_keep)
  // entries per head); empty or all 1.0 = uniform (the one-group numbers).
  std::vector<float> group_ratios;
  // Head groups: one entry per group of a grouped layout (empty in the one-group layout, where the
  // fields above are group 0's and its num_keep is num_keep).
  std::vector<GroupCompaction> groups;
  // Budget reservation: the blocks each head group was reserved at admission
  // (Scheduler::group_peak_blocks; empty when the request's peak is not reserved). Its tables
  // never hold more.
  std::vector<int> reserved_blocks;
  // Runtime allocation (ScoreRecipe::allocation kLayer / kGlobal): the entries each head group
  // kept at the compression in flight, as the backend reports them (-1: not yet reported).
  std::vector<int> kept_by_group;
  // Runtime allocation: the entries the cache held per (layer, KV head) on average
  // (num_cache_entries) right after its last compression; a cache-full trigger compresses again
  // one block later at the earliest (compression_state.h, trigger_state).
  int entries_after_compression = 0;
  // Pages its head groups held right after its last compaction switched its tables (before any new
  // token: SchedulerUpdate::num_kept_pages).
  int kept_pages = 0;
  int jobs_in_flight = 0;  // the compression's per-group jobs not yet reported
  bool job_failed = false;  // one of them failed

  // Preemption drops the KV: the request starts over uncompressed (its slot is released by the
  // scheduler first; a request in flight is never preempted).
  void reset_progress() {
    num_compressions = 0;
    num_scored_entries = 0;
    for (GroupCompaction& g : groups) g = GroupCompaction{};
    prefill_checked = false;
    tail_from = 0;
    entries_after_compression = 0;
    kept_by_group.clear();
    pending = false;
    pending_kind = CompressionKind::kCompact;
    src_blocks.clear();
    dst_blocks.clear();
    next_table.clear();
  }

  bool enabled() const { return trigger != CompressionTrigger::kNever; }
  bool compressed() const { return num_compressions > 0; }
  // The backend decides how many entries each head group keeps (ScoreRecipe::allocation).
  bool runtime_allocated() const { return policy != nullptr && runtime_allocation(policy->score_recipe()); }
  // Compressed under a bounded policy: its memory never grows again, so it is never preempted.
  // Not under a runtime allocation: its groups' lengths change at every compression, and it takes
  // blocks as it decodes (its reservation counts them, Scheduler::peak_blocks).
  bool bounded() const { return compressed() && trigger == CompressionTrigger::kCacheFull && !runtime_allocated(); }
};

// Tokens, pages and prefix-cache hits come from KVSequence (what the KV manager sees).
struct Request : KVSequence {
  RequestId id = 0;
  SamplingParams sampling;
  uint64_t seed = 0;  // resolved seed (sampling.seed or drawn by the engine)
  // Penalties, logit_bias and the min_tokens mask, kept up to date with the output.
  LogitAdjustments logit_adjustments;

  RequestStatus status = RequestStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  std::string error;  // set with kError

  int num_computed_tokens = 0;  // tokens whose KV is in the cache (logical count)
  // With a pending token (KVSequence::num_pending_tokens): the sequence of the launched step that
  // samples it, which the next step's batch names (PendingToken::previous_sequence).
  int pending_sequence = -1;
  int num_preemptions = 0;
  double arrival_time = 0.0;      // seconds, engine clock
  double first_token_time = -1.0;
  double finish_time = -1.0;

  RequestCompression compression;
  // Continue a retained context whose history begins this request's tokens (when the KV manager
  // keeps them: KVCacheManager::enable_retained_contexts).
  bool use_retained_contexts = true;

  bool is_finished() const { return status == RequestStatus::kFinished; }
  // Every token it may generate is sampled (a pending one included): it stops at its length limit
  // once that token is known, and is not scheduled meanwhile (asynchronous scheduling).
  bool sampled_all(int max_model_len) const {
    return num_pending_tokens > 0 && (static_cast<int>(output_token_ids.size()) + num_pending_tokens >= sampling.max_tokens ||
                                      num_tokens() >= max_model_len);
  }
  bool is_prefilling() const { return num_computed_tokens < num_tokens() - 1; }
  // Its memory never grows again: compressed under a bounded policy and done with its prompt (a
  // prompt compressed chunk by chunk still grows by a chunk before each compression).
  bool memory_bounded() const { return compression.bounded() && !is_prefilling(); }
};

}  // namespace origami
