#pragma once
// The server's Prometheus metrics (GET /metrics), named as vLLM names them with an `origami:`
// prefix. The engine thread records into it after each step; HTTP threads render it. Every
// access takes one mutex: updates are a few per step, renders are rare.
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine_metrics.h"

namespace origami::server {

// A cumulative Prometheus histogram with fixed upper bounds.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name` with the `labels` (`key="value"` list).
  void render(const std::string& name, const std::string& labels, std::string* out) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket (not cumulative); the last one is +Inf
  double sum_ = 0.0;
  int64_t count_ = 0;
};

// The engine-side state after a step.
struct EngineSnapshot {
  EngineMetrics metrics;
  int num_running = 0;
  int num_waiting = 0;
  int kv_blocks_used = 0;
  int kv_blocks_total = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // of which served by the cache
};

class MetricsRegistry {
 public:
  explicit MetricsRegistry(std::string model_name);

  void record_step(const EngineSnapshot& snapshot);
  // One finished choice. ttft < 0: it produced no token. `finish_reason` is OpenAI's name.
  void record_finished(const std::string& finish_reason, double ttft, double e2e, int num_output_tokens);
  void record_rejected();  // refused before reaching the engine (queue full, engine error)
  // HTTP connections: open now (what --max-connections caps), and refused with a 503 or closed
  // at once because the cap was reached.
  void connection_opened() { ++connections_open_; }
  void connection_closed() { --connections_open_; }
  int connections_open() const { return connections_open_.load(); }
  void record_connection_refused() { ++connections_refused_; }
  // Requests handed to the prompt workers and not yet back (queued or being prepared).
  void prompt_started() { ++prompts_preparing_; }
  void prompt_finished() { --prompts_preparing_; }

  std::string render() const;
  EngineSnapshot snapshot() const;

 private:
  std::string labels_;  // model_name="..."
  mutable std::mutex mutex_;
  EngineSnapshot engine_;
  Histogram ttft_, tpot_, e2e_;
  std::map<std::string, int64_t> finished_by_reason_;
  int64_t num_rejected_ = 0;
  std::atomic<int> connections_open_{0};
  std::atomic<int64_t> connections_refused_{0};
  std::atomic<int> prompts_preparing_{0};
};

}  // namespace origami::server
