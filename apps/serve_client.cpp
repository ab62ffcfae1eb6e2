#include "serve_client.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami::cli {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

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
  // A JSON parser reads every non-negative integer as unsigned: clamp those beyond int64 first.
  const int64_t v = it->is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(it->get<uint64_t>(), INT64_MAX))
                                             : it->get<int64_t>();
  return static_cast<int>(std::clamp<int64_t>(v, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

// Appends a chunk choice's "token_ids" to *ids; false when they are not a list of token ids.
bool append_token_ids(const nlohmann::json& choice, std::vector<int32_t>* ids, bool* present) {
  if (!choice.is_object()) return true;
  const auto it = choice.find("token_ids");
  if (it == choice.end() || it->is_null()) return true;
  if (!it->is_array()) return false;
  for (const nlohmann::json& t : *it) {
    if (!t.is_number_integer()) return false;
    const int64_t v = t.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), INT64_MAX)) : t.get<int64_t>();
    if (v < 0 || v > std::numeric_limits<int32_t>::max()) return false;
    ids->push_back(static_cast<int32_t>(v));
  }
  *present = true;
  return true;
}

}  // namespace

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
      if (j.contains("usage")) {
        r.output_tokens = int_field(j["usage"], "completion_tokens", 0);
        r.prompt_tokens = int_field(j["usage"], "prompt_tokens", 0);
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      if (!append_token_ids(j["choices"][0], &r.token_ids, &r.has_token_ids) && r.error.empty())
        r.error = "a chunk's token_ids are not a list of token ids: " + text_excerpt(event);
      const std::string text = string_field(j["choices"][0], "text", "");
      if (text.empty()) continue;
      r.text += text;
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


net::awaitable<std::vector<int32_t>> fetch_tokens(const Target& target, const std::string& model, const std::string& text,
                                                  std::string* error) {
  std::string body;
  const std::string request = nlohmann::json{{"model", model}, {"prompt", text}, {"add_special_tokens", false}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
  const int status = co_await http_exchange(target, http::verb::post, "/tokenize", request, [&](std::string_view d) { body.append(d); }, error);
  std::vector<int32_t> ids;
  if (status != 200) {
    if (error->empty()) *error = "POST /tokenize: HTTP " + std::to_string(status) + ": " + text_excerpt(body);
    co_return ids;
  }
  Expected<nlohmann::json> parsed = parse_json(body, kRequestJsonMaxDepth);
  if (!parsed || !parsed->is_object() || !parsed->contains("tokens") || !(*parsed)["tokens"].is_array()) {
    *error = "POST /tokenize: no tokens in " + text_excerpt(body);
    co_return ids;
  }
  for (const nlohmann::json& t : (*parsed)["tokens"]) {
    if (!t.is_number_integer()) {
      *error = "POST /tokenize: a token that is not an id in " + text_excerpt(body);
      co_return std::vector<int32_t>{};
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  co_return ids;
}

net::awaitable<std::map<std::string, double>> fetch_metrics(const Target& target) {
  std::string body, error;
  const int status = co_await http_exchange(target, http::verb::get, "/metrics", "", [&](std::string_view d) { body.append(d); }, &error);
  std::map<std::string, double> values;
  if (status != 200) co_return values;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find('\n', pos);
    if (end == std::string::npos) end = body.size();
    const std::string_view line(body.data() + pos, end - pos);
    pos = end + 1;
    if (line.rfind("origami:", 0) != 0) continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string_view::npos || value_at == std::string_view::npos || value_at + 1 >= line.size()) continue;
    const std::string name(line.substr(8, name_end - 8));
    if (name.ends_with("_bucket") || name.ends_with("_sum") || name.ends_with("_count")) continue;
    char* parse_end = nullptr;
    const std::string number(line.substr(value_at + 1));
    const double v = std::strtod(number.c_str(), &parse_end);
    if (parse_end == number.c_str()) continue;
    values[name] += v;
  }
  co_return values;
}

}  // namespace origami::cli
