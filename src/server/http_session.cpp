#include "server/http_session.h"

#include <sys/socket.h>

#include <cerrno>
#include <functional>
#include <optional>

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

std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}

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

// Watches the socket while a generation request runs, for a client that goes away. An error
// (a reset) is a disconnect. End of stream is not: it is also what a client that half-closes
// after sending its request (`shutdown(SHUT_WR)`, `nc -N`, some proxies) looks like, and such a
// client still reads the answer; the two cannot be told apart on the wire until the server
// writes. So after end of stream the watch stops, and a client that has really gone is noticed
// by the first write that fails (streamed: a chunk or two later; not streamed: the answer). The
// peek never blocks: a readiness report can be spurious (the watch is then armed again).
void watch_disconnect(tcp::socket& socket, std::shared_ptr<Wakeup> wake) {
  wake->watching = true;
  socket.async_wait(tcp::socket::wait_read, [&socket, wake](const beast::error_code& ec) {
    wake->watching = false;
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      char byte;
      const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return;   // the client sent its next request early; it is read after this one
      if (n == 0) return;  // half-closed (or closed): answered until a write fails
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        watch_disconnect(socket, wake);
        return;
      }
    }
    wake->disconnected = true;
    wake->timer.cancel();
  });
}

// Runs `job` on the prompt workers and waits for its result without holding an I/O thread;
// nullopt when their queue is full (the caller answers 503 at once). The result is handed back
// on the session's strand.
template <class T>
net::awaitable<std::optional<T>> run_off_io_threads(ServerContext& ctx, std::function<T()> job) {
  struct State {
    explicit State(net::any_io_executor ex) : timer(ex, net::steady_timer::time_point::max()) {}
    net::steady_timer timer;
    std::optional<T> result;
  };
  auto executor = co_await net::this_coro::executor;
  auto state = std::make_shared<State>(executor);
  MetricsRegistry* metrics = ctx.metrics;
  metrics->prompt_started();
  const bool queued = ctx.prompt_workers->try_post([state, executor, metrics, job = std::move(job)]() mutable {
    T result = job();
    metrics->prompt_finished();
    net::post(executor, [state, result = std::move(result)]() mutable {
      state->result = std::move(result);
      state->timer.cancel();
    });
  });
  if (!queued) {
    metrics->prompt_finished();
    co_return std::nullopt;
  }
  while (!state->result) {
    beast::error_code ec;
    co_await state->timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  co_return std::move(state->result);
}

ApiError prompt_queue_full(ServerContext& ctx) {
  ctx.metrics->record_rejected();
  return ApiError::unavailable("the server is busy: " + std::to_string(ctx.config.max_queued_prompts) +
                               " requests are already waiting to be prepared (--max-queued-prompts); retry later");
}

// What a prompt worker makes of a generation body.
struct ParsedGeneration {
  std::optional<ApiError> error;
  GenerationRequest gen;
};

// Runs on a prompt worker: JSON, chat template, tokenizer, and the checks that need the prompts.
ParsedGeneration parse_generation(const std::string& body_text, ApiKind kind, const ServerContext& ctx) {
  ParsedGeneration p;
  try {
    nlohmann::json body;
    p.error = parse_json_body(body_text, &body);
    if (!p.error) p.error = parse_generation_request(body, kind, ctx.request_context(), &p.gen);
    // More choices than --max-waiting could never be admitted: a 503 "retry later" would be
    // retried forever. A client error, as vLLM-like servers treat a request that can never be
    // served (TGI: best_of above --max-best-of is a 422); admitting it past the cap would break
    // the bound the operator set.
    const int64_t choices = static_cast<int64_t>(p.gen.prompts.size()) * p.gen.n;
    if (!p.error && ctx.config.max_waiting > 0 && choices > ctx.config.max_waiting)
      p.error = ApiError::bad_request(
          "this request asks for " + std::to_string(choices) + " choices (n = " + std::to_string(p.gen.n) + " x " +
              std::to_string(p.gen.prompts.size()) + " prompt(s)), more than the " +
              std::to_string(ctx.config.max_waiting) +
              " this server ever queues (--max-waiting): it could never be admitted; ask for at most " +
              std::to_string(ctx.config.max_waiting),
          "n");
  } catch (const std::exception& e) {  // std::bad_alloc on a huge prompt: this request fails, not the server
    p.error = ApiError::bad_request(std::string("the request could not be prepared: ") + e.what());
  }
  return p;
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
  // Named, not a temporary: GCC mishandles temporaries with destructors inside co_await expressions.
  std::function<ParsedGeneration()> parse = [body = req.body(), kind, &ctx] { return parse_generation(body, kind, ctx); };
  std::optional<ParsedGeneration> parsed = co_await run_off_io_threads(ctx, std::move(parse));
  if (!parsed) co_return co_await write_response(stream, req, SimpleResponse::error(prompt_queue_full(ctx)), timeout_s);
  if (parsed->error) co_return co_await write_response(stream, req, SimpleResponse::error(*parsed->error), timeout_s);
  GenerationRequest& gen = parsed->gen;

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
  if (route == Route::kTokenize || route == Route::kDetokenize) {  // the tokenizer and chat template: off the I/O threads
    std::function<SimpleResponse()> handle = [body = req.body(), route, &ctx] {
      try {
        return handle_simple(ctx, route, body);
      } catch (const std::exception& e) {
        return SimpleResponse::error(ApiError::bad_request(std::string("the request could not be prepared: ") + e.what()));
      }
    };
    std::optional<SimpleResponse> r = co_await run_off_io_threads(ctx, std::move(handle));
    const SimpleResponse response = r ? std::move(*r) : SimpleResponse::error(prompt_queue_full(ctx));
    co_return co_await write_response(stream, req, response, ctx.config.write_timeout_s);
  }
  // /health, /metrics, /v1/models: answered here at once, whatever the prompt workers are doing.
  co_return co_await write_response(stream, req, handle_simple(ctx, route, req.body()), ctx.config.write_timeout_s);
}

}  // namespace

net::awaitable<void> run_http_session(tcp::socket socket, std::shared_ptr<ServerContext> ctx) {
  struct Open {  // counted open by the listener; closed when the session ends
    MetricsRegistry& metrics;
    ~Open() { metrics.connection_closed(); }
  } open{*ctx->metrics};
  const ServerConfig& cfg = ctx->config;
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    beast::error_code ec;
    // Idle (before the first request, between requests): the first byte of the next request
    // must come within the keep-alive timeout, unless it already came with the last one.
    if (buffer.size() == 0) {
      stream.expires_after(seconds(cfg.timeout_keep_alive_s));
      const size_t n = co_await stream.async_read_some(buffer.prepare(4096), net::redirect_error(net::use_awaitable, ec));
      buffer.commit(n);
      if (ec) break;  // closed (a half-close before a request is a close), reset, or idle too long
    }
    // Then the whole header within its timeout from that byte (a client sending one header byte
    // a second is closed), then the whole body within its own.
    http::request_parser<http::string_body> parser;
    parser.body_limit(cfg.max_body_bytes);
    stream.expires_after(seconds(cfg.timeout_header_s));
    co_await http::async_read_header(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    if (!ec && !parser.is_done()) {
      stream.expires_after(seconds(cfg.timeout_body_s));
      co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    }
    stream.expires_never();
    if (ec == http::error::body_limit) {
      Request req;
      req.version(11);
      req.keep_alive(false);
      co_await write_response(stream, req, SimpleResponse::error(ApiError::too_large(cfg.max_body_bytes)), cfg.write_timeout_s);
      break;
    }
    // A timeout (the stream is closed by then), end of stream before the request was complete
    // (a disconnect), a reset, or not HTTP: nothing to answer.
    if (ec) break;
    Request req = parser.release();
    if (!co_await handle_request(stream, req, *ctx)) break;
  }
  beast::error_code ec;
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  stream.socket().close(ec);
}

}  // namespace origami::server
