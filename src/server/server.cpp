#include "server/server.h"

#include <csignal>
#include <cstdio>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "server/engine_worker.h"
#include "server/http_listener.h"
#include "server/metrics_registry.h"
#include "server/named_head_budgets.h"
#include "server/prompt_workers.h"
#include "server/server_context.h"

namespace origami::server {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// After a signal: requests may finish for shutdown_timeout_s, then the rest are aborted (which
// the engine reports within a step); the I/O stops once no HTTP request is in flight.
net::awaitable<void> drain_and_stop(net::io_context& ioc, ServerContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  bool aborted = false;
  net::steady_timer tick(co_await net::this_coro::executor);
  for (;;) {
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (ctx.worker->num_active() == 0 && ctx.requests_in_flight.load() == 0) break;
    if (!aborted && waited > ctx.config.shutdown_timeout_s) {
      ctx.worker->abort_all();
      aborted = true;
    }
    if (waited > ctx.config.shutdown_timeout_s + 10.0) break;  // a client that never reads its answer
    tick.expires_after(std::chrono::milliseconds(20));
    boost::system::error_code ec;
    co_await tick.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  ioc.stop();
}

}  // namespace

Status serve(const ServerConfig& config, std::unique_ptr<Engine> engine,
             const std::function<void(const std::string& url)>& on_ready) {
  ServerConfig cfg = config;
  ORIGAMI_RETURN_IF_ERROR(check_named_head_budgets(cfg.named_head_budgets, engine->model_config()));
  // Connections: as many as the open-file limit allows, less a reserve for everything else.
  const int fd_limit = raise_open_file_limit();
  const int fd_cap = std::max(16, fd_limit - kReservedFileDescriptors);
  if (cfg.max_connections > fd_cap)
    std::fprintf(stderr,
                 "origami: warning: --max-connections %d is more than the open-file limit (%d) allows; capped at %d\n",
                 cfg.max_connections, fd_limit, fd_cap);
  cfg.max_connections = cfg.max_connections > 0 ? std::min(cfg.max_connections, fd_cap) : fd_cap;
  MetricsRegistry metrics(cfg.served_model_name);
  auto worker = std::make_unique<EngineWorker>(std::move(engine), &metrics, cfg.max_waiting);

  net::io_context ioc(std::max(1, cfg.io_threads));
  // After the I/O context (its jobs post into it), so destroyed before it: joined first.
  auto prompt_workers = std::make_unique<PromptWorkers>(cfg.prompt_workers, cfg.max_queued_prompts);
  auto ctx = std::make_shared<ServerContext>(cfg, worker.get(), &metrics, prompt_workers.get());
  auto accept_strand = net::make_strand(ioc);
  tcp::acceptor acceptor(accept_strand);
  boost::system::error_code ec;
  const net::ip::address address = net::ip::make_address(cfg.host, ec);
  if (ec) return invalid_argument("--host: '" + cfg.host + "' is not an IP address");
  const tcp::endpoint endpoint(address, static_cast<unsigned short>(cfg.port));
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return invalid_argument("cannot listen on " + cfg.host + ":" + std::to_string(cfg.port) + ": " + ec.message());

  worker->start();
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& sec, int) {
    if (sec) return;
    ctx->draining = true;
    net::post(accept_strand, [&] {
      boost::system::error_code cec;
      acceptor.close(cec);
    });
    net::co_spawn(ioc, drain_and_stop(ioc, *ctx), net::detached);
  });
  net::co_spawn(accept_strand, accept_connections(acceptor, ioc, ctx), net::detached);

  const std::string host = address.is_v6() ? "[" + cfg.host + "]" : cfg.host;
  on_ready("http://" + host + ":" + std::to_string(acceptor.local_endpoint().port()));

  std::vector<std::thread> threads;
  for (int i = 1; i < cfg.io_threads; ++i) threads.emplace_back([&] { ioc.run(); });
  ioc.run();
  for (auto& t : threads) t.join();
  // The prompt workers and the engine thread stop before the I/O context they notify goes away.
  prompt_workers.reset();
  worker.reset();
  return Status::ok();
}

}  // namespace origami::server
