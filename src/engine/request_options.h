#pragma once
// Per-request options beyond sampling: the KV compression policy and budget, and teacher forcing.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace origami {

struct RequestOptions {
  // Compression policy and budget of this request; empty / 0 = the engine's defaults. Options
  // given without a policy name refine the engine's default policy (overriding the engine's
  // options key by key); with a policy name they are that policy's only options.
  std::string kv_policy;
  int kv_budget = 0;
  std::map<std::string, std::string> kv_policy_options;
  // A calibrated head budget file (`origami calibrate`) for this request instead of the engine's
  // --kv-head-budgets; empty = the engine's. Checked against the model; the engine's head groups
  // are fixed at start, so each group takes its heads' largest ratio from this file
  // (Engine::add_request; docs/policies.md, "Per-request head budgets"). Read once per engine
  // and path.
  std::string kv_head_budgets;
  // Teacher forcing: the first outputs are these tokens instead of sampled ones, one per decode
  // step, so decode-time compression runs through them (stream-mode evaluation, perplexity).
  // Stop conditions do not apply to forced tokens; max_tokens counts them.
  std::vector<int32_t> forced_output_tokens;
  bool return_forced_logprobs = false;  // report log p(forced token) in RequestOutput
  // >= 0: report each output token's log-probability and its row's `logprobs` most likely
  // tokens (0..kMaxTopLogprobs) in RequestOutput::logprobs, under the raw model distribution
  // (log_softmax of the logits, before temperature and filters, as vLLM's default).
  int logprobs = -1;
};

}  // namespace origami
