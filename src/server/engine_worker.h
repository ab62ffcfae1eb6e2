#pragma once
// The engine's own thread. HTTP handlers never touch the engine: they hand a Submission over
// through a mutex-guarded queue and read the request's outputs from its RequestChannel. The
// thread applies queued submissions and aborts between steps, steps while anything is
// unfinished, routes each RequestOutput to its channel, and sleeps when idle.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "server/metrics_registry.h"
#include "server/request_channel.h"

namespace origami::server {

// One HTTP request: one engine request per choice (prompts x n).
struct Submission {
  std::vector<std::vector<int32_t>> prompts;  // per choice
  std::vector<SamplingParams> sampling;       // per choice
  RequestOptions options;
  std::shared_ptr<RequestChannel> channel;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

class EngineWorker {
 public:
  // max_waiting > 0 bounds the requests (choices) waiting for the engine; 0: unbounded.
  EngineWorker(std::unique_ptr<Engine> engine, MetricsRegistry* metrics, int max_waiting);
  ~EngineWorker();  // aborts what is left and joins the thread

  void start();
  // Queues a request; false when the waiting queue is full (the caller answers 503).
  bool submit(Submission submission);
  // The client is gone: its choices are aborted before the next step; nothing more is pushed.
  void abort(const std::shared_ptr<RequestChannel>& channel);
  void abort_all();
  // HTTP requests queued or with unfinished choices.
  int num_active() const { return num_active_.load(); }

  // Read-only engine facts that never change after creation (safe from any thread).
  const EngineConfig& config() const { return engine_->config(); }
  const ModelConfig& model_config() const { return engine_->model_config(); }
  std::shared_ptr<const Tokenizer> tokenizer() const { return engine_->tokenizer(); }

 private:
  struct Command {
    enum Kind { kSubmit, kAbort, kAbortAll } kind;
    Submission submission;
    std::shared_ptr<RequestChannel> channel;
  };
  struct Choice {
    RequestChannel* channel;
    int index;
    std::chrono::steady_clock::time_point arrival;
    double ttft = -1.0;
    int num_tokens = 0;
  };
  // A choice held back until the leader (the first choice of the same prompt) has prefilled,
  // so that it finds the prompt's blocks in the prefix cache instead of computing them again.
  struct Follower {
    int index;
    std::vector<int32_t> prompt;
    SamplingParams sampling;
  };
  struct Active {
    std::shared_ptr<RequestChannel> channel;
    std::vector<RequestId> ids;
    RequestOptions options;
    std::chrono::steady_clock::time_point arrival;
    int unfinished = 0;     // choices not finished, followers included
    bool detached = false;  // aborted or rejected: outputs are no longer delivered
  };

  void run();
  void apply(Command& command);
  void add(Submission& submission);
  void detach(RequestChannel* channel);
  // Adds one choice; false (and the channel told) when the engine refuses it.
  bool add_choice(Active& a, RequestChannel* key, int index, const std::vector<int32_t>& prompt, const SamplingParams& sp);
  // The leader prefilled (or finished): its followers are admitted, or dropped when detached.
  void release_followers(RequestId leader);
  // Shutdown: held-back choices end as aborted without running.
  void drop_all_followers();
  void route(std::vector<RequestOutput>& outputs);
  void publish_snapshot();

  std::unique_ptr<Engine> engine_;
  MetricsRegistry* metrics_;
  const int max_waiting_;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<Command> commands_;
  int queued_choices_ = 0;  // choices in queued submissions (guarded by mutex_)
  bool stopping_ = false;
  std::atomic<int> num_waiting_{0};  // engine's waiting requests after the last step
  std::atomic<int> num_active_{0};

  // Engine thread only.
  std::unordered_map<RequestChannel*, Active> active_;
  std::unordered_map<RequestId, Choice> choices_;
  std::unordered_map<RequestId, std::vector<Follower>> followers_;  // by leader
  std::thread thread_;
};

}  // namespace origami::server
