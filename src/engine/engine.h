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
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "engine/engine_metrics.h"
#include "engine/policy_resolver.h"
#include "engine/request_options.h"
#include "engine/request_output.h"
#include "engine/step_pipeline.h"
#include "kv/kv_cache_manager.h"
#include "model/config.h"
#include "sched/scheduler.h"
#include "tokenizer/streaming_decoder.h"
#include "tokenizer/tokenizer.h"

namespace origami {

class Engine {
 public:
  static Expected<std::unique_ptr<Engine>> create(const EngineConfig& config);
  // The same on a backend the caller built (not yet loaded); config.device still picks the KV
  // storage dtype (cpu: f32, else bf16).
  static Expected<std::unique_ptr<Engine>> create(const EngineConfig& config, std::unique_ptr<Backend> backend);
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
  // What the engine set up for compression (query slots, window, global scores).
  const CompressionSupport& compression_support() const { return compression_support_; }
  // The backend, for tests that inspect its KV storage.
  Backend& backend() { return *backend_; }
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  // KV blocks requests hold now (pages only retained contexts hold are not counted: they are
  // given back on demand; retained_stats().num_pages counts them); the server's metrics.
  int num_kv_blocks_used() const;
  // Prompt tokens looked up in / served by the prefix cache so far.
  const PrefixCacheStats& prefix_cache_stats() const { return kv_->prefix_cache_stats(); }
  // Retained contexts now and so far (counters also in metrics(), updated every step).
  const RetainedContextStats& retained_stats() const { return kv_->retained_stats(); }
  // Releases every retained context (e.g. between benchmark runs).
  void release_retained_contexts() { kv_->release_all_retained(); }
  double now() const;  // seconds since the engine started

 private:
  Engine() = default;
  struct Tracked;  // a request with its decoder and text state
  void finish(Tracked& tracked, FinishReason reason, std::vector<RequestOutput>* outputs, const std::string& error = "");
  void append_token(Tracked& tracked, int32_t token, bool forced, RequestOutput* output);
  // Finishes aborted requests, except those being compressed (they wait for it).
  void process_aborts(std::vector<RequestOutput>* outputs);
  // Finishes retain-only requests whose prompt KV is final (computed, and compressed if due).
  void finish_retained_prompts(std::vector<RequestOutput>* outputs);
  void update_retained_metrics();
  // Asks the scheduler for the step's plan and finishes the requests it rejected.
  SchedulerOutput schedule_step(std::vector<RequestOutput>* outputs);

  // --- The steps launched (engine/step_pipeline.h) ---
  // What the engine keeps of a launched step until its tokens are known: its requests by id (a
  // request may finish and be released meanwhile) and whether each sequence samples.
  struct LaunchedStep {
    std::vector<RequestId> request_ids;
    std::vector<bool> samples;
  };
  // A token sampled for a request while its compression was in flight (asynchronous scheduling:
  // the compression started after the step that sampled it): taken once the compression is done,
  // since a token that ends the request cannot free pages the compression reads.
  struct HeldToken {
    RequestId id = 0;
    int32_t token = 0;
    float token_logprob = 0.0f;
    std::optional<TokenLogprobs> logprobs;  // none where the step returned none
  };
  // Whether this step may be launched before the last one's tokens are known.
  bool pipelining_allowed() const { return config_.async_scheduling && num_tracked_needing_tokens_ == 0; }
  // Launches the planned step: the batch, its page copies, the pipeline. A step with prompt tokens
  // first finishes the one in flight (its tokens go to `outputs`).
  Status launch_step(const SchedulerOutput& plan, LaunchedStep* launched, ForwardBatch* batch,
                     std::vector<RequestOutput>* outputs);
  // Waits for the step in flight (in_flight_; none: nothing to do) and takes its tokens.
  void finish_in_flight_step(std::vector<RequestOutput>* outputs);
  // The step's compressions reported so far join those the next scheduler update applies.
  void take_compressions(StepOutput* out);
  // Sequence i's sampled token of a finished step's `result`, for request `id` (take_token).
  void take_sampled(RequestId id, StepOutput& result, size_t i, std::vector<RequestOutput>* outputs);
  // A sampled token, for its request if it still runs: appended, streamed, and the request
  // finished if the token ends it.
  void take_token(RequestId id, int32_t token, float token_logprob, TokenLogprobs* logprobs,
                  std::vector<RequestOutput>* outputs);
  // Held tokens whose request's compression is done.
  void take_held_tokens(std::vector<RequestOutput>* outputs);
  // The metrics of a finished step's output.
  void record_step_metrics(const StepOutput& out);

  EngineConfig config_;
  ModelConfig model_config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int32_t> reconstruction_prompt_;  // KVzip's repeat prompt (policy/kvzip_prompt.h)
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KVCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, std::unique_ptr<Tracked>> requests_;
  int num_tracked_wanting_logprobs_ = 0;  // entries of requests_ whose wants_logprobs()
  // Unfinished requests whose next step needs their last token on the host (Tracked::needs_known_tokens).
  int num_tracked_needing_tokens_ = 0;
  std::unique_ptr<StepPipeline> pipeline_;
  std::optional<LaunchedStep> in_flight_;  // launched, its tokens not yet taken (asynchronous scheduling)
  std::vector<CompressionResult> reported_compressions_;  // for the next scheduler update
  std::vector<HeldToken> held_tokens_;
  CompressionSupport compression_support_;
  // A request's own head budgets (RequestOptions::kv_head_budgets, already read and validated)
  // checked against the model, as shares of the engine's fixed head groups (layout_group_shares).
  Expected<std::vector<float>> request_group_shares(const HeadBudgets& budgets, const std::string& source) const;
  std::vector<RequestId> pending_aborts_;
  std::vector<RequestId> retain_only_waiting_;  // retain-only requests whose prompt is computed
  RequestId next_request_id_ = 1;
  uint64_t seed_counter_ = 0;
  EngineMetrics metrics_;
  std::chrono::steady_clock::time_point start_time_;
};

}  // namespace origami
