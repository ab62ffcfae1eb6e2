#pragma once
// What every HTTP session shares: the configuration, the engine worker, the metrics, and the
// prompt builder. Owned by the Server; sessions hold a shared_ptr to it.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "engine/prompt_builder.h"
#include "server/engine_worker.h"
#include "server/metrics_registry.h"
#include "server/openai_request.h"
#include "server/server_config.h"

namespace origami::server {

struct ServerContext {
  ServerContext(ServerConfig config, EngineWorker* worker, MetricsRegistry* metrics)
      : config(std::move(config)), worker(worker), metrics(metrics), builder(worker->tokenizer()) {
    created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  RequestContext request_context() const {
    return RequestContext{&builder, &builder_mutex, config.served_model_name, worker->config().max_model_len};
  }

  const ServerConfig config;
  EngineWorker* const worker;
  MetricsRegistry* const metrics;
  PromptBuilder builder;
  mutable std::mutex builder_mutex;  // chat template rendering (parsed lazily, not thread-safe)
  int64_t created = 0;
  std::atomic<bool> draining{false};  // shutting down: no new generation requests
  std::atomic<int> requests_in_flight{0};  // HTTP requests being handled (any route)
};

}  // namespace origami::server
