#pragma once
// An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with
// its HTTP status (400 bad request, 401 no/wrong API key, 404 unknown route or model, 413 body
// too large, 500 a request the server failed to read (a bug, caught at the route), 503 queue full
// or shutting down).
#include <string>

#include <nlohmann/json.hpp>

namespace origami::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the request field at fault, if one is
  std::string code;

  nlohmann::json to_json() const {
    nlohmann::json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty()) e["code"] = code;
    return {{"error", e}};
  }

  static ApiError bad_request(std::string message, std::string param = "") {
    return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
  }
  static ApiError not_found(std::string message, std::string code = "not_found") {
    return ApiError{404, std::move(message), "invalid_request_error", "", std::move(code)};
  }
  static ApiError unauthorized() {
    return ApiError{401, "Incorrect or missing API key (send 'Authorization: Bearer <key>')", "authentication_error", "",
                    "invalid_api_key"};
  }
  static ApiError too_large(size_t limit) {
    return ApiError{413, "Request body exceeds the limit of " + std::to_string(limit) + " bytes",
                    "invalid_request_error", "", "request_too_large"};
  }
  static ApiError internal(std::string message) {
    return ApiError{500, std::move(message), "server_error", "", "internal_error"};
  }
  static ApiError unavailable(std::string message) {
    return ApiError{503, std::move(message), "server_error", "", "service_unavailable"};
  }
};

}  // namespace origami::server
