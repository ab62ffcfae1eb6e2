#pragma once
// What every HTTP session shares: the configuration, the engine worker, the metrics, the prompt
// builder and the threads that run it. Owned by the Server; sessions hold a shared_ptr to it.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>

#include "engine/prompt_builder.h"
#include "server/engine_worker.h"
#include "server/metrics_registry.h"
#include "server/named_head_budgets.h"
#include "server/openai_request.h"
#include "server/prompt_workers.h"
#include "server/server_config.h"

namespace origami::server {

struct ServerContext {
  // `config.max_connections` is the effective cap (serve() resolves 0 from the open-file limit).
  ServerContext(ServerConfig config, EngineWorker* worker, MetricsRegistry* metrics, PromptWorkers* prompt_workers)
      : config(std::move(config)),
        worker(worker),
        metrics(metrics),
        prompt_workers(prompt_workers),
        builder(worker->tokenizer()),
        head_budgets(named_head_budgets_resolver(this->config.named_head_budgets)) {
    created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  RequestContext request_context() const {
    RequestContext r{&builder, &builder_mutex, config.served_model_name, worker->config().max_model_len};
    r.head_budgets = &head_budgets;
    r.retain_contexts = worker->config().retain_contexts;
    return r;
  }

  const ServerConfig config;
  EngineWorker* const worker;
  MetricsRegistry* const metrics;
  PromptWorkers* const prompt_workers;
  PromptBuilder builder;
  mutable std::mutex builder_mutex;  // chat template rendering (parsed lazily, not thread-safe)
  const HeadBudgetsResolver head_budgets;  // a request's "kv_head_budgets": "NAME"
  int64_t created = 0;
  std::atomic<bool> draining{false};  // shutting down: no new generation requests
  std::atomic<int> requests_in_flight{0};  // HTTP requests being handled (any route)
};

}  // namespace origami::server
