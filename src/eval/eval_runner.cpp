#include "eval/eval_runner.h"

#include <algorithm>

#include "engine/batch_runner.h"

namespace origami::eval {

std::vector<EvalItemResult> run_eval_batch(Engine& engine, const std::vector<EvalItem>& items,
                                           const PolicyChoice& choice, const EvalProgress& progress) {
  BatchHooks hooks;
  hooks.progress = progress;
  return run_eval_batch(engine, items, choice, hooks);
}

std::vector<EvalItemResult> run_eval_batch(Engine& engine, const std::vector<EvalItem>& items,
                                           const PolicyChoice& choice, const BatchHooks& hooks) {
  const int max_len = engine.config().max_model_len;
  std::vector<BatchItem> batch(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const EvalItem& item = items[i];
    BatchItem& b = batch[i];
    b.prompt_token_ids = item.prompt_token_ids;
    b.sampling.temperature = 0.0f;  // greedy: the answer is the model's most likely continuation
    b.sampling.max_tokens = static_cast<int>(item.forced_token_ids.size()) + item.max_new_tokens;  // forced count
    b.sampling.ignore_eos = item.max_new_tokens == 0;  // nothing is generated after the forced tokens anyway
    b.options.kv_policy = choice.policy;
    b.options.kv_budget = choice.budget;
    b.options.kv_policy_options = choice.options;
    b.options.forced_output_tokens = item.forced_token_ids;
    b.options.return_forced_logprobs = item.return_forced_logprobs;
    b.options.retain_context = false;  // items are independent: none continues another's KV
    if (b.sampling.max_tokens < 1) b.error = "the item predicts no token";
    // Forced tokens are part of the sequence: a document that does not fit the context would
    // only fail once the engine reaches max_model_len, after decoding most of it. Reject it up
    // front, with the message a too-long prompt gets in prefill mode.
    const size_t fed = item.prompt_token_ids.size() + item.forced_token_ids.size();
    const size_t needed = fed + (item.max_new_tokens > 0 ? 1 : 0);
    if (b.error.empty() && !item.forced_token_ids.empty() && needed > static_cast<size_t>(max_len))
      b.error = "document has " + std::to_string(fed) + " tokens (prompt " + std::to_string(item.prompt_token_ids.size()) +
                " + " + std::to_string(item.forced_token_ids.size()) + " forced), but the model's context (max_model_len) is " +
                std::to_string(max_len) + " tokens" + (item.max_new_tokens > 0 ? " and at least one must be left to generate" : "");
  }
  const std::vector<BatchResult> done = run_batch(engine, batch, hooks);

  std::vector<EvalItemResult> results(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const EvalItem& item = items[i];
    const BatchResult& br = done[i];
    EvalItemResult& res = results[i];
    res.forced_logprobs = br.forced_logprobs;
    const std::vector<int32_t>& outputs = br.output_token_ids;
    const size_t num_forced = item.forced_token_ids.size();
    if (!br.ok || br.finish_reason == FinishReason::kAborted) {
      res.error = br.error.empty() ? std::string("request ") + finish_reason_name(br.finish_reason) : br.error;
    } else if (outputs.size() < num_forced || !std::equal(item.forced_token_ids.begin(), item.forced_token_ids.end(), outputs.begin())) {
      // A request that stopped early (context full) or whose outputs were not the forced ones
      // would be scored on a different text than asked: report it instead.
      res.error = "the engine returned " + std::to_string(outputs.size()) + " outputs that do not start with the " +
                  std::to_string(num_forced) + " forced tokens (finish reason " + finish_reason_name(br.finish_reason) + ")";
    } else if (item.return_forced_logprobs && res.forced_logprobs.size() != num_forced) {
      res.error = "the engine returned " + std::to_string(res.forced_logprobs.size()) + " log-probabilities for " +
                  std::to_string(num_forced) + " forced tokens";
    } else {
      res.ok = true;
      res.generated_token_ids.assign(outputs.begin() + static_cast<std::ptrdiff_t>(num_forced), outputs.end());
    }
  }
  return results;
}

}  // namespace origami::eval
