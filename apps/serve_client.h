#pragma once
// The HTTP client of `origami bench serve` (Boost.Beast coroutines on one io_context): one
// exchange per fresh connection, streaming completions timed per SSE event, the server's model
// card, its /tokenize and its /metrics. A misbehaving server yields failed requests and error
// strings, never an exception out of the client.
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>  // Boost 1.74 awaitable.hpp uses std::exchange without including it
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/http/verb.hpp>

namespace origami::cli {

struct Target {
  std::string host;
  std::string port;
};

// "http://HOST:PORT[/...]" -> host and port (80 when absent); false when not of that form.
bool parse_base_url(const std::string& url, Target* t);

struct RequestResult {
  bool ok = false;
  std::string error;
  double ttft = 0.0;  // seconds
  double e2e = 0.0;
  int output_tokens = 0;
  int prompt_tokens = 0;  // usage.prompt_tokens (0 when the server does not say)
  std::vector<double> itl;  // gaps between streamed text events
  std::string text;  // the streamed completion
  // The chunks' "token_ids" (the request asked for "return_token_ids"); has_token_ids: some
  // chunk carried them (a server without the field sends none).
  std::vector<int32_t> token_ids;
  bool has_token_ids = false;
};

// One HTTP exchange over a fresh connection; the body goes to on_data as it arrives. Returns
// the HTTP status, 0 (and *error) when the exchange itself failed.
boost::asio::awaitable<int> http_exchange(const Target& target, boost::beast::http::verb verb, const std::string& path,
                                          const std::string& body, const std::function<void(std::string_view)>& on_data,
                                          std::string* error);

// Sends one streaming /v1/completions request (with stream_options.include_usage) and times
// its SSE events; collects the generated ids when the body asks for "return_token_ids".
boost::asio::awaitable<RequestResult> run_request(const Target& target, const std::string& body);

// GET /v1/models: the served model's name (when *model is empty) and vocabulary size (when
// *vocab <= 0); *error when the server does not answer as expected.
boost::asio::awaitable<void> fetch_model(const Target& target, std::string* model, int* vocab, std::string* error);

// POST /tokenize of `text` without special tokens: the server's token ids; *error on failure.
boost::asio::awaitable<std::vector<int32_t>> fetch_tokens(const Target& target, const std::string& model,
                                                          const std::string& text, std::string* error);

// GET /metrics: every sample `origami:NAME{labels} value` summed over labels per NAME
// (histogram buckets, sums and counts left out); empty when the server has no /metrics.
boost::asio::awaitable<std::map<std::string, double>> fetch_metrics(const Target& target);

}  // namespace origami::cli
