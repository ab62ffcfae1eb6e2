#pragma once
// Accepts TCP connections and starts an HTTP session for each on a strand of its own, so that
// a few I/O threads serve every connection (1,000 open streams cost 1,000 sockets and
// coroutine frames, not 1,000 threads).
#include <memory>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "server/server_context.h"

namespace origami::server {

boost::asio::awaitable<void> accept_connections(boost::asio::ip::tcp::acceptor& acceptor, boost::asio::io_context& ioc,
                                                std::shared_ptr<ServerContext> ctx);

}  // namespace origami::server
