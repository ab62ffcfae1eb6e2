#pragma once
// How `origami serve` listens and admits requests.
#include <cstddef>
#include <string>

namespace origami::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: any free port (the URL printed names it)
  std::string api_key;               // non-empty: /v1/* needs "Authorization: Bearer <key>"
  std::string served_model_name;     // default: the model folder's name
  int max_waiting = 0;               // > 0: answer 503 when this many requests already wait
  int io_threads = 2;                // threads running the HTTP I/O (async: each holds many connections)
  size_t max_body_bytes = 8u << 20;  // larger bodies get 413
  int idle_timeout_s = 300;          // an idle keep-alive connection is closed after this
  int write_timeout_s = 60;          // a client that stops reading is dropped after this
  double shutdown_timeout_s = 30.0;  // SIGINT/SIGTERM: running requests may finish this long
};

}  // namespace origami::server
