// Fuzzes JSONL request lines as `origami generate --input` and `origami bench` read them: each
// line is parsed as JSON, then its prompt ("prompt" text or ids, or "messages" through the chat
// template of origami-tiny-qwen3), sampling fields and request options are read. Each line is
// either accepted, with values that pass validation, or rejected with a message.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/json_parse.h"
#include "engine/prompt_builder.h"
#include "engine/request_options_json.h"
#include "engine/sampling_json.h"
#include "fuzz_util.h"
#include "policy/policy_registry.h"

using namespace origami;

namespace {

std::shared_ptr<const Tokenizer> load_tokenizer() {
  const std::string dir = fuzz::shared_dir() + "/models/origami-tiny-qwen3";
  Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::load(dir);
  if (!t) {
    std::fprintf(stderr, "cannot load %s: %s (set ORIGAMI_SHARED_DIR)\n", dir.c_str(), t.status().message().c_str());
    std::abort();
  }
  return *t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const PromptBuilder builder(load_tokenizer());
  std::string_view rest = fuzz::as_text(data, size);
  SamplingParams defaults;
  defaults.max_tokens = 32;
  while (!rest.empty()) {
    auto [line, next] = fuzz::split_once(rest, "\n");
    rest = next;
    Expected<nlohmann::json> parsed = parse_json(line, kRequestJsonMaxDepth);  // as read_jsonl_requests
    if (!parsed) continue;
    const nlohmann::json& obj = *parsed;
    Expected<std::vector<int32_t>> ids = builder.from_json(obj);
    if (!ids) FUZZ_CHECK(!ids.status().message().empty(), "prompt error without a message");
    Expected<SamplingParams> sp = sampling_params_from_json(obj, defaults);
    if (sp) {
      FUZZ_CHECK(sp->validate().is_ok(), "accepted sampling parameters fail validation");
      // Accepted ids are the ids the request wrote, not wrapped ones.
      const auto it = obj.find("stop_token_ids");
      if (it != obj.end() && it->is_array()) {
        FUZZ_CHECK(it->size() == sp->stop_token_ids.size(), "stop_token_ids count");
        for (size_t i = 0; i < it->size(); ++i)
          FUZZ_CHECK((*it)[i].get<int64_t>() == sp->stop_token_ids[i], "stop_token_ids changed: " + it->dump());
      }
    } else {
      FUZZ_CHECK(!sp.status().message().empty(), "sampling error without a message");
    }
    Expected<RequestOptions> opts = request_options_from_json(obj);
    if (!opts) {
      FUZZ_CHECK(!opts.status().message().empty(), "options error without a message");
      continue;
    }
    FUZZ_CHECK(opts->kv_budget >= 0, "negative kv_budget accepted");
    if (const auto it = obj.find("forced_output_tokens"); it != obj.end() && it->is_array()) {
      FUZZ_CHECK(it->size() == opts->forced_output_tokens.size(), "forced_output_tokens count");
      for (size_t i = 0; i < it->size(); ++i)
        FUZZ_CHECK((*it)[i].get<int64_t>() == opts->forced_output_tokens[i], "forced token changed: " + it->dump());
    }
    for (int32_t t : opts->forced_output_tokens) FUZZ_CHECK(t >= 0, "negative forced token accepted");
    // The engine resolves the policy named by the request.
    if (!opts->kv_policy.empty()) (void)PolicyRegistry::builtin().create(opts->kv_policy, opts->kv_policy_options);
  }
  return 0;
}
