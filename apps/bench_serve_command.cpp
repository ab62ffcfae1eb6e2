// `origami bench serve`: an online serving benchmark in the manner of vLLM's
// benchmark_serving.py. It sends --num-prompts streaming completions of random token-id prompts
// (the same prompts `origami bench` draws for the same --dataset-seed) to a running server,
// arriving as a Poisson process of --request-rate (inf: all at once) with at most
// --max-concurrency in flight, and reports request throughput, output tokens/s, TTFT, TPOT and
// ITL (mean, median, p99) and failed requests. The client is Boost.Beast on one thread.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"
#include "core/json_excerpt.h"
#include "core/json_parse.h"
#include "latency_stats.h"
#include "progress_bar.h"

namespace origami::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

struct BenchServeFlags {
  std::string base_url = "http://127.0.0.1:8000";
  std::string model;  // default: the server's first model
  int num_prompts = 64;
  int input_len = 128;
  int output_len = 128;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 0;  // 0: no limit
  uint64_t dataset_seed = 0;
  int vocab_size = 0;  // 0: the server's (model card "vocab_size")
  uint64_t arrival_seed = 0;
  bool json = false;
  bool quiet = false;
};

struct Target {
  std::string host;
  std::string port;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  double ttft = 0.0;  // seconds
  double e2e = 0.0;
  int output_tokens = 0;
  std::vector<double> itl;  // gaps between streamed text events
};

bool parse_base_url(const std::string& url, Target* t) {
  const std::string prefix = "http://";
  if (url.rfind(prefix, 0) != 0) return false;
  std::string rest = url.substr(prefix.size());
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  t->host = colon == std::string::npos ? rest : rest.substr(0, colon);
  t->port = colon == std::string::npos ? "80" : rest.substr(colon + 1);
  return !t->host.empty() && !t->port.empty();
}

// One HTTP exchange over a fresh connection; streams the SSE body to on_data.
net::awaitable<int> http_exchange(const Target& target, http::verb verb, const std::string& path, const std::string& body,
                                  const std::function<void(std::string_view)>& on_data, std::string* error) {
  auto executor = co_await net::this_coro::executor;
  beast::error_code ec;
  tcp::resolver resolver(executor);
  auto endpoints = co_await resolver.async_resolve(target.host, target.port, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    *error = "resolve " + target.host + ": " + ec.message();
    co_return 0;
  }
  beast::tcp_stream stream(executor);
  co_await stream.async_connect(endpoints, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    *error = "connect: " + ec.message();
    co_return 0;
  }
  stream.socket().set_option(tcp::no_delay(true), ec);
  http::request<http::string_body> req{verb, path, 11};
  req.set(http::field::host, target.host);
  req.set(http::field::content_type, "application/json");
  req.keep_alive(false);
  req.body() = body;
  req.prepare_payload();
  co_await http::async_write(stream, req, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    *error = "send: " + ec.message();
    co_return 0;
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  auto on_chunk = [&](std::uint64_t, beast::string_view data, beast::error_code&) -> std::size_t {
    on_data(std::string_view(data.data(), data.size()));
    return data.size();
  };
  parser.on_chunk_body(on_chunk);
  co_await http::async_read_header(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
  while (!ec && !parser.is_done()) co_await http::async_read_some(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
  if (ec && ec != http::error::end_of_stream) {
    *error = "receive: " + ec.message();
    co_return 0;
  }
  if (!parser.get().body().empty()) on_data(parser.get().body());  // not chunked (errors, JSON)
  const int status = parser.get().result_int();
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  co_return status;
}

// A field of a server's answer, or `fallback` when the answer is not shaped as expected: a
// misbehaving server counts as failed requests, never an exception out of the client.
std::string string_field(const nlohmann::json& obj, const char* key, const char* fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}
int int_field(const nlohmann::json& obj, const char* key, int fallback) {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  if (it == obj.end() || !it->is_number_integer()) return fallback;
  const int64_t v = it->is_number_unsigned() ? std::numeric_limits<int>::max() : it->get<int64_t>();
  return static_cast<int>(std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

// Sends one streaming completion and times its SSE events.
net::awaitable<RequestResult> run_request(const Target& target, const std::string& body) {
  RequestResult r;
  const Clock::time_point start = Clock::now();
  Clock::time_point last = start;
  bool first = true;
  std::string pending, raw;
  auto on_data = [&](std::string_view data) {
    raw.append(data.substr(0, std::min<size_t>(data.size(), 2000 - std::min<size_t>(raw.size(), 2000))));
    pending.append(data);
    size_t pos;
    while ((pos = pending.find("\n\n")) != std::string::npos) {
      const std::string event = pending.substr(0, pos);
      pending.erase(0, pos + 2);
      if (event.rfind("data: ", 0) != 0 || event == "data: [DONE]") continue;
      Expected<nlohmann::json> parsed = parse_json(std::string_view(event).substr(6), kRequestJsonMaxDepth);
      if (!parsed || !parsed->is_object()) continue;
      const nlohmann::json& j = *parsed;
      if (j.contains("error")) r.error = string_field(j["error"], "message", "error event");
      if (j.contains("usage")) r.output_tokens = int_field(j["usage"], "completion_tokens", 0);
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const std::string text = string_field(j["choices"][0], "text", "");
      if (text.empty()) continue;
      const Clock::time_point now = Clock::now();
      if (first) {
        r.ttft = std::chrono::duration<double>(now - start).count();
        first = false;
      } else {
        r.itl.push_back(std::chrono::duration<double>(now - last).count());
      }
      last = now;
    }
  };
  std::string error;
  const int status = co_await http_exchange(target, http::verb::post, "/v1/completions", body, on_data, &error);
  r.e2e = std::chrono::duration<double>(Clock::now() - start).count();
  if (status != 200) {
    r.error = !error.empty() ? error : "HTTP " + std::to_string(status) + ": " + raw;
  } else if (r.error.empty()) {
    r.ok = r.output_tokens > 0;
    if (!r.ok) r.error = "no usage in the stream";
  }
  co_return r;
}

// GET /v1/models: the served model's name and vocabulary size.
net::awaitable<void> fetch_model(const Target& target, std::string* model, int* vocab, std::string* error) {
  std::string body;
  const int status = co_await http_exchange(target, http::verb::get, "/v1/models", "", [&](std::string_view d) { body.append(d); }, error);
  if (status != 200) {
    if (error->empty()) *error = "GET /v1/models: HTTP " + std::to_string(status);
    co_return;
  }
  Expected<nlohmann::json> parsed = parse_json(body, kRequestJsonMaxDepth);
  if (!parsed || !parsed->is_object() || !parsed->contains("data") || !(*parsed)["data"].is_array() || (*parsed)["data"].empty()) {
    *error = "GET /v1/models: no model in " + text_excerpt(body);
    co_return;
  }
  const nlohmann::json& j = *parsed;
  if (model->empty()) *model = string_field(j["data"][0], "id", "");
  if (*vocab <= 0) *vocab = int_field(j["data"][0], "vocab_size", 0);
}

int run_bench_serve(const BenchServeFlags& f) {
  Target target;
  if (!parse_base_url(f.base_url, &target)) {
    print_error("--base-url must look like http://HOST:PORT, got '" + f.base_url + "'");
    return 2;
  }
  if (f.num_prompts < 1 || f.input_len < 1 || f.output_len < 1 || f.max_concurrency < 0 || !(f.request_rate > 0)) {
    print_error("--num-prompts, --input-len, --output-len and --request-rate must be positive, --max-concurrency >= 0");
    return 2;
  }
  net::io_context ioc(1);
  std::string model = f.model, error;
  int vocab = f.vocab_size;
  net::co_spawn(ioc, fetch_model(target, &model, &vocab, &error), net::detached);
  ioc.run();
  if (!error.empty() || vocab <= 0) {
    print_error(!error.empty() ? error : "the server does not say its vocab_size; pass --vocab-size");
    return 1;
  }

  // The prompts `origami bench` draws (same generator, same order), greedy, exactly output_len
  // tokens each (ignore_eos).
  std::mt19937_64 rng(f.dataset_seed);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::string> bodies(f.num_prompts);
  for (auto& body : bodies) {
    std::vector<int32_t> ids(f.input_len);
    for (auto& t : ids) t = token(rng);
    body = nlohmann::json{{"model", model}, {"prompt", ids}, {"max_tokens", f.output_len}, {"temperature", 0.0},
                          {"ignore_eos", true}, {"stream", true}, {"stream_options", {{"include_usage", true}}}}.dump();
  }
  // Poisson arrivals: exponential gaps of mean 1/rate (all at t = 0 when the rate is inf).
  std::vector<double> arrival(f.num_prompts, 0.0);
  if (std::isfinite(f.request_rate)) {
    std::mt19937_64 arng(f.arrival_seed);
    std::exponential_distribution<double> gap(f.request_rate);
    double t = 0.0;
    for (double& a : arrival) a = (t += gap(arng));
  }

  std::vector<RequestResult> results(f.num_prompts);
  size_t next = 0, done = 0;
  int64_t generated = 0;
  ProgressBar bar("bench serve");
  const Clock::time_point start = Clock::now();
  // --max-concurrency workers (one per request without a limit) take requests in arrival order.
  const int workers = f.max_concurrency > 0 ? std::min(f.max_concurrency, f.num_prompts) : f.num_prompts;
  for (int w = 0; w < workers; ++w) {
    net::co_spawn(ioc, [&]() -> net::awaitable<void> {
      net::steady_timer timer(co_await net::this_coro::executor);
      while (next < bodies.size()) {
        const size_t i = next++;
        timer.expires_at(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrival[i])));
        beast::error_code ec;
        co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
        results[i] = co_await run_request(target, bodies[i]);
        generated += results[i].output_tokens;
        ++done;
        if (!f.quiet) bar.update(done, bodies.size(), generated);
      }
    }, net::detached);
  }
  ioc.restart();
  ioc.run();
  if (!f.quiet) bar.finish();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();

  std::vector<double> ttft, tpot, itl, e2e;
  int failed = 0;
  int64_t out_tokens = 0;
  std::string first_error;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    out_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2e.push_back(r.e2e);
    if (r.output_tokens > 1) tpot.push_back((r.e2e - r.ttft) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  const int completed = f.num_prompts - failed;
  nlohmann::json j;
  j["base_url"] = f.base_url;
  j["model"] = model;
  j["num_prompts"] = f.num_prompts;
  j["input_len"] = f.input_len;
  j["output_len"] = f.output_len;
  j["request_rate"] = std::isfinite(f.request_rate) ? nlohmann::json(f.request_rate) : nlohmann::json("inf");
  j["max_concurrency"] = f.max_concurrency;
  j["completed"] = completed;
  j["failed"] = failed;
  if (!first_error.empty()) j["first_error"] = first_error;
  j["duration_seconds"] = wall;
  j["request_throughput"] = completed / wall;
  j["output_tokens"] = out_tokens;
  j["output_tokens_per_second"] = out_tokens / wall;
  j["total_tokens_per_second"] = (out_tokens + static_cast<int64_t>(completed) * f.input_len) / wall;
  for (const auto& [name, v] : {std::pair<const char*, const std::vector<double>*>{"ttft", &ttft}, {"tpot", &tpot}, {"itl", &itl}, {"e2el", &e2e}}) {
    j[std::string("mean_") + name + "_ms"] = mean_of(*v) * 1e3;
    j[std::string("median_") + name + "_ms"] = percentile_of(*v, 50) * 1e3;
    j[std::string("p99_") + name + "_ms"] = percentile_of(*v, 99) * 1e3;
  }
  if (f.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("============ Serving Benchmark Result ============\n");
    std::printf("%-34s %d\n", "Successful requests:", completed);
    std::printf("%-34s %d\n", "Failed requests:", failed);
    if (!first_error.empty()) std::printf("%-34s %s\n", "First error:", first_error.c_str());
    std::printf("%-34s %s\n", "Request rate (req/s):", j["request_rate"].dump().c_str());
    std::printf("%-34s %d\n", "Max concurrency:", f.max_concurrency);
    std::printf("%-34s %.2f\n", "Benchmark duration (s):", wall);
    std::printf("%-34s %lld\n", "Total generated tokens:", static_cast<long long>(out_tokens));
    std::printf("%-34s %.2f\n", "Request throughput (req/s):", j["request_throughput"].get<double>());
    std::printf("%-34s %.2f\n", "Output token throughput (tok/s):", j["output_tokens_per_second"].get<double>());
    std::printf("%-34s %.2f\n", "Total token throughput (tok/s):", j["total_tokens_per_second"].get<double>());
    for (const char* name : {"ttft", "tpot", "itl", "e2el"}) {
      std::printf("%-34s %.2f\n", (std::string("Mean ") + name + " (ms):").c_str(), j[std::string("mean_") + name + "_ms"].get<double>());
      std::printf("%-34s %.2f\n", (std::string("Median ") + name + " (ms):").c_str(), j[std::string("median_") + name + "_ms"].get<double>());
      std::printf("%-34s %.2f\n", (std::string("P99 ") + name + " (ms):").c_str(), j[std::string("p99_") + name + "_ms"].get<double>());
    }
    std::printf("==================================================\n");
  }
  return failed == f.num_prompts ? 1 : 0;
}

}  // namespace

void register_bench_serve_command(CLI::App& bench) {
  auto flags = std::make_shared<BenchServeFlags>();
  CLI::App* cmd = bench.add_subcommand("serve", "Online benchmark of a running `origami serve` (or any OpenAI-compatible server)");
  cmd->add_option("--base-url", flags->base_url, "The server, http://HOST:PORT")->capture_default_str();
  cmd->add_option("--model", flags->model, "Model name to send (default: the server's)");
  cmd->add_option("--num-prompts", flags->num_prompts, "Number of requests")->capture_default_str();
  cmd->add_option("--input-len", flags->input_len, "Prompt length (random token ids, as `origami bench`)")->capture_default_str();
  cmd->add_option("--output-len", flags->output_len, "Tokens generated per request (ignore_eos)")->capture_default_str();
  cmd->add_option("--request-rate", flags->request_rate, "Requests per second, Poisson arrivals (inf: all at once)");
  cmd->add_option("--max-concurrency", flags->max_concurrency, "Most requests in flight (0: no limit)")->capture_default_str();
  cmd->add_option("--dataset-seed", flags->dataset_seed, "Seed of the random prompts (as `origami bench`)");
  cmd->add_option("--arrival-seed", flags->arrival_seed, "Seed of the Poisson arrivals");
  cmd->add_option("--vocab-size", flags->vocab_size, "Token ids are drawn below this (default: the server's vocab_size)");
  cmd->add_flag("--json", flags->json, "Print the results as one JSON object");
  cmd->add_flag("--quiet", flags->quiet, "No progress bar");
  // `bench` runs its own (offline) benchmark when its callback runs; ending the parse here with
  // the exit code keeps it from running after `bench serve`.
  cmd->callback([flags] {
    const int code = run_bench_serve(*flags);
    if (code != 0) throw CLI::RuntimeError(code);
    throw CLI::Success();
  });
}

}  // namespace origami::cli
