#pragma once
// Offline driver: submits a list of requests to an engine and steps it until all are done.
// One bad request (invalid sampling values, a prompt too long) fails alone; the rest complete.
#include <functional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace origami {

struct BatchItem {
  std::vector<int32_t> prompt_token_ids;
  SamplingParams sampling;
  RequestOptions options;  // compression policy/budget, forced tokens
  std::string error;  // pre-set when the item could not even be parsed; it is then skipped
  std::string label;  // prefixes the engine's errors about this item, e.g. "in.jsonl:3: "
};

struct BatchResult {
  bool ok = false;
  std::string error;
  std::vector<int32_t> output_token_ids;
  std::vector<float> forced_logprobs;  // with options.return_forced_logprobs
  std::vector<TokenLogprobs> logprobs;  // with options.logprobs >= 0: one per output token
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = 0;
  int num_compressions = 0;  // KV compressions of the request's final run
  double arrival_time = 0.0;  // engine clock, seconds
  double first_token_time = 0.0;
  double finish_time = 0.0;
};

// Called after every step with (finished requests, total requests).
using ProgressCallback = std::function<void(size_t done, size_t total)>;

struct BatchHooks {
  ProgressCallback progress;
  // Called once per item as soon as its result is final (items that failed before running
  // first), in completion order: callers write results as they finish, so that an interrupted
  // run keeps them.
  std::function<void(size_t index, const BatchResult& result)> on_result;
  // Polled before every step; once true, every unfinished request is aborted (its result:
  // ok = false, finish reason "aborted", error "interrupted before it finished") and run_batch
  // returns as soon as the engine has reported them.
  std::function<bool()> should_stop;
};

std::vector<BatchResult> run_batch(Engine& engine, const std::vector<BatchItem>& items, const BatchHooks& hooks);
std::vector<BatchResult> run_batch(Engine& engine, const std::vector<BatchItem>& items,
                                   const ProgressCallback& progress = nullptr);

}  // namespace origami
