#include "server/http_listener.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <climits>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>

#include "server/api_routes.h"
#include "server/http_session.h"

namespace origami::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

// 503 answers being written beyond the cap; more connections than this are closed unanswered
// (each answer holds a descriptor for up to a second or two).
constexpr int kMaxRefusalsInFlight = 32;
std::atomic<int> refusals_in_flight{0};

// Answers a connection beyond --max-connections: 503 and close, without reading the request.
// The response goes out first, then the read side is drained briefly so that closing does not
// reset the connection before the client has read the answer.
net::awaitable<void> refuse_connection(tcp::socket socket, int max_connections) {
  struct Count {
    Count() { ++refusals_in_flight; }
    ~Count() { --refusals_in_flight; }
  } count;
  beast::tcp_stream stream(std::move(socket));
  const std::string body =
      SimpleResponse::error(ApiError::unavailable("the server has " + std::to_string(max_connections) +
                                                  " connections open, its limit (--max-connections); retry later"))
          .body;
  const std::string response = "HTTP/1.1 503 Service Unavailable\r\nServer: origami\r\nContent-Type: application/json\r\n"
                               "Connection: close\r\nRetry-After: 1\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(2));
  co_await net::async_write(stream, net::buffer(response), net::redirect_error(net::use_awaitable, ec));
  if (!ec) {
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    char sink[4096];
    stream.expires_after(std::chrono::seconds(1));
    for (;;) {
      co_await stream.async_read_some(net::buffer(sink), net::redirect_error(net::use_awaitable, ec));
      if (ec) break;  // the client closed, or a second passed
    }
  }
  stream.socket().close(ec);
}

}  // namespace

int raise_open_file_limit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 1024;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  return lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > static_cast<rlim_t>(INT_MAX) ? INT_MAX
                                                                                      : static_cast<int>(lim.rlim_cur);
}

net::awaitable<void> accept_connections(tcp::acceptor& acceptor, net::io_context& ioc, std::shared_ptr<ServerContext> ctx) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(net::make_strand(ioc), net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;  // shutting down
      // Out of file descriptors or a connection reset before accept: back off briefly, go on.
      net::steady_timer pause(co_await net::this_coro::executor, std::chrono::milliseconds(50));
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    if (ctx->metrics->connections_open() >= ctx->config.max_connections) {
      ctx->metrics->record_connection_refused();
      if (refusals_in_flight.load() < kMaxRefusalsInFlight) {
        auto executor = socket.get_executor();
        net::co_spawn(executor, refuse_connection(std::move(socket), ctx->config.max_connections), net::detached);
      } else {
        socket.close(ec);
      }
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);  // streamed tokens go out at once
    ctx->metrics->connection_opened();  // here, so the next accept already counts it
    auto executor = socket.get_executor();
    net::co_spawn(executor, run_http_session(std::move(socket), ctx), net::detached);
  }
}

}  // namespace origami::server
