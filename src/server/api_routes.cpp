#include "server/api_routes.h"

#include "core/json_excerpt.h"
#include "server/openai_response.h"

namespace origami::server {
namespace {

SimpleResponse handle_tokenize(const ServerContext& ctx, const nlohmann::json& body) {
  if (auto e = check_model(body, ctx.config.served_model_name)) return SimpleResponse::error(*e);
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    nlohmann::json messages;
    if (auto e = normalize_messages(body["messages"], &messages)) return SimpleResponse::error(*e);
    std::lock_guard<std::mutex> lock(ctx.builder_mutex);
    Expected<std::vector<int32_t>> r = ctx.builder.from_messages(messages);
    if (!r) return SimpleResponse::error(ApiError::bad_request(r.status().message(), "messages"));
    ids = std::move(*r);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    bool add_special = true;
    if (body.contains("add_special_tokens")) {
      if (!body["add_special_tokens"].is_boolean())
        return SimpleResponse::error(ApiError::bad_request("'add_special_tokens' must be true or false", "add_special_tokens"));
      add_special = body["add_special_tokens"].get<bool>();
    }
    ids = ctx.worker->tokenizer()->encode(body["prompt"].get<std::string>(), add_special);
  } else {
    return SimpleResponse::error(ApiError::bad_request("send a string 'prompt' or a list of 'messages'", "prompt"));
  }
  return SimpleResponse::json({{"count", ids.size()}, {"max_model_len", ctx.worker->config().max_model_len}, {"tokens", ids}});
}

SimpleResponse handle_detokenize(const ServerContext& ctx, const nlohmann::json& body) {
  if (auto e = check_model(body, ctx.config.served_model_name)) return SimpleResponse::error(*e);
  if (!body.contains("tokens") || !body["tokens"].is_array())
    return SimpleResponse::error(ApiError::bad_request("'tokens' must be a list of token ids", "tokens"));
  const int vocab = ctx.worker->tokenizer()->vocab_size();
  std::vector<int32_t> ids;
  for (const auto& t : body["tokens"]) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      return SimpleResponse::error(
          ApiError::bad_request("'tokens' holds " + json_excerpt(t) + ", not a token id in [0, " + std::to_string(vocab) + ")", "tokens"));
    ids.push_back(t.get<int32_t>());
  }
  return SimpleResponse::json({{"prompt", ctx.worker->tokenizer()->decode(ids)}});
}

}  // namespace

SimpleResponse SimpleResponse::json(const nlohmann::json& j, int status) {
  return SimpleResponse{status, "application/json", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

Route find_route(const std::string& method, const std::string& target) {
  const std::string path = target.substr(0, target.find('?'));
  if (method == "GET") {
    if (path == "/health") return Route::kHealth;
    if (path == "/v1/models") return Route::kModels;
    if (path == "/metrics") return Route::kMetrics;
  } else if (method == "POST") {
    if (path == "/tokenize") return Route::kTokenize;
    if (path == "/detokenize") return Route::kDetokenize;
    if (path == "/v1/completions") return Route::kCompletions;
    if (path == "/v1/chat/completions") return Route::kChatCompletions;
  }
  return Route::kUnknown;
}

std::optional<ApiError> check_api_key(const ServerContext& ctx, const std::string& target, const std::string& authorization) {
  if (ctx.config.api_key.empty() || target.rfind("/v1", 0) != 0) return std::nullopt;
  if (authorization == "Bearer " + ctx.config.api_key) return std::nullopt;
  return ApiError::unauthorized();
}

namespace {

SimpleResponse route_simple(const ServerContext& ctx, Route route, const std::string& body) {
  switch (route) {
    case Route::kHealth: return SimpleResponse{200, "application/json", "{}"};
    case Route::kModels:
      return SimpleResponse::json(models_json(ctx.config.served_model_name, ctx.created, ctx.worker->config().max_model_len,
                                              ctx.worker->model_config().vocab_size));
    case Route::kMetrics: return SimpleResponse{200, "text/plain; version=0.0.4; charset=utf-8", ctx.metrics->render()};
    case Route::kTokenize:
    case Route::kDetokenize: {
      nlohmann::json j;
      if (auto e = parse_json_body(body, &j)) return SimpleResponse::error(*e);
      return route == Route::kTokenize ? handle_tokenize(ctx, j) : handle_detokenize(ctx, j);
    }
    default: break;
  }
  return SimpleResponse::error(ApiError::not_found("no route for this method and path"));
}

}  // namespace

SimpleResponse handle_simple(const ServerContext& ctx, Route route, const std::string& body) {
  // As parse_generation_request: an exception a handler missed answers 500, never a dropped connection.
  try {
    return route_simple(ctx, route, body);
  } catch (const std::exception& e) {
    return SimpleResponse::error(ApiError::internal("handling the request failed: " + text_excerpt(e.what())));
  } catch (...) {
    return SimpleResponse::error(ApiError::internal("handling the request failed"));
  }
}

}  // namespace origami::server
