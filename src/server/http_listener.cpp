#include "server/http_listener.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "server/http_session.h"

namespace origami::server {

namespace net = boost::asio;
using tcp = net::ip::tcp;

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
    socket.set_option(tcp::no_delay(true), ec);  // streamed tokens go out at once
    auto executor = socket.get_executor();
    net::co_spawn(executor, run_http_session(std::move(socket), ctx), net::detached);
  }
}

}  // namespace origami::server
