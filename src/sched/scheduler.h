#pragma once
// Continuous batching with chunked prefill (vLLM-v1 style) and Zipage's hybrid scheduling for
// compressed requests. Every step, running requests get their next tokens first (decodes, then
// unfinished prefill chunks), then waiting requests are admitted FCFS while the step's token
// budget, the running-request limit and KV blocks allow.
//
// Compression (Zipage §4.3–4.4):
//  - A request that reaches its policy's trigger after a step is *pending*: it is not scheduled
//    until a schedule() has given it its destination blocks and listed it among the step's
//    compressions, and update_from_output() has heard from the backend that the compression
//    finished. A request whose compression is in flight is not scheduled.
//  - Query slots: a request needs one of the M slots before it computes a token whose query
//    belongs to its next compression's window (query_capture_from). Without one it computes up to
//    the window and then waits; slots go to running requests in admission order (the earliest
//    one that needs a slot gets the next free one) and are released when a compression leaves
//    the request with no window to capture, or when it finishes or is preempted.
//  - Out of blocks: preempt the last running request without a slot; when none is left, the
//    request waits (constrained scheduling) — unless prefix caching is on, where the last
//    uncompressed request is preempted instead (Zipage §4.4: waiting could deadlock there).
//    Requests compressed under a bounded policy (cache-full trigger) are never preempted: their
//    memory never grows again. Requests in flight are never preempted.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/check.h"
#include "kv/compression.h"
#include "kv/kv_cache_manager.h"
#include "sched/query_slot_pool.h"
#include "sched/request.h"

namespace origami {

struct SchedulerConfig {
  int max_num_seqs = 256;             // running requests at most
  int max_num_batched_tokens = 8192;  // new tokens per step at most (prefill chunks + decodes)
  bool enable_chunked_prefill = true; // false: a prompt is prefilled in one step or waits
  int max_model_len = 4096;           // prompt + output at most
  int num_query_slots = 0;            // M: query slots of the backend's query cache
  // Budget reservation (TANGRAM §4.1): a request whose peak is known (cache-full compression, or
  // prefill-end compression chunk by chunk) is admitted only if the free blocks cover its peak,
  // every head group at its own budget, and the growth still ahead of every running reserved
  // request, so reserved requests are never preempted for lack of blocks.
  // Requests without a bound (full KV) are admitted as before, but never into reserved blocks.
  bool reserve_bounded_kv = false;
  // Guaranteed no preemption for requests without a compression bound (full KV): such a request
  // is admitted only when the free blocks cover its prompt + max_tokens (every head group) after
  // the growth still ahead of the running reserved requests, as TensorRT-LLM's
  // GUARANTEED_NO_EVICT does. Off (vLLM's way): admitted on its prompt's blocks and preempted
  // (recomputed) when the cache runs out, which keeps more requests running on short outputs
  // and recomputes a whole prompt + outputs for each preemption on long ones.
  bool reserve_full_kv = false;
  // The backend finishes a step's compressions before that step's forward pass (synchronous
  // compression, or a compressor that runs inside begin(), as on the CPU): a request compressed
  // in a step switches to its compacted table at once and computes in that same step.
  bool compress_before_forward = false;
};

struct ScheduledSequence {
  Request* request = nullptr;
  int num_new_tokens = 0;  // tokens to compute this step, starting at request->num_computed_tokens
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> sequences;  // running requests first, then newly admitted ones
  // Compressions to start this step (in admission order): each request holds its destination
  // blocks (compression.dst_blocks) and is in flight until update_from_output() hears it finished.
  std::vector<Request*> compressions;
  // Nothing can run until the compressions in flight finish: the step only waits for them.
  bool wait_for_compressions = false;
  std::vector<Request*> preempted;  // preempted during this schedule() call
  // Pages to copy before the step runs (continuations of retained contexts: their partly filled
  // last pages; the backend's copy_block), in order.
  std::vector<BlockCopy> block_copies;
  // Requests that can never run (they need more KV blocks than the whole cache holds, or, with
  // chunked prefill off, more tokens than one step allows). They have left the queues and hold
  // no blocks; `error` says why; the caller finishes them with FinishReason::kError.
  std::vector<Request*> rejected;
  int num_batched_tokens = 0;
  int num_query_slot_waits = 0;  // running requests left out because no query slot was free
  // Nothing for the backend to do.
  bool empty() const { return sequences.empty() && compressions.empty() && !wait_for_compressions; }
};

// What update_from_output() did with the compressions that finished.
struct SchedulerUpdate {
  std::vector<Request*> failed_compressions;  // undone; the caller finishes them with an error
  int64_t num_compressions = 0;               // completed
  int64_t num_evicted_entries = 0;            // entries dropped per (layer, KV head), summed
  // Pages the compacted requests hold right after their compressions switched their tables (every
  // head group, before any new token; a cache-full request's spare block included), summed:
  // what a compression really keeps, group padding and page rounding included (a runtime
  // allocation's share is known only once the backend reports it).
  int64_t num_kept_pages = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KVCacheManager* kv);

  // Takes ownership-free pointer: the engine owns requests and keeps them alive until finished.
  void add_request(Request* request);
  // Plans one step: starts the pending requests' compressions (when none is in flight), then
  // schedules running and waiting requests and allocates the KV blocks they need. When nothing
  // can run, it waits for the compressions in flight or, with none, preempts until something can.
  SchedulerOutput schedule();
  // After the backend ran the step: advances num_computed_tokens of every scheduled request by its
  // num_new_tokens, registers full blocks in the prefix cache, marks requests that reached their
  // compression trigger as pending, and applies the finished compressions (the request switches
  // to its compacted table and releases the dropped blocks; a failed one is undone). Sampled
  // tokens are appended by the engine.
  SchedulerUpdate update_from_output(const SchedulerOutput& output, const std::vector<CompressionResult>& finished);
  // Frees a finished or aborted request's blocks and removes it from the queues. Not for a
  // request whose compression is in flight (its source pages must stay until it completes).
  // With `retain`, a running request's KV stays as a retained context standing for its computed
  // tokens (KVCacheManager::retain; nothing happens when retained contexts are off).
  void finish_request(Request* request, FinishReason reason, bool retain = false);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerConfig& config() const { return config_; }
  // Tests switch between synchronous and deferred compression; only while none is in flight.
  void set_compress_before_forward(bool on) {
    ORIGAMI_CHECK(compressing_.empty());
    config_.compress_before_forward = on;
  }
  // Running requests in admission order (the order preemption undoes).
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const QuerySlotPool& query_slots() const { return slots_; }
  // Requests whose compression is in flight, in the order they started.
  const std::vector<Request*>& compressing() const { return compressing_; }

 private:
  SchedulerConfig config_;
  KVCacheManager* kv_;
  QuerySlotPool slots_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  std::vector<Request*> compressing_;
  // Steps that computed tokens so far (TriggerState::step, for periodic triggers).
  long long num_steps_ = 0;
  // advance(): requests found due in the step, per policy name (kept to spare an allocation a step).
  std::vector<std::pair<const std::string*, int>> due_per_policy_;

  // One scheduling pass over running and waiting requests (the body of schedule()).
  void schedule_requests(SchedulerOutput* out);
  // Gives pending requests their destination blocks (Zipage Figure 3), preempting uncompressed
  // requests if the pool is short of fresh targets, and marks them in flight.
  void start_compressions(SchedulerOutput* out);
  // The request switches to its destination table holding num_keep entries; the blocks it drops
  // are added to `dropped` (the caller releases them); its slot goes if its next window is not due.
  void switch_to_compacted_table(Request* request, std::vector<BlockId>* dropped);
  // A pending block eviction: the request's table is read as is (nothing moves); a fresh block is
  // taken when a candidate block is shared. False if that block cannot be had.
  bool try_start_block_eviction(Request* request);
  // The request drops block `evicted` (a table index, neither first nor last) and appends the
  // block for its next tokens: the evicted one if it was its own, else the fresh spare. Blocks to
  // release are added to `dropped`.
  void switch_to_evicted_table(Request* request, int evicted, std::vector<BlockId>* dropped);
  // The backend finished: switches the request (unless it switched early) and forgets the job.
  // `evicted_block`: the block a block eviction chose (CompressionResult::evicted_block).
  void complete_compression(Request* request, int evicted_block);
  // The backend failed: undoes start_compressions() for the request (the caller finishes it).
  void abort_compression(Request* request);
  // Nothing could be scheduled and nothing is in flight: preempts the last running request that
  // may be preempted (uncompressed first) so that the rest can move. False if none can.
  bool preempt_to_make_progress(std::vector<Request*>* preempted);
  // Advances the scheduled requests by their computed tokens and marks compression triggers.
  void advance(const SchedulerOutput& output);

  // Drops the request's KV and slot, sends it to the front of the waiting queue for recompute,
  // and takes it out of `out` if it was already scheduled this step (refunding its tokens).
  // `out` may be null (preemption outside schedule()).
  void preempt(Request* request, SchedulerOutput* out, int* budget);
  // Who gives blocks back when `request` cannot get them (see the file comment); nullptr: wait.
  Request* pick_victim(bool prefer_slotless_only) const;
  // On admission: continues the longest retained context the request's tokens begin with (its
  // pages, its policy state under the same policy key), unless the window of a compression ahead
  // reaches into the context (those queries were never captured). The tokens served, or 0.
  int continue_retained_context(Request* request, SchedulerOutput* out);
  // Tries to give a pending request its destination blocks; false if the pool is short.
  bool try_start_compression(Request* request);
  void release_slot(Request* request);
  // Why the request can never be scheduled, or empty if it can.
  std::string never_fits(const Request& request, int num_entries_after) const;
  // Blocks a request with a known peak holds at most until it finishes, summed over its head
  // groups (group_peak_blocks), plus the fresh target blocks of its first compression; -1 if
  // its memory has no bound the scheduler can know (full KV, SnapKV without chunk compression).
  int peak_blocks(const Request& request) const;
  // peak_blocks() of a request under a runtime allocation (RequestCompression::runtime_allocated),
  // without fresh targets: a bound on its groups' pages together, since how the total is shared
  // among its groups is decided by the backend at each compression (docs/policies.md, "Scheduling").
  int joint_peak_blocks(const Request& request) const;
  // One head group's share of peak_blocks() without fresh targets: cache-full, N_max (or the
  // prompt's blocks while a longer prompt is prefilled, or fewer if it finishes sooner), and once
  // compressed the group's own blocks; prefill-end compressed chunk by chunk (TANGRAM), the
  // group's own keep plus one chunk while prefilling, then (once the end-of-prefill decision is
  // behind it) its keep plus the outputs. -1 if unbounded.
  int group_peak_blocks(const Request& request, int group) const;
  // Lowers the request's recorded reservation to its peak from now on: a prompt compressed chunk
  // by chunk needs its chunk's room only while the prompt is prefilled, and keeping that room
  // reserved through decoding would cap the requests running at once for nothing.
  void shrink_reservation(Request* request) const;
  // Fresh target blocks the request's next compression takes: one per block among its first
  // N_max that another request shares (compaction never writes a shared block, Figure 3).
  int fresh_targets_ahead(const Request& request) const;
  // Blocks of a request being admitted (its prefix-cache hits) that exactly one other request
  // holds: that holder needs a fresh target for each at its next compression.
  int newly_shared_blocks(const Request& request) const;
  // Blocks the running bounded requests will still take before reaching their peaks.
  int reserved_growth() const;
  void reject(Request* request, std::string why, SchedulerOutput* out);
};

}  // namespace origami
