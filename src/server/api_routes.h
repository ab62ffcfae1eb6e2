#pragma once
// The endpoints that answer at once (no engine step): GET /health, /v1/models, /metrics and
// POST /tokenize, /detokenize; plus the API-key check and the route table's lookups shared with
// the generation endpoints. Free of I/O: the HTTP session sends what these return.
#include <optional>
#include <string>

#include "server/api_error.h"
#include "server/server_context.h"

namespace origami::server {

struct SimpleResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;

  static SimpleResponse json(const nlohmann::json& j, int status = 200);
  static SimpleResponse error(const ApiError& e) { return json(e.to_json(), e.status); }
};

enum class Route { kHealth, kModels, kMetrics, kTokenize, kDetokenize, kCompletions, kChatCompletions, kUnknown };

// The route of a method and target (query string ignored); a known path with the wrong method
// is kUnknown too.
Route find_route(const std::string& method, const std::string& target);
// nullopt when the request may proceed: no key configured, a route outside /v1, or the key.
std::optional<ApiError> check_api_key(const ServerContext& ctx, const std::string& target, const std::string& authorization);
// The response of a route that answers at once.
SimpleResponse handle_simple(const ServerContext& ctx, Route route, const std::string& body);

}  // namespace origami::server
