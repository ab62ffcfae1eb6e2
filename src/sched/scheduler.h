#pragma once
// Continuous batching with chunked prefill (vLLM-v1 style) and Zipage's hybrid scheduling for
// compressed requests. Every step, running requests get their next tokens first (decodes, then
// unfinished prefill chunks), then waiting requests are admitted FCFS while the step's token
// budget, the running-request limit and KV blocks allow.
//
// Compression (Zipage §4.3–4.4):
//  - A request that reaches its policy's trigger after a step is *pending*: it is not scheduled
//    until plan_compressions() has given it its destination blocks and the engine has run the
//    compression (complete_compression()). A request whose compression is in flight is not
//    scheduled either.
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
  // Budget reservation (TANGRAM): a request whose memory is bounded (cache-full compression)
  // is admitted only if the free blocks cover its peak and the growth still ahead of every
  // running bounded request, so bounded requests are never preempted for lack of blocks.
  // Requests without a bound (full KV) are admitted as before, but never into reserved blocks.
  bool reserve_bounded_kv = false;
};

struct ScheduledSequence {
  Request* request = nullptr;
  int num_new_tokens = 0;  // tokens to compute this step, starting at request->num_computed_tokens
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> sequences;  // running requests first, then newly admitted ones
  std::vector<Request*> preempted;           // preempted during this schedule() call
  // Requests that can never run (they need more KV blocks than the whole cache holds, or, with
  // chunked prefill off, more tokens than one step allows). They have left the queues and hold
  // no blocks; `error` says why; the caller finishes them with FinishReason::kError.
  std::vector<Request*> rejected;
  int num_batched_tokens = 0;
  int num_query_slot_waits = 0;  // running requests left out because no query slot was free
  bool empty() const { return sequences.empty(); }
};

// Compressions plan_compressions() started: each request has its destination blocks
// (compression.dst_blocks) and is marked in flight.
struct CompressionPlan {
  std::vector<Request*> requests;
  std::vector<Request*> preempted;  // to free target blocks
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KVCacheManager* kv);

  // Takes ownership-free pointer: the engine owns requests and keeps them alive until finished.
  void add_request(Request* request);
  // Plans one step and allocates the KV blocks it needs.
  SchedulerOutput schedule();
  // After the step ran: advances num_computed_tokens of every scheduled request by its
  // num_new_tokens, registers full blocks in the prefix cache, and marks requests that reached
  // their compression trigger as pending. Sampled tokens are appended by the engine.
  void on_step_done(const SchedulerOutput& output);
  // Frees a finished or aborted request's blocks and removes it from the queues. Not for a
  // request whose compression is in flight (its source pages must stay until it completes).
  void finish_request(Request* request, FinishReason reason);

  // --- Compression (see the file comment) ---
  // Starts the pending requests' compressions (in admission order): allocates target blocks for
  // shared prefix blocks (and a spare block for the next tokens), preempting uncompressed
  // requests if the pool is short, and marks them in flight.
  CompressionPlan plan_compressions();
  // The backend finished: the request switches to its destination table holding num_keep
  // entries, releases the dropped blocks and, if its next window is not due yet, its slot.
  void complete_compression(Request* request);
  // The backend failed: undoes plan_compressions() for the request (the caller finishes it).
  void abort_compression(Request* request);
  // Nothing could be scheduled and nothing is in flight: preempts the last running request that
  // may be preempted (uncompressed first) so that the rest can move. False if none can.
  bool preempt_to_make_progress(std::vector<Request*>* preempted);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerConfig& config() const { return config_; }
  // Running requests in admission order (the order preemption undoes).
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const QuerySlotPool& query_slots() const { return slots_; }

 private:
  SchedulerConfig config_;
  KVCacheManager* kv_;
  QuerySlotPool slots_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;

  // Drops the request's KV and slot, sends it to the front of the waiting queue for recompute,
  // and takes it out of `out` if it was already scheduled this step (refunding its tokens).
  // `out` may be null (preemption outside schedule()).
  void preempt(Request* request, SchedulerOutput* out, int* budget);
  // Who gives blocks back when `request` cannot get them (see the file comment); nullptr: wait.
  Request* pick_victim(bool prefer_slotless_only) const;
  // Tries to give a pending request its destination blocks; false if the pool is short.
  bool try_start_compression(Request* request);
  void release_slot(Request* request);
  // Why the request can never be scheduled, or empty if it can.
  std::string never_fits(const Request& request, int num_entries_after) const;
  // Blocks a bounded request holds at most until it finishes (its N_max, or its prompt's blocks
  // while a longer prompt is prefilled, or fewer if it finishes sooner, plus the fresh target
  // blocks of its first compression); -1 if unbounded.
  int peak_blocks(const Request& request) const;
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
