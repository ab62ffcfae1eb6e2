#include "eval/eval_runner.h"

#include <algorithm>
#include <unordered_map>

namespace origami::eval {

std::vector<EvalItemResult> run_eval_batch(Engine& engine, const std::vector<EvalItem>& items,
                                           const PolicyChoice& choice, const EvalProgress& progress) {
  std::vector<EvalItemResult> results(items.size());
  std::unordered_map<RequestId, size_t> index_of;
  size_t done = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const EvalItem& item = items[i];
    SamplingParams sp;
    sp.temperature = 0.0f;  // greedy: the answer is the model's most likely continuation
    sp.max_tokens = static_cast<int>(item.forced_token_ids.size()) + item.max_new_tokens;  // forced tokens count
    sp.ignore_eos = item.max_new_tokens == 0;  // nothing is generated after the forced tokens anyway
    RequestOptions options;
    options.kv_policy = choice.policy;
    options.kv_budget = choice.budget;
    options.kv_policy_options = choice.options;
    options.forced_output_tokens = item.forced_token_ids;
    options.return_forced_logprobs = item.return_forced_logprobs;
    Expected<RequestId> id = sp.max_tokens < 1 ? Expected<RequestId>(invalid_argument("the item predicts no token"))
                                               : engine.add_request(item.prompt_token_ids, sp, options);
    if (!id) {
      results[i].error = id.status().message();
      ++done;
      continue;
    }
    index_of[*id] = i;
  }
  if (progress) progress(done, items.size());

  while (engine.has_unfinished()) {
    for (RequestOutput& out : engine.step()) {
      auto it = index_of.find(out.request_id);
      if (it == index_of.end()) continue;
      EvalItemResult& res = results[it->second];
      res.forced_logprobs.insert(res.forced_logprobs.end(), out.forced_logprobs.begin(), out.forced_logprobs.end());
      if (!out.finished) continue;
      const EvalItem& item = items[it->second];
      const Request* r = engine.request(out.request_id);
      const std::vector<int32_t>& outputs = r->output_token_ids;
      const size_t num_forced = item.forced_token_ids.size();
      if (out.finish_reason == FinishReason::kError || out.finish_reason == FinishReason::kAborted) {
        res.error = out.error.empty() ? std::string("request ") + finish_reason_name(out.finish_reason) : out.error;
      } else if (outputs.size() < num_forced || !std::equal(item.forced_token_ids.begin(), item.forced_token_ids.end(), outputs.begin())) {
        // A request that stopped early (context full) or whose outputs were not the forced ones
        // would be scored on a different text than asked: report it instead.
        res.error = "the engine returned " + std::to_string(outputs.size()) + " outputs that do not start with the " +
                    std::to_string(num_forced) + " forced tokens (finish reason " + finish_reason_name(out.finish_reason) + ")";
      } else if (item.return_forced_logprobs && res.forced_logprobs.size() != num_forced) {
        res.error = "the engine returned " + std::to_string(res.forced_logprobs.size()) + " log-probabilities for " +
                    std::to_string(num_forced) + " forced tokens";
      } else {
        res.ok = true;
        res.generated_token_ids.assign(outputs.begin() + static_cast<std::ptrdiff_t>(num_forced), outputs.end());
      }
      engine.release_request(out.request_id);
      ++done;
    }
    if (progress) progress(done, items.size());
  }
  return results;
}

}  // namespace origami::eval
