#include "server/metrics_registry.h"

#include <algorithm>
#include <charconv>

namespace origami::server {
namespace {

// The shortest text that reads back as v (bucket bounds print as written: le="0.005").
std::string format_number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

void header(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string* out, const std::string& name, const std::string& labels, double value) {
  *out += name + "{" + labels + "} " + format_number(value) + "\n";
}

// Latency buckets (seconds) in the style of vLLM's.
std::vector<double> latency_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0};
}
std::vector<double> token_latency_bounds() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string* out) const {
  int64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? format_number(bounds_[i]) : "+Inf";
    *out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  sample(out, name + "_sum", labels, sum_);
  *out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

MetricsRegistry::MetricsRegistry(std::string model_name)
    : labels_("model_name=\"" + model_name + "\""),
      ttft_(latency_bounds()),
      tpot_(token_latency_bounds()),
      e2e_(latency_bounds()) {
  for (const char* reason : {"stop", "length", "abort", "error"}) finished_by_reason_[reason] = 0;
}

void MetricsRegistry::record_step(const EngineSnapshot& snapshot) {
  std::lock_guard<std::mutex> lock(mutex_);
  engine_ = snapshot;
}

void MetricsRegistry::record_finished(const std::string& finish_reason, double ttft, double e2e, int num_output_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++finished_by_reason_[finish_reason];
  if (finish_reason == "abort" || finish_reason == "error") return;  // latencies of served requests only
  if (ttft >= 0) ttft_.observe(ttft);
  e2e_.observe(e2e);
  if (num_output_tokens > 1 && ttft >= 0) tpot_.observe((e2e - ttft) / (num_output_tokens - 1));
}

void MetricsRegistry::record_rejected() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++num_rejected_;
}

EngineSnapshot MetricsRegistry::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return engine_;
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const EngineMetrics& m = engine_.metrics;
  const std::string& l = labels_;
  std::string out;
  header(&out, "origami:num_requests_running", "gauge", "Requests running on the engine.");
  sample(&out, "origami:num_requests_running", l, engine_.num_running);
  header(&out, "origami:num_requests_waiting", "gauge", "Requests waiting to be scheduled.");
  sample(&out, "origami:num_requests_waiting", l, engine_.num_waiting);
  header(&out, "origami:kv_blocks_used", "gauge", "KV cache blocks in use.");
  sample(&out, "origami:kv_blocks_used", l, engine_.kv_blocks_used);
  header(&out, "origami:kv_blocks_total", "gauge", "KV cache blocks in the pool.");
  sample(&out, "origami:kv_blocks_total", l, engine_.kv_blocks_total);
  header(&out, "origami:kv_cache_usage_perc", "gauge", "KV cache usage (1 = full).");
  sample(&out, "origami:kv_cache_usage_perc", l,
         engine_.kv_blocks_total > 0 ? static_cast<double>(engine_.kv_blocks_used) / engine_.kv_blocks_total : 0.0);
  const int64_t queries = engine_.prefix_cache_queries, hits = engine_.prefix_cache_hits;
  header(&out, "origami:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.");
  sample(&out, "origami:prefix_cache_queries_total", l, static_cast<double>(queries));
  header(&out, "origami:prefix_cache_hits_total", "counter", "Prompt tokens served by the prefix cache.");
  sample(&out, "origami:prefix_cache_hits_total", l, static_cast<double>(hits));
  header(&out, "origami:prefix_cache_hit_rate", "gauge", "Share of prompt tokens served by the prefix cache.");
  sample(&out, "origami:prefix_cache_hit_rate", l, queries > 0 ? static_cast<double>(hits) / queries : 0.0);
  header(&out, "origami:num_preemptions_total", "counter", "Requests preempted (KV dropped, recomputed later).");
  sample(&out, "origami:num_preemptions_total", l, static_cast<double>(m.num_preemptions));
  header(&out, "origami:num_pipelined_steps_total", "counter",
         "Steps launched before the last one's tokens were known (--async-scheduling).");
  sample(&out, "origami:num_pipelined_steps_total", l, static_cast<double>(m.num_pipelined_steps));
  header(&out, "origami:num_compressions_total", "counter", "KV compressions completed.");
  sample(&out, "origami:num_compressions_total", l, static_cast<double>(m.num_compressions));
  header(&out, "origami:evicted_tokens_total", "counter", "KV entries evicted by compression, per (layer, KV head).");
  sample(&out, "origami:evicted_tokens_total", l, static_cast<double>(m.num_evicted_tokens));
  header(&out, "origami:compression_seconds_total", "counter", "Engine time spent starting or waiting for compressions.");
  sample(&out, "origami:compression_seconds_total", l, m.compression_seconds);
  header(&out, "origami:compression_device_seconds_total", "counter", "Backend time spent running compressions.");
  sample(&out, "origami:compression_device_seconds_total", l, m.compression_device_seconds);
  header(&out, "origami:retained_hits_total", "counter", "Requests that continued a retained context.");
  sample(&out, "origami:retained_hits_total", l, static_cast<double>(m.num_retained_hits));
  header(&out, "origami:retained_hit_tokens_total", "counter", "Prompt tokens served by retained contexts (not prefilled again).");
  sample(&out, "origami:retained_hit_tokens_total", l, static_cast<double>(m.num_retained_hit_tokens));
  header(&out, "origami:retained_contexts_total", "counter", "Contexts retained.");
  sample(&out, "origami:retained_contexts_total", l, static_cast<double>(m.num_retained_contexts));
  header(&out, "origami:retained_releases_total", "counter", "Retained contexts released (memory needed, limit, replaced).");
  sample(&out, "origami:retained_releases_total", l, static_cast<double>(m.num_retained_releases));
  header(&out, "origami:retained_contexts", "gauge", "Retained contexts alive.");
  sample(&out, "origami:retained_contexts", l, static_cast<double>(m.retained_contexts_alive));
  header(&out, "origami:retained_kv_blocks", "gauge", "KV pages the retained contexts hold (distinct).");
  sample(&out, "origami:retained_kv_blocks", l, static_cast<double>(m.retained_kv_blocks));
  header(&out, "origami:prompt_tokens_total", "counter", "Prefill tokens computed (prefix-cache hits excluded).");
  sample(&out, "origami:prompt_tokens_total", l, static_cast<double>(m.num_prompt_tokens_computed));
  header(&out, "origami:generation_tokens_total", "counter", "Tokens generated.");
  sample(&out, "origami:generation_tokens_total", l, static_cast<double>(m.num_generated_tokens));
  header(&out, "origami:num_steps_total", "counter", "Engine steps run.");
  sample(&out, "origami:num_steps_total", l, static_cast<double>(m.num_steps));
  header(&out, "origami:time_to_first_token_seconds", "histogram", "Time from arrival to the first token.");
  ttft_.render("origami:time_to_first_token_seconds", l, &out);
  header(&out, "origami:time_per_output_token_seconds", "histogram", "Mean time between output tokens of a request.");
  tpot_.render("origami:time_per_output_token_seconds", l, &out);
  header(&out, "origami:e2e_request_latency_seconds", "histogram", "Time from arrival to the last token.");
  e2e_.render("origami:e2e_request_latency_seconds", l, &out);
  header(&out, "origami:request_success_total", "counter", "Finished requests (choices) by finish reason.");
  for (const auto& [reason, n] : finished_by_reason_)
    sample(&out, "origami:request_success_total", l + ",finished_reason=\"" + reason + "\"", static_cast<double>(n));
  header(&out, "origami:num_requests_rejected_total", "counter", "Requests refused before reaching the engine.");
  sample(&out, "origami:num_requests_rejected_total", l, static_cast<double>(num_rejected_));
  header(&out, "origami:http_connections_open", "gauge", "HTTP connections open (capped by --max-connections).");
  sample(&out, "origami:http_connections_open", l, connections_open_.load());
  header(&out, "origami:http_connections_refused_total", "counter", "HTTP connections refused at --max-connections.");
  sample(&out, "origami:http_connections_refused_total", l, static_cast<double>(connections_refused_.load()));
  header(&out, "origami:num_requests_preparing", "gauge", "Requests queued for or on the prompt workers (body, chat template, tokenizer).");
  sample(&out, "origami:num_requests_preparing", l, prompts_preparing_.load());
  return out;
}

}  // namespace origami::server
