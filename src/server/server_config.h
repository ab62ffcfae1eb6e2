#pragma once
// How `origami serve` listens, admits requests and bounds connections.
#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "kv/head_budgets.h"

namespace origami::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port (the URL printed names it)
  std::string api_key;               // non-empty: /v1/* needs "Authorization: Bearer <key>"
  std::string served_model_name;     // default: the model folder's name
  int max_waiting = 0;               // > 0: answer 503 when this many requests already wait
  int io_threads = 2;                // threads running the HTTP I/O (async: each holds many connections)
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  // Connections (docs/reliability.md, "The server: connections"). Timeouts in seconds.
  int max_connections = 0;           // open at once; beyond it a 503 and close. 0: the open-file limit less a reserve
  double timeout_keep_alive_s = 5;   // idle between requests (and before the first), as uvicorn/vLLM
  double timeout_header_s = 10;      // the whole request header, from its first byte (slowloris)
  double timeout_body_s = 60;        // the whole body, from the end of the header
  int write_timeout_s = 60;          // a client that stops reading is dropped after this
  // Prompt building (JSON body, chat template, tokenizer) off the I/O threads.
  int prompt_workers = 2;            // threads
  int max_queued_prompts = 1024;     // waiting for a thread; beyond it a 503 at once
  double shutdown_timeout_s = 30.0;  // SIGINT/SIGTERM: running requests may finish this long
  // Head budgets a request may name ("kv_head_budgets": "NAME"), loaded by the operator at start
  // (--kv-head-budgets-file NAME=PATH): the server never opens a path a request names.
  std::map<std::string, std::shared_ptr<const HeadBudgets>> named_head_budgets;  // server/named_head_budgets.h
};

}  // namespace origami::server
