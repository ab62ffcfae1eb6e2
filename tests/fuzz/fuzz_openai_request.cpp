// Fuzzes the body of POST /v1/completions and /v1/chat/completions as `origami serve` reads it:
// parse_json_body, then parse_generation_request under both APIs (prompt text or ids, chat
// messages through the chat template of origami-tiny-qwen3, sampling fields, stop, n, stream
// options, logprobs / top_logprobs, kv_policy / kv_budget / kv_policy_options). Each body is
// either accepted, with values the engine accepts, or answered with an OpenAI-shaped error.
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "engine/prompt_builder.h"
#include "fuzz_util.h"
#include "policy/kv_budget.h"
#include "policy/policy_registry.h"
#include "sampling/logprob.h"
#include "server/openai_request.h"

using namespace origami;
using namespace origami::server;

namespace {

constexpr int kMaxModelLen = 512;

std::shared_ptr<const Tokenizer> load_tokenizer() {
  const std::string dir = fuzz::shared_dir() + "/models/origami-tiny-qwen3";
  Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::load(dir);
  if (!t) {
    std::fprintf(stderr, "cannot load %s: %s (set ORIGAMI_SHARED_DIR)\n", dir.c_str(), t.status().message().c_str());
    std::abort();
  }
  return *t;
}

void check_error(const ApiError& e) {
  FUZZ_CHECK(!e.message.empty(), "an error without a message");
  FUZZ_CHECK(e.status == 400 || e.status == 404, "unexpected status " + std::to_string(e.status));
  // The session sends errors through this dump (invalid UTF-8 replaced, never thrown).
  (void)e.to_json().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

const nlohmann::json* field(const nlohmann::json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

void check_accepted(const nlohmann::json& body, ApiKind kind, const RequestContext& ctx, const GenerationRequest& r) {
  FUZZ_CHECK(!r.prompts.empty(), "accepted without a prompt");
  for (const auto& p : r.prompts) {
    FUZZ_CHECK(!p.empty(), "accepted an empty prompt");
    FUZZ_CHECK(static_cast<int>(p.size()) < ctx.max_model_len, "accepted a prompt that leaves no room to generate");
  }
  FUZZ_CHECK(r.n >= 1 && r.n <= ctx.max_n, "n out of range: " + std::to_string(r.n));
  FUZZ_CHECK(r.sampling.validate().is_ok(), "accepted sampling parameters fail validation");
  FUZZ_CHECK(!r.include_usage || r.stream, "include_usage without stream");
  FUZZ_CHECK(r.options.kv_budget >= 0 && r.options.kv_budget <= kMaxKvBudget, "kv_budget out of range accepted");
  // Log-probabilities: what the body asked for, within what the engine accepts.
  const int lp = r.options.logprobs;
  FUZZ_CHECK(lp >= -1 && lp <= kMaxTopLogprobs, "logprobs out of range: " + std::to_string(lp));
  const nlohmann::json* logprobs = field(body, "logprobs");
  const nlohmann::json* top = field(body, "top_logprobs");
  if (kind == ApiKind::kCompletion) {
    FUZZ_CHECK(top == nullptr, "completions accepted top_logprobs");
    FUZZ_CHECK(logprobs == nullptr ? lp == -1 : lp == logprobs->get<int64_t>(), "completions logprobs changed");
  } else {
    const bool wanted = logprobs != nullptr && logprobs->get<bool>();
    FUZZ_CHECK(wanted ? lp == (top == nullptr ? 0 : top->get<int64_t>()) : lp == -1, "chat logprobs changed");
  }
  // The engine resolves the policy named by the request.
  if (!r.options.kv_policy.empty()) (void)PolicyRegistry::builtin().create(r.options.kv_policy, r.options.kv_policy_options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PromptBuilder builder(load_tokenizer());
  static std::mutex builder_mutex;
  const RequestContext ctx{&builder, &builder_mutex, "origami-tiny-qwen3", kMaxModelLen};
  nlohmann::json body;
  if (auto e = parse_json_body(fuzz::as_text(data, size), &body)) {
    check_error(*e);
    return 0;
  }
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    GenerationRequest r;
    if (auto e = parse_generation_request(body, kind, ctx, &r))
      check_error(*e);
    else
      check_accepted(body, kind, ctx, r);
  }
  return 0;
}
