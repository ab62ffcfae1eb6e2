#pragma once
// Turns the scheduler's plan for a step into the backend's ForwardBatch: the flat tokens and
// logical positions of every scheduled sequence, its page table, where its window queries are
// captured, what is sampled, and one CompressionJob per compression the step starts.
#include <functional>

#include "backend/forward_batch.h"
#include "sched/scheduler.h"

namespace origami {

struct ForwardBatchOptions {
  int block_size = 16;
  // The backend finishes the step's compressions before the forward pass
  // (SchedulerConfig::compress_before_forward).
  bool synchronous_compression = false;
  // The token whose log-probability the backend returns with the sampled row (teacher forcing),
  // or -1; asked only for sequences that sample.
  std::function<int32_t(const Request&)> logprob_token;
  // How many top log-probabilities the sampled row returns with its token's (-1: none).
  std::function<int(const Request&)> num_top_logprobs;
  // KVzip's repeat prompt and suffix, tokenized (policy/kvzip_prompt.h): jobs whose recipe has
  // reconstruction_scores get it followed by the request's tokens as reconstruction_tokens.
  const std::vector<int32_t>* reconstruction_prompt = nullptr;
};

ForwardBatch build_forward_batch(const SchedulerOutput& plan, const ForwardBatchOptions& options);

// The backend's view of one request's compression (Scheduler::schedule() planned it). Its tables
// point into the request, which leaves them untouched until the compression finishes.
// Group 0's job (the one-group layout's only job).
CompressionJob compression_job(const Request& request);
// One job per head group the compression compacts (a group within its budget has none),
// appended to `jobs` (a step's batch takes every compression's jobs in one vector).
void append_compression_jobs(const Request& request, std::vector<CompressionJob>* jobs);

}  // namespace origami
