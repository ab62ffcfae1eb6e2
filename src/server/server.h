#pragma once
// `origami serve`: an OpenAI-compatible HTTP server around one engine. The engine runs on its
// own thread (EngineWorker); HTTP I/O runs asynchronously on a few threads (Boost.Asio/Beast).
// SIGINT/SIGTERM stop accepting, let running requests finish (aborting them after
// shutdown_timeout_s), and return.
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "server/server_config.h"

namespace origami::server {

// Binds host:port, calls on_ready with the base URL ("http://127.0.0.1:8000") once accepting,
// and serves until a signal asks it to stop. Errors: the address cannot be bound.
Status serve(const ServerConfig& config, std::unique_ptr<Engine> engine,
             const std::function<void(const std::string& url)>& on_ready);

}  // namespace origami::server
