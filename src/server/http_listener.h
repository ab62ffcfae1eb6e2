#pragma once
// Accepts TCP connections and starts an HTTP session for each on a strand of its own, so that
// a few I/O threads serve every connection (1,000 open streams cost 1,000 sockets and
// coroutine frames, not 1,000 threads). At --max-connections open, a new connection gets a 503
// and is closed (at most a few such answers at once; beyond them it is closed unanswered), so a
// flood of connections is refused fast instead of exhausting file descriptors.
#include <memory>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "server/server_context.h"

namespace origami::server {

// File descriptors kept free of connections: the model's files, the engine's and I/O threads'
// own descriptors, and the sockets of the 503 answers beyond the cap.
inline constexpr int kReservedFileDescriptors = 128;

// Raises the soft limit of open files to the hard limit (as nginx's worker_rlimit_nofile and most
// servers do: the default soft limit, often 1024, is far below what 1,000 connections need) and
// returns the soft limit now in force.
int raise_open_file_limit();

boost::asio::awaitable<void> accept_connections(boost::asio::ip::tcp::acceptor& acceptor, boost::asio::io_context& ioc,
                                                std::shared_ptr<ServerContext> ctx);

}  // namespace origami::server
