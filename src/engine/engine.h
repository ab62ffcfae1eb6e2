#pragma once
// The library API: one engine owns a model on a backend, its KV cache and its scheduler, and
// advances every request by one token per step (continuous batching).
//
//   auto engine = Engine::create(config);            // Expected<std::unique_ptr<Engine>>
//   auto id = engine->add_request(prompt_ids, params); // Expected<RequestId>
//   while (engine->has_unfinished()) for (auto& out : engine->step()) ...
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "engine/engine_metrics.h"
#include "engine/request_output.h"
#include "kv/kv_cache_manager.h"
#include "model/config.h"
#include "sched/scheduler.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace origami {

// Per-request options beyond sampling.
struct RequestOptions {
  // Compression policy and budget of this request; empty / 0 = the engine's defaults.
  std::string kv_policy;
  int kv_budget = 0;
  std::map<std::string, std::string> kv_policy_options;
  // Teacher forcing: the first outputs are these tokens instead of sampled ones, one per decode
  // step, so decode-time compression runs through them (stream-mode evaluation, perplexity).
  // Stop conditions do not apply to forced tokens; max_tokens counts them.
  std::vector<int32_t> forced_output_tokens;
  bool return_forced_logprobs = false;  // report log p(forced token) in RequestOutput
};

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(const EngineConfig& config);
  ~Engine();

  // Validates and queues a request. Errors (bad sampling values, empty or too-long prompt,
  // out-of-vocabulary ids) name the field at fault and leave the engine untouched.
  Expected<RequestId> add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params);
  // The same with a compression policy/budget or forced tokens (unknown policy names and invalid
  // options are errors that name them).
  Expected<RequestId> add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params,
                                  const RequestOptions& options);
  // Stops a request; its blocks are freed and it reports finish reason "aborted" next step.
  void abort_request(RequestId id);

  // Runs one step: schedules, executes the model, samples, and reports what changed.
  std::vector<RequestOutput> step();
  bool has_unfinished() const;

  // A finished or running request (nullptr once forgotten by release_request()).
  const Request* request(RequestId id) const;
  // Forgets a finished request, freeing its bookkeeping.
  void release_request(RequestId id);

  const ModelConfig& model_config() const { return model_config_; }
  const EngineConfig& config() const { return config_; }
  std::shared_ptr<const Tokenizer> tokenizer() const { return tokenizer_; }
  const EngineMetrics& metrics() const { return metrics_; }
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  double now() const;  // seconds since the engine started

 private:
  Engine() = default;
  struct Tracked;  // a request with its decoder and text state
  void finish(Tracked& tracked, FinishReason reason, std::vector<RequestOutput>* outputs, const std::string& error = "");
  void append_token(Tracked& tracked, int32_t token, RequestOutput* output);

  EngineConfig config_;
  ModelConfig model_config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KVCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, std::unique_ptr<Tracked>> requests_;
  std::vector<RequestId> pending_aborts_;
  RequestId next_request_id_ = 1;
  uint64_t seed_counter_ = 0;
  EngineMetrics metrics_;
  std::chrono::steady_clock::time_point start_time_;
};

}  // namespace origami
