#pragma once
// Per-request options beyond sampling: the KV compression policy and budget, and teacher forcing.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv/head_budgets.h"

namespace origami {

struct RequestOptions {
  // Compression policy and budget of this request; empty / 0 = the engine's defaults. Options
  // given without a policy name refine the engine's default policy (overriding the engine's
  // options key by key); with a policy name they are that policy's only options.
  std::string kv_policy;
  int kv_budget = 0;
  std::map<std::string, std::string> kv_policy_options;
  // Calibrated head budgets for this request (`origami calibrate`'s format) instead of the
  // engine's --kv-head-budgets; null = the engine's. Already read and validated by whoever parsed
  // the request (an inline object, a file the server's operator loaded at start, a JSONL line's
  // file read when the line was parsed): the engine thread never opens a file for a request.
  // Checked against the model; the engine's head groups are fixed at start, so each group takes
  // its heads' largest ratio (Engine::add_request; docs/policies.md, "Per-request head budgets").
  std::shared_ptr<const HeadBudgets> kv_head_budgets;
  std::string kv_head_budgets_source;  // what names them in errors (a path, a name, "kv_head_budgets")
  // Teacher forcing: the first outputs are these tokens instead of sampled ones, one per decode
  // step, so decode-time compression runs through them (stream-mode evaluation, perplexity).
  // Stop conditions do not apply to forced tokens; max_tokens counts them.
  std::vector<int32_t> forced_output_tokens;
  bool return_forced_logprobs = false;  // report log p(forced token) in RequestOutput
  // >= 0: report each output token's log-probability and its row's `logprobs` most likely
  // tokens (0..kMaxTopLogprobs) in RequestOutput::logprobs, under the raw model distribution
  // (log_softmax of the logits, before temperature and filters, as vLLM's default).
  int logprobs = -1;
  // Retained contexts (EngineConfig::retain_contexts): continue one whose history begins this
  // request's tokens, and keep this request's KV as one when it finishes. false: neither.
  bool retain_context = true;
  // Only prefill the prompt (and compress it, if its policy does at the prompt's end) and retain
  // it as a context: the request samples nothing, reports no token and finishes with "length"
  // once its KV is final. Needs retained contexts on; excludes forced tokens.
  bool retain_only = false;
};

}  // namespace origami
