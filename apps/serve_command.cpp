// `origami serve`: an OpenAI-compatible HTTP server (see src/server/server.h).
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "engine/engine.h"
#include "server/named_head_budgets.h"
#include "server/server.h"

namespace origami::cli {
namespace {

struct ServeFlags {
  EngineFlags engine;
  server::ServerConfig server;
  std::vector<std::string> head_budget_files;  // NAME=PATH
};

int run_serve(ServeFlags& f) {
  // The server retains contexts unless told not to: a chat's next turn continues its KV.
  if (!f.engine.no_retain_contexts) f.engine.config.retain_contexts = true;
  if (!finalize_engine_flags(&f.engine)) return 2;
  // Read before the model loads: an unreadable or malformed file is a flag error.
  Expected<server::NamedHeadBudgets> named = server::load_named_head_budgets(f.head_budget_files);
  if (!named) {
    print_error(named.status().to_string());
    return 2;
  }
  f.server.named_head_budgets = std::move(*named);
  if (f.server.served_model_name.empty()) {
    const std::filesystem::path dir = std::filesystem::path(f.engine.config.model_dir).lexically_normal();
    f.server.served_model_name = dir.has_filename() ? dir.filename().string() : dir.parent_path().filename().string();
  }
  Expected<std::unique_ptr<Engine>> engine = Engine::create(f.engine.config);
  if (!engine) {
    print_error(engine.status().to_string());
    return 1;
  }
  const Status status = server::serve(f.server, std::move(*engine), [&](const std::string& url) {
    std::printf("origami: serving '%s' at %s (OpenAI API under %s/v1)\n", f.server.served_model_name.c_str(), url.c_str(),
                url.c_str());
    std::fflush(stdout);
  });
  if (!status.is_ok()) {
    print_error(status.to_string());
    return 1;
  }
  std::printf("origami: server stopped\n");
  return 0;
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, metrics)");
  add_engine_flags(cmd, &flags->engine);
  server::ServerConfig& s = flags->server;
  cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", s.port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--api-key", s.api_key, "Require 'Authorization: Bearer KEY' on /v1 routes");
  cmd->add_option("--served-model-name", s.served_model_name, "Model name of the API (default: the model folder's name)");
  cmd->add_option("--max-waiting", s.max_waiting, "Answer 503 when this many requests wait (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--io-threads", s.io_threads, "Threads running the HTTP I/O")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--max-body-bytes", s.max_body_bytes, "Largest request body (larger: 413)")->capture_default_str();
  cmd->add_option("--max-connections", s.max_connections,
                  "Connections open at once; beyond it a 503 and close (0: the open-file limit, raised to its hard limit, less 128)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--timeout-keep-alive", s.timeout_keep_alive_s,
                  "Seconds a connection may stay idle before and between requests (as uvicorn's)")
      ->check(CLI::Range(0.001, 86400.0))->capture_default_str();
  cmd->add_option("--timeout-header", s.timeout_header_s, "Seconds for a request's whole header to arrive, from its first byte")
      ->check(CLI::Range(0.001, 86400.0))->capture_default_str();
  cmd->add_option("--timeout-body", s.timeout_body_s, "Seconds for a request's whole body to arrive, after its header")
      ->check(CLI::Range(0.001, 86400.0))->capture_default_str();
  cmd->add_option("--prompt-workers", s.prompt_workers,
                  "Threads parsing bodies, rendering chat templates and tokenizing (off the HTTP I/O threads)")
      ->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--max-queued-prompts", s.max_queued_prompts,
                  "Requests waiting for a prompt worker; beyond it a 503 at once")
      ->check(CLI::Range(1, 1000000))->capture_default_str();
  cmd->add_option("--kv-head-budgets-file", flags->head_budget_files,
                  "NAME=PATH (repeatable): head budgets (origami calibrate) that requests pick with \"kv_head_budgets\": \"NAME\"")
      ->take_all();
  cmd->add_option("--shutdown-timeout", s.shutdown_timeout_s, "Seconds running requests may finish after SIGINT/SIGTERM")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->callback([flags] { set_exit_code(run_serve(*flags)); });
}

}  // namespace origami::cli
