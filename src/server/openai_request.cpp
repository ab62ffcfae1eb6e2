#include "server/openai_request.h"

#include "engine/request_options_json.h"
#include "engine/sampling_json.h"
#include "sampling/logprob.h"

namespace origami::server {
namespace {

bool is_token_list(const nlohmann::json& v) {
  if (!v.is_array() || v.empty()) return false;
  for (const auto& e : v)
    if (!e.is_number_integer()) return false;
  return true;
}

std::optional<ApiError> read_prompts(const nlohmann::json& body, const RequestContext& ctx,
                                     std::vector<std::vector<int32_t>>* prompts) {
  if (!body.contains("prompt") || body["prompt"].is_null()) return ApiError::bad_request("'prompt' is required", "prompt");
  const auto& p = body["prompt"];
  std::vector<nlohmann::json> items;  // each a string or a token list
  if (p.is_string() || is_token_list(p)) {
    items.push_back(p);
  } else if (p.is_array() && !p.empty()) {
    for (const auto& e : p) {
      if (!e.is_string() && !is_token_list(e))
        return ApiError::bad_request("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids", "prompt");
      items.push_back(e);
    }
  } else {
    return ApiError::bad_request("'prompt' must be a non-empty string, list of strings or list of token ids", "prompt");
  }
  for (const auto& item : items) {
    Expected<std::vector<int32_t>> ids = ctx.builder->from_json(nlohmann::json{{"prompt", item}});
    if (!ids) return ApiError::bad_request(ids.status().message(), "prompt");
    prompts->push_back(std::move(*ids));
  }
  return std::nullopt;
}

std::optional<ApiError> read_messages(const nlohmann::json& body, const RequestContext& ctx,
                                      std::vector<std::vector<int32_t>>* prompts) {
  if (!body.contains("messages")) return ApiError::bad_request("'messages' is required", "messages");
  nlohmann::json messages;
  if (auto e = normalize_messages(body["messages"], &messages)) return e;
  nlohmann::json kwargs = nlohmann::json::object();
  if (body.contains("chat_template_kwargs") && !body["chat_template_kwargs"].is_null()) {
    kwargs = body["chat_template_kwargs"];
    if (!kwargs.is_object()) return ApiError::bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
  }
  Expected<std::vector<int32_t>> ids = [&] {
    std::lock_guard<std::mutex> lock(*ctx.builder_mutex);
    return ctx.builder->from_messages(messages, kwargs);
  }();
  if (!ids) return ApiError::bad_request(ids.status().message(), "messages");
  prompts->push_back(std::move(*ids));
  return std::nullopt;
}

// Fields OpenAI defines that origami does not implement: refused rather than ignored, so that a
// client never gets an answer to a different question than it asked.
std::optional<ApiError> refuse_unsupported(const nlohmann::json& body) {
  for (const char* f : {"presence_penalty", "frequency_penalty"})
    if (body.contains(f) && !body[f].is_null() && !(body[f].is_number() && body[f].get<double>() == 0.0))
      return ApiError::bad_request(std::string("'") + f + "' is not supported by origami", f);
  if (body.contains("logit_bias") && !body["logit_bias"].is_null() && !body["logit_bias"].empty())
    return ApiError::bad_request("'logit_bias' is not supported by origami", "logit_bias");
  if (body.contains("echo") && body["echo"].is_boolean() && body["echo"].get<bool>())
    return ApiError::bad_request("'echo' is not supported by origami", "echo");
  if (body.contains("suffix") && !body["suffix"].is_null())
    return ApiError::bad_request("'suffix' is not supported by origami", "suffix");
  if (body.contains("tools") && !body["tools"].is_null() && !body["tools"].empty())
    return ApiError::bad_request("'tools' are not supported by origami", "tools");
  return std::nullopt;
}

// An integer in [0, kMaxTopLogprobs], or null (absent).
std::optional<ApiError> read_logprob_count(const nlohmann::json& body, const char* field, std::optional<int>* out) {
  if (!body.contains(field) || body[field].is_null()) return std::nullopt;
  const auto& v = body[field];
  if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxTopLogprobs)
                                                        : v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTopLogprobs))
    return ApiError::bad_request(std::string("'") + field + "' must be an integer in [0, " +
                                     std::to_string(kMaxTopLogprobs) + "], got " + v.dump(),
                                 field);
  *out = v.get<int>();
  return std::nullopt;
}

// Completions: "logprobs": N (the sampled token's and the N most likely tokens' log-probs).
// Chat: "logprobs": true, with "top_logprobs": N alternatives (0 by default). -1: none.
std::optional<ApiError> read_logprobs(const nlohmann::json& body, ApiKind kind, int* out) {
  *out = -1;
  std::optional<int> top;
  if (kind == ApiKind::kCompletion) {
    if (body.contains("top_logprobs") && !body["top_logprobs"].is_null())
      return ApiError::bad_request("'top_logprobs' belongs to the chat API; completions take 'logprobs': N", "top_logprobs");
    if (auto e = read_logprob_count(body, "logprobs", &top)) return e;
    if (top) *out = *top;
    return std::nullopt;
  }
  bool wanted = false;
  if (body.contains("logprobs") && !body["logprobs"].is_null()) {
    if (!body["logprobs"].is_boolean()) return ApiError::bad_request("'logprobs' must be true or false", "logprobs");
    wanted = body["logprobs"].get<bool>();
  }
  if (auto e = read_logprob_count(body, "top_logprobs", &top)) return e;
  if (top && *top > 0 && !wanted)
    return ApiError::bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (wanted) *out = top.value_or(0);
  return std::nullopt;
}

std::optional<ApiError> read_bool(const nlohmann::json& obj, const char* field, bool* out) {
  if (!obj.contains(field) || obj[field].is_null()) return std::nullopt;
  if (!obj[field].is_boolean()) return ApiError::bad_request(std::string("'") + field + "' must be true or false", field);
  *out = obj[field].get<bool>();
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_json_body(std::string_view body, nlohmann::json* out) {
  *out = nlohmann::json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return ApiError::bad_request("the request body is not valid JSON");
  if (!out->is_object()) return ApiError::bad_request("the request body must be a JSON object");
  return std::nullopt;
}

std::optional<ApiError> check_model(const nlohmann::json& body, const std::string& served_model_name) {
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return ApiError::bad_request("'model' must be a string", "model");
  const std::string model = body["model"].get<std::string>();
  if (model != served_model_name)
    return ApiError::not_found("The model '" + model + "' does not exist (this server serves '" + served_model_name + "')",
                               "model_not_found");
  return std::nullopt;
}

std::optional<ApiError> normalize_messages(const nlohmann::json& messages, nlohmann::json* out) {
  if (!messages.is_array() || messages.empty())
    return ApiError::bad_request("'messages' must be a non-empty list of {role, content} objects", "messages");
  *out = nlohmann::json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return ApiError::bad_request(where + " needs a string 'role'", "messages");
    nlohmann::json msg = m;
    const nlohmann::json content = m.value("content", nlohmann::json(nullptr));
    if (content.is_null()) {
      msg["content"] = "";
    } else if (content.is_array()) {
      // A list of text parts is the concatenation of their texts, one per line (as vLLM does).
      std::string text;
      for (size_t j = 0; j < content.size(); ++j) {
        const auto& part = content[j];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          return ApiError::bad_request(where + ".content[" + std::to_string(j) + "] must be {\"type\": \"text\", \"text\": ...} (only text parts are supported)", "messages");
        if (j > 0) text += "\n";
        text += part["text"].get<std::string>();
      }
      msg["content"] = text;
    } else if (!content.is_string()) {
      return ApiError::bad_request(where + ".content must be a string or a list of text parts", "messages");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_generation_request(const nlohmann::json& body, ApiKind kind, const RequestContext& ctx,
                                                 GenerationRequest* out) {
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  out->kind = kind;
  if (auto e = check_model(body, ctx.served_model_name)) return e;
  if (auto e = refuse_unsupported(body)) return e;
  if (auto e = kind == ApiKind::kChat ? read_messages(body, ctx, &out->prompts) : read_prompts(body, ctx, &out->prompts)) return e;

  size_t longest = 0;
  for (const auto& p : out->prompts) {
    if (p.empty()) return ApiError::bad_request("the prompt is empty", kind == ApiKind::kChat ? "messages" : "prompt");
    longest = std::max(longest, p.size());
  }
  if (static_cast<int>(longest) >= ctx.max_model_len)
    return ApiError::bad_request("This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                                     " tokens. However, you requested " + std::to_string(longest) +
                                     " tokens in the prompt, which leaves no room for the completion.",
                                 kind == ApiKind::kChat ? "messages" : "prompt");

  // Sampling: OpenAI's defaults (temperature 1, completions 16 tokens, chat up to the context).
  nlohmann::json fields = body;
  if (kind == ApiKind::kChat && body.contains("max_completion_tokens") && !body["max_completion_tokens"].is_null())
    fields["max_tokens"] = body["max_completion_tokens"];
  SamplingParams defaults;
  defaults.max_tokens = kind == ApiKind::kChat ? std::max(1, ctx.max_model_len - static_cast<int>(longest)) : 16;
  Expected<SamplingParams> sp = sampling_params_from_json(fields, defaults);
  if (!sp) return ApiError::bad_request(sp.status().message());
  out->sampling = std::move(*sp);

  Expected<RequestOptions> opts =
      request_options_from_json(body, {}, ctx.head_budgets != nullptr ? *ctx.head_budgets : HeadBudgetsResolver{});
  if (!opts) return ApiError::bad_request(opts.status().message());
  out->options = std::move(*opts);
  if (auto e = read_logprobs(body, kind, &out->options.logprobs)) return e;

  if (body.contains("n") && !body["n"].is_null()) {
    if (!body["n"].is_number_integer() || body["n"].get<int64_t>() < 1 || body["n"].get<int64_t>() > ctx.max_n)
      return ApiError::bad_request("'n' must be an integer in [1, " + std::to_string(ctx.max_n) + "], got " + body["n"].dump(), "n");
    out->n = body["n"].get<int>();
  }
  if (body.contains("best_of") && !body["best_of"].is_null() &&
      !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == out->n))
    return ApiError::bad_request("'best_of' other than n is not supported by origami", "best_of");
  if (auto e = read_bool(body, "stream", &out->stream)) return e;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const auto& so = body["stream_options"];
    if (!so.is_object()) return ApiError::bad_request("'stream_options' must be an object", "stream_options");
    if (!out->stream) return ApiError::bad_request("'stream_options' needs 'stream': true", "stream_options");
    if (auto e = read_bool(so, "include_usage", &out->include_usage)) return e;
    if (auto e = read_bool(so, "continuous_usage_stats", &out->continuous_usage)) return e;
  }
  return std::nullopt;
}

}  // namespace origami::server
