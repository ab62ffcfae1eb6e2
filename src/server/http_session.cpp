#include "server/http_session.h"

#include <sys/socket.h>

#include <cerrno>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "server/api_routes.h"
#include "server/generation_response.h"

namespace origami::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;

// Wakes the session when the engine pushed outputs or the client went away: a timer that never
// expires, cancelled on the session's strand.
struct Wakeup {
  explicit Wakeup(net::any_io_executor ex) : timer(ex, net::steady_timer::time_point::max()) {}
  net::steady_timer timer;
  bool disconnected = false;
  bool watching = false;
};

// Counts the request as in flight for the shutdown sequence.
struct InFlight {
  explicit InFlight(ServerContext& c) : ctx(c) { ++ctx.requests_in_flight; }
  ~InFlight() { --ctx.requests_in_flight; }
  ServerContext& ctx;
};

// Watches the socket while a generation request runs: readable with nothing to read (a peek of
// 0 bytes) or an error means the client closed the connection. The peek never blocks: a
// readiness report can be spurious (the watch is then armed again).
void watch_disconnect(tcp::socket& socket, std::shared_ptr<Wakeup> wake) {
  wake->watching = true;
  socket.async_wait(tcp::socket::wait_read, [&socket, wake](const beast::error_code& ec) {
    wake->watching = false;
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      char byte;
      const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;  // the client sent its next request early; it is read after this one
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        watch_disconnect(socket, wake);
        return;
      }
    }
    wake->disconnected = true;
    wake->timer.cancel();
  });
}

net::awaitable<bool> write_response(beast::tcp_stream& stream, const Request& req, const SimpleResponse& r, int timeout_s) {
  http::response<http::string_body> res{static_cast<http::status>(r.status), req.version()};
  res.set(http::field::server, "origami");
  res.set(http::field::content_type, r.content_type);
  res.keep_alive(req.keep_alive());
  res.body() = r.body;
  res.prepare_payload();
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(timeout_s));
  co_await http::async_write(stream, res, net::redirect_error(net::use_awaitable, ec));
  stream.expires_never();
  co_return !ec && req.keep_alive();
}

// Writes one piece of a chunked (SSE) body.
net::awaitable<bool> write_chunk(beast::tcp_stream& stream, const std::string& text, int timeout_s) {
  beast::error_code ec;
  stream.expires_after(std::chrono::seconds(timeout_s));
  co_await net::async_write(stream, http::make_chunk(net::buffer(text)), net::redirect_error(net::use_awaitable, ec));
  stream.expires_never();
  co_return !ec;
}

net::awaitable<bool> serve_generation(beast::tcp_stream& stream, const Request& req, ServerContext& ctx, ApiKind kind) {
  const int timeout_s = ctx.config.write_timeout_s;
  if (ctx.draining) co_return co_await write_response(stream, req, SimpleResponse::error(ApiError::unavailable("the server is shutting down")), timeout_s);
  nlohmann::json body;
  GenerationRequest gen;
  std::optional<ApiError> error = parse_json_body(req.body(), &body);
  if (!error) error = parse_generation_request(body, kind, ctx.request_context(), &gen);
  if (error) co_return co_await write_response(stream, req, SimpleResponse::error(*error), timeout_s);

  // Hand the request to the engine thread: one engine request per (prompt, choice).
  auto channel = std::make_shared<RequestChannel>(static_cast<int>(gen.prompts.size()) * gen.n);
  auto executor = co_await net::this_coro::executor;
  auto wake = std::make_shared<Wakeup>(executor);
  channel->set_notifier([executor, weak = std::weak_ptr<Wakeup>(wake)] {
    net::post(executor, [weak] {
      if (auto w = weak.lock()) w->timer.cancel();
    });
  });
  Submission sub;
  sub.channel = channel;
  sub.options = gen.options;
  for (const auto& prompt : gen.prompts) {
    for (int j = 0; j < gen.n; ++j) {
      SamplingParams sp = gen.sampling;
      if (sp.seed) *sp.seed += static_cast<uint64_t>(j);  // n seeded choices differ, reproducibly
      sub.prompts.push_back(prompt);
      sub.sampling.push_back(std::move(sp));
    }
  }
  if (!ctx.worker->submit(std::move(sub))) {
    ctx.metrics->record_rejected();
    co_return co_await write_response(
        stream, req, SimpleResponse::error(ApiError::unavailable("the server is busy: too many requests are waiting; retry later")), timeout_s);
  }

  tcp::socket& socket = stream.socket();
  watch_disconnect(socket, wake);
  GenerationResponse response(gen, ResponseHeader{kind, make_response_id(kind),
                                                  std::chrono::duration_cast<std::chrono::seconds>(
                                                      std::chrono::system_clock::now().time_since_epoch()).count(),
                                                  ctx.config.served_model_name},
                              ctx.worker->tokenizer().get());
  auto stop_watching = [&] {
    if (wake->watching) {
      beast::error_code ec;
      socket.cancel(ec);
    }
  };
  bool headers_sent = false;
  for (;;) {
    if (wake->disconnected) {
      ctx.worker->abort(channel);
      co_return false;
    }
    std::vector<ChannelEvent> events = channel->drain();
    if (events.empty()) {
      beast::error_code ec;
      co_await wake->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    std::string sse = response.consume(events);
    if (response.rejection()) {
      stop_watching();
      co_return co_await write_response(stream, req, SimpleResponse::error(*response.rejection()), timeout_s);
    }
    if (gen.stream) {
      if (!headers_sent) {
        http::response<http::empty_body> res{http::status::ok, req.version()};
        res.set(http::field::server, "origami");
        res.set(http::field::content_type, "text/event-stream");
        res.set(http::field::cache_control, "no-cache");
        res.keep_alive(req.keep_alive());
        res.chunked(true);
        http::response_serializer<http::empty_body> serializer{res};
        beast::error_code ec;
        stream.expires_after(std::chrono::seconds(timeout_s));
        co_await http::async_write_header(stream, serializer, net::redirect_error(net::use_awaitable, ec));
        stream.expires_never();
        if (ec) {
          ctx.worker->abort(channel);
          co_return false;
        }
        headers_sent = true;
      }
      if (response.done()) sse += response.stream_tail();
      if (!sse.empty() && !co_await write_chunk(stream, sse, timeout_s)) {
        ctx.worker->abort(channel);
        co_return false;
      }
    }
    if (response.done()) break;
  }
  stop_watching();
  if (gen.stream) {
    beast::error_code ec;
    stream.expires_after(std::chrono::seconds(timeout_s));
    co_await net::async_write(stream, http::make_chunk_last(), net::redirect_error(net::use_awaitable, ec));
    stream.expires_never();
    co_return !ec && req.keep_alive();
  }
  if (response.failure()) co_return co_await write_response(stream, req, SimpleResponse::error(*response.failure()), timeout_s);
  co_return co_await write_response(stream, req, SimpleResponse::json(response.body()), timeout_s);
}

net::awaitable<bool> handle_request(beast::tcp_stream& stream, const Request& req, ServerContext& ctx) {
  InFlight in_flight(ctx);
  const std::string target(req.target());
  const std::string method(req.method_string());
  if (auto e = check_api_key(ctx, target, std::string(req[http::field::authorization])))
    co_return co_await write_response(stream, req, SimpleResponse::error(*e), ctx.config.write_timeout_s);
  const Route route = find_route(method, target);
  if (route == Route::kCompletions) co_return co_await serve_generation(stream, req, ctx, ApiKind::kCompletion);
  if (route == Route::kChatCompletions) co_return co_await serve_generation(stream, req, ctx, ApiKind::kChat);
  if (route == Route::kUnknown) {
    const SimpleResponse r = SimpleResponse::error(ApiError::not_found("no route for " + method + " " + target));
    co_return co_await write_response(stream, req, r, ctx.config.write_timeout_s);
  }
  co_return co_await write_response(stream, req, handle_simple(ctx, route, req.body()), ctx.config.write_timeout_s);
}

}  // namespace

net::awaitable<void> run_http_session(tcp::socket socket, std::shared_ptr<ServerContext> ctx) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(ctx->config.max_body_bytes);
    beast::error_code ec;
    stream.expires_after(std::chrono::seconds(ctx->config.idle_timeout_s));
    co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    stream.expires_never();
    if (ec == http::error::body_limit) {
      Request req;
      req.version(11);
      req.keep_alive(false);
      co_await write_response(stream, req, SimpleResponse::error(ApiError::too_large(ctx->config.max_body_bytes)),
                              ctx->config.write_timeout_s);
      break;
    }
    if (ec) break;  // closed, timed out, or not HTTP
    Request req = parser.release();
    if (!co_await handle_request(stream, req, *ctx)) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.socket().close(ec);
}

}  // namespace origami::server
