#pragma once
// Continuous batching with chunked prefill (vLLM-v1 style): every step, running requests get
// their next tokens first (decodes, then unfinished prefill chunks), then waiting requests are
// admitted FCFS while the step's token budget, the running-request limit and KV blocks allow.
// When a running request cannot get a block, the most recently admitted running request is
// preempted (its KV freed; it is recomputed later) until the block fits.
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "sched/request.h"

namespace origami {

struct SchedulerConfig {
  int max_num_seqs = 256;             // running requests at most
  int max_num_batched_tokens = 8192;  // new tokens per step at most (prefill chunks + decodes)
  bool enable_chunked_prefill = true; // false: a prompt is prefilled in one step or waits
  int max_model_len = 4096;           // prompt + output at most
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
  bool empty() const { return sequences.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KVCacheManager* kv);

  // Takes ownership-free pointer: the engine owns requests and keeps them alive until finished.
  void add_request(Request* request);
  // Plans one step and allocates the KV blocks it needs.
  SchedulerOutput schedule();
  // After the step ran: advances num_computed_tokens of every scheduled request by its
  // num_new_tokens and registers full blocks in the prefix cache. Sampled tokens are appended
  // by the engine before calling finish_request()/this.
  void on_step_done(const SchedulerOutput& output);
  // Frees a finished or aborted request's blocks and removes it from the queues.
  void finish_request(Request* request, FinishReason reason);

  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  bool has_unfinished() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerConfig& config() const { return config_; }
  // Running requests in admission order (the order preemption undoes).
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }

 private:
  SchedulerConfig config_;
  KVCacheManager* kv_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;

  // Drops the request's KV and sends it to the front of the waiting queue for recompute.
  void preempt(Request* request, SchedulerOutput* out);
  // Why the request can never be scheduled, or empty if it can.
  std::string never_fits(const Request& request, int num_entries_after) const;
  void reject(Request* request, std::string why, SchedulerOutput* out);
};

}  // namespace origami
