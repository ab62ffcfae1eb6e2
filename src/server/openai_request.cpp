#include "server/openai_request.h"

#include "core/json_excerpt.h"
#include "core/json_parse.h"
#include "engine/request_fields.h"
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

bool is_null_or(const nlohmann::json& v, bool (*is_default)(const nlohmann::json&)) {
  return v.is_null() || is_default(v);
}

// A field that OpenAI or vLLM defines and origami does not implement: accepted only at its
// default value (what a client that does not use it may still send), refused by name otherwise,
// so that a client never gets an answer to a different question than it asked.
struct UnsupportedField {
  const char* name;
  bool (*is_default)(const nlohmann::json&);  // besides null
  const char* what;                          // the default, for the message; null: only null
};

bool never(const nlohmann::json&) { return false; }
bool is_false(const nlohmann::json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const nlohmann::json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_empty_list(const nlohmann::json& v) { return v.is_array() && v.empty(); }
bool is_empty_string(const nlohmann::json& v) { return v.is_string() && v.get<std::string>().empty(); }
bool is_none_choice(const nlohmann::json& v) { return v.is_string() && v.get<std::string>() == "none"; }
bool is_one(const nlohmann::json& v) { return v.is_number() && v.get<double>() == 1.0; }
// (json::value() would throw on a non-string "type"; == compares without throwing.)
bool is_text_format(const nlohmann::json& v) { return v.is_object() && v.size() == 1 && v.contains("type") && v["type"] == "text"; }
bool is_text_modality(const nlohmann::json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }

constexpr UnsupportedField kUnsupportedFields[] = {
    {"response_format", is_text_format, "{\"type\": \"text\"}"},
    {"tools", is_empty_list, "[]"},
    {"tool_choice", is_none_choice, "\"none\""},
    {"functions", is_empty_list, "[]"},
    {"function_call", is_none_choice, "\"none\""},
    {"echo", is_false, "false"},
    {"suffix", is_empty_string, "\"\""},
    {"use_beam_search", is_false, "false"},
    {"length_penalty", is_one, "1"},
    {"guided_json", never, nullptr},
    {"guided_regex", never, nullptr},
    {"guided_choice", never, nullptr},
    {"guided_grammar", never, nullptr},
    {"guided_decoding_backend", never, nullptr},
    {"guided_whitespace_pattern", never, nullptr},
    {"structured_outputs", never, nullptr},
    {"prompt_logprobs", never, nullptr},
    {"allowed_token_ids", never, nullptr},
    {"bad_words", is_empty_list, "[]"},
    {"logits_processors", never, nullptr},
    {"skip_special_tokens", is_true, "true"},
    {"spaces_between_special_tokens", is_true, "true"},
    {"truncate_prompt_tokens", never, nullptr},
    {"return_tokens_as_token_ids", is_false, "false"},
    {"chat_template", never, nullptr},
    {"add_generation_prompt", is_true, "true"},
    {"continue_final_message", is_false, "false"},
    {"audio", never, nullptr},
    {"modalities", is_text_modality, "[\"text\"]"},
    {"prediction", never, nullptr},
    {"reasoning_effort", never, nullptr},
    {"web_search_options", never, nullptr},
};

// Fields accepted and ignored: they do not change what is generated.
constexpr const char* kIgnoredFields[] = {"user", "metadata", "store", "service_tier", "parallel_tool_calls",
                                          "prompt_cache_key", "safety_identifier"};

// The fields each endpoint reads (besides the sampling and request-option fields).
const std::vector<std::string>& known_fields(ApiKind kind) {
  auto build = [](std::vector<std::string> own) {
    for (const auto* list : {&sampling_json_fields(), &request_options_json_fields()})
      own.insert(own.end(), list->begin(), list->end());
    for (const char* f : kIgnoredFields) own.emplace_back(f);
    for (const UnsupportedField& f : kUnsupportedFields) own.emplace_back(f.name);
    return own;
  };
  static const std::vector<std::string> kCompletion =
      build({"model", "prompt", "n", "best_of", "logprobs", "top_logprobs", "stream", "stream_options", "return_token_ids"});
  static const std::vector<std::string> kChat =
      build({"model", "messages", "n", "best_of", "logprobs", "top_logprobs", "max_completion_tokens", "stream",
             "stream_options", "chat_template_kwargs", "return_token_ids"});
  return kind == ApiKind::kChat ? kChat : kCompletion;
}

// Unknown fields (a typo) and unsupported fields at a non-default value are 400s naming them.
std::optional<ApiError> check_fields(const nlohmann::json& body, ApiKind kind) {
  std::string unknown;
  if (std::string msg = unknown_field_error(body, known_fields(kind), &unknown); !msg.empty())
    return ApiError::bad_request(msg, unknown);
  for (const UnsupportedField& f : kUnsupportedFields) {
    const auto it = body.find(f.name);
    if (it == body.end() || is_null_or(*it, f.is_default)) continue;
    std::string msg = std::string("'") + f.name + "' is not supported by origami";
    if (f.what != nullptr) msg += std::string(" (only ") + f.what + " or null is accepted)";
    return ApiError::bad_request(msg, f.name);
  }
  return std::nullopt;
}

// An integer in [0, kMaxTopLogprobs], or null (absent).
std::optional<ApiError> read_logprob_count(const nlohmann::json& body, const char* field, std::optional<int>* out) {
  if (!body.contains(field) || body[field].is_null()) return std::nullopt;
  const auto& v = body[field];
  if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(kMaxTopLogprobs)
                                                        : v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxTopLogprobs))
    return ApiError::bad_request(std::string("'") + field + "' must be an integer in [0, " +
                                     std::to_string(kMaxTopLogprobs) + "], got " + json_excerpt(v),
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

// One content part of a chat message: {"type": "text", "text": "..."}; anything else is a 400
// naming the part and what is wrong with it.
std::optional<ApiError> read_text_part(const nlohmann::json& part, const std::string& where, std::string* text) {
  if (!part.is_object())
    return ApiError::bad_request(where + " must be an object {\"type\": \"text\", \"text\": ...}, got " + json_excerpt(part),
                                 "messages");
  const auto type = part.find("type");
  if (type == part.end() || !type->is_string())
    return ApiError::bad_request(where + ".type must be the string \"text\", got " +
                                     (type == part.end() ? std::string("nothing") : json_excerpt(*type)),
                                 "messages");
  if (type->get_ref<const std::string&>() != "text")
    return ApiError::bad_request(where + ".type " + json_excerpt(*type) + " is not supported (only text parts are)", "messages");
  const auto t = part.find("text");
  if (t == part.end() || !t->is_string())
    return ApiError::bad_request(where + ".text must be a string, got " + (t == part.end() ? std::string("nothing") : json_excerpt(*t)),
                                 "messages");
  *text = t->get<std::string>();
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
  Expected<nlohmann::json> parsed = parse_json(body, kRequestJsonMaxDepth);
  if (!parsed) return ApiError::bad_request("the request body: " + parsed.status().message());
  *out = std::move(*parsed);
  if (!out->is_object()) return ApiError::bad_request("the request body must be a JSON object");
  return std::nullopt;
}

std::optional<ApiError> check_model(const nlohmann::json& body, const std::string& served_model_name) {
  if (!body.contains("model") || body["model"].is_null()) return std::nullopt;
  if (!body["model"].is_string()) return ApiError::bad_request("'model' must be a string", "model");
  const std::string model = body["model"].get<std::string>();
  if (model != served_model_name)
    return ApiError::not_found("The model '" + text_excerpt(model) + "' does not exist (this server serves '" + served_model_name + "')",
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
        std::string part_text;
        if (auto e = read_text_part(content[j], where + ".content[" + std::to_string(j) + "]", &part_text)) return e;
        if (j > 0) text += "\n";
        text += part_text;
      }
      msg["content"] = text;
    } else if (!content.is_string()) {
      return ApiError::bad_request(where + ".content must be a string or a list of text parts", "messages");
    }
    out->push_back(std::move(msg));
  }
  return std::nullopt;
}

namespace {

std::optional<ApiError> read_generation_request(const nlohmann::json& body, ApiKind kind, const RequestContext& ctx,
                                                GenerationRequest* out) {
  if (!body.is_object()) return ApiError::bad_request("the request body must be a JSON object");
  out->kind = kind;
  if (auto e = check_model(body, ctx.served_model_name)) return e;
  if (auto e = check_fields(body, kind)) return e;
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
  // "max_tokens": 0 with "kv_retain": true only prefills (and compresses) the prompt and retains
  // it, so that later requests beginning with it continue its KV: nothing is generated.
  const bool retain_only = body.contains("kv_retain") && body["kv_retain"].is_boolean() && body["kv_retain"].get<bool>() &&
                           fields.contains("max_tokens") && fields["max_tokens"].is_number_integer() &&
                           fields["max_tokens"].get<int64_t>() == 0;
  if (retain_only) fields["max_tokens"] = 1;
  SamplingParams defaults;
  defaults.max_tokens = kind == ApiKind::kChat ? std::max(1, ctx.max_model_len - static_cast<int>(longest)) : 16;
  Expected<SamplingParams> sp = sampling_params_from_json(fields, defaults);
  if (!sp) return ApiError::bad_request(sp.status().message());
  out->sampling = std::move(*sp);

  Expected<RequestOptions> opts =
      request_options_from_json(body, {}, ctx.head_budgets != nullptr ? *ctx.head_budgets : HeadBudgetsResolver{});
  if (!opts) return ApiError::bad_request(opts.status().message());
  out->options = std::move(*opts);
  out->options.retain_only = retain_only;
  if (retain_only && !ctx.retain_contexts)
    return ApiError::bad_request("'kv_retain' with 'max_tokens': 0 retains a prompt, but this server runs with "
                                 "--no-retain-contexts", "kv_retain");
  if (auto e = read_logprobs(body, kind, &out->options.logprobs)) return e;

  if (body.contains("n") && !body["n"].is_null()) {
    if (!body["n"].is_number_integer() || body["n"].get<int64_t>() < 1 || body["n"].get<int64_t>() > ctx.max_n)
      return ApiError::bad_request("'n' must be an integer in [1, " + std::to_string(ctx.max_n) + "], got " + json_excerpt(body["n"]), "n");
    out->n = body["n"].get<int>();
  }
  if (body.contains("best_of") && !body["best_of"].is_null() &&
      !(body["best_of"].is_number_integer() && body["best_of"].get<int64_t>() == out->n))
    return ApiError::bad_request("'best_of' other than n is not supported by origami", "best_of");
  if (auto e = read_bool(body, "stream", &out->stream)) return e;
  if (auto e = read_bool(body, "return_token_ids", &out->return_token_ids)) return e;
  if (body.contains("stream_options") && !body["stream_options"].is_null()) {
    const auto& so = body["stream_options"];
    if (!so.is_object()) return ApiError::bad_request("'stream_options' must be an object", "stream_options");
    if (!out->stream) return ApiError::bad_request("'stream_options' needs 'stream': true", "stream_options");
    if (auto e = read_bool(so, "include_usage", &out->include_usage)) return e;
    if (auto e = read_bool(so, "continuous_usage_stats", &out->continuous_usage)) return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_generation_request(const nlohmann::json& body, ApiKind kind, const RequestContext& ctx,
                                                 GenerationRequest* out) {
  // The readers check every type before they read it; an exception that still escapes one (a
  // conversion missed) must cost this request a 500, not the connection or the process.
  try {
    return read_generation_request(body, kind, ctx, out);
  } catch (const std::exception& e) {
    return ApiError::internal("reading the request failed: " + text_excerpt(e.what()));
  } catch (...) {
    return ApiError::internal("reading the request failed");
  }
}

}  // namespace origami::server
