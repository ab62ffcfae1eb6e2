#include "engine/batch_runner.h"

#include <unordered_map>

namespace origami {

std::vector<BatchResult> run_batch(Engine& engine, const std::vector<BatchItem>& items, const ProgressCallback& progress) {
  BatchHooks hooks;
  hooks.progress = progress;
  return run_batch(engine, items, hooks);
}

std::vector<BatchResult> run_batch(Engine& engine, const std::vector<BatchItem>& items, const BatchHooks& hooks) {
  std::vector<BatchResult> results(items.size());
  std::unordered_map<RequestId, size_t> index_of;
  size_t done = 0;
  auto report = [&](size_t i) {
    ++done;
    if (hooks.on_result) hooks.on_result(i, results[i]);
  };
  for (size_t i = 0; i < items.size(); ++i) {
    BatchResult& res = results[i];
    res.num_prompt_tokens = static_cast<int>(items[i].prompt_token_ids.size());
    if (!items[i].error.empty()) {
      res.error = items[i].error;
      report(i);
      continue;
    }
    Expected<RequestId> id = engine.add_request(items[i].prompt_token_ids, items[i].sampling, items[i].options);
    if (!id) {
      res.error = items[i].label + id.status().to_string();
      report(i);
      continue;
    }
    index_of[*id] = i;
  }
  if (hooks.progress) hooks.progress(done, items.size());

  bool stopping = false;
  while (engine.has_unfinished()) {
    if (!stopping && hooks.should_stop && hooks.should_stop()) {
      stopping = true;
      for (const auto& [id, index] : index_of)
        if (const Request* r = engine.request(id); r != nullptr && !r->is_finished()) engine.abort_request(id);
    }
    for (RequestOutput& out : engine.step()) {
      auto it = index_of.find(out.request_id);
      if (it == index_of.end()) continue;
      BatchResult& res = results[it->second];
      res.text += out.new_text;
      res.forced_logprobs.insert(res.forced_logprobs.end(), out.forced_logprobs.begin(), out.forced_logprobs.end());
      res.logprobs.insert(res.logprobs.end(), std::make_move_iterator(out.logprobs.begin()),
                          std::make_move_iterator(out.logprobs.end()));
      if (!out.finished) continue;
      const Request* r = engine.request(out.request_id);
      res.ok = out.finish_reason != FinishReason::kError && out.finish_reason != FinishReason::kAborted;
      res.error = out.error.empty() ? "" : items[it->second].label + out.error;
      if (out.finish_reason == FinishReason::kAborted) res.error = items[it->second].label + "interrupted before it finished";
      res.finish_reason = out.finish_reason;
      res.output_token_ids = r->output_token_ids;
      res.num_cached_prompt_tokens = r->num_cached_prefix_tokens;
      res.num_compressions = r->compression.num_compressions;
      res.arrival_time = r->arrival_time;
      res.first_token_time = r->first_token_time;
      res.finish_time = r->finish_time;
      engine.release_request(out.request_id);
      report(it->second);
    }
    if (hooks.progress) hooks.progress(done, items.size());
  }
  return results;
}

}  // namespace origami
