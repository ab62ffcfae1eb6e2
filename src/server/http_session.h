#pragma once
// One HTTP/1.1 connection, run as a C++20 coroutine on its own strand: reads requests
// (keep-alive), answers the quick routes at once, and for generation routes submits to the
// engine worker and relays its outputs (SSE while streaming) without ever blocking a thread.
// A client that goes away (noticed by watching the socket while it waits) gets its request
// aborted.
#include <memory>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "server/server_context.h"

namespace origami::server {

boost::asio::awaitable<void> run_http_session(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerContext> ctx);

}  // namespace origami::server
