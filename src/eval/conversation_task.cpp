#include "eval/conversation_task.h"

#include <algorithm>

namespace origami::eval {

Expected<ConversationItem> make_conversation_item(const Tokenizer& tokenizer, const RetrievalExample& example,
                                                  bool first_turn_only) {
  ConversationItem item;
  if (!example.turns.empty()) {
    item.document = tokenizer.encode(example.context, /*add_special_tokens=*/true);
    for (const RetrievalTurn& t : example.turns) {
      item.questions.push_back(tokenizer.encode(t.question, /*add_special_tokens=*/false));
      if (item.questions.back().empty()) return invalid_argument("document " + example.id + ": a turn's question is empty");
      if (first_turn_only) break;
    }
    if (item.document.empty()) return invalid_argument("document " + example.id + ": \"context\" is empty");
    return item;
  }
  std::vector<int32_t> ids = tokenizer.encode(example.prompt, /*add_special_tokens=*/true);
  Expected<size_t> split = question_split(tokenizer, example.prompt, ids);
  if (!split) return invalid_argument("document " + example.id + ": " + split.status().message());
  item.questions.emplace_back(ids.begin() + static_cast<std::ptrdiff_t>(*split), ids.end());
  ids.resize(*split);
  item.document = std::move(ids);
  return item;
}

std::vector<std::vector<EvalItemResult>> run_conversations(Engine& engine, const std::vector<ConversationItem>& items,
                                                           const PolicyChoice& choice, int max_answer_tokens,
                                                           const BatchHooks& hooks) {
  engine.release_retained_contexts();  // another point's contexts must not be continued
  const size_t n = items.size();
  std::vector<std::vector<EvalItemResult>> results(n);
  auto request = [&](std::vector<int32_t> prompt) {
    BatchItem b;
    b.prompt_token_ids = std::move(prompt);
    b.sampling.temperature = 0.0f;
    b.sampling.max_tokens = std::max(max_answer_tokens, 1);
    b.options.kv_policy = choice.policy;
    b.options.kv_budget = choice.budget;
    b.options.kv_policy_options = choice.options;
    return b;
  };

  // The documents, retained (and compressed at their prompt's end).
  std::vector<BatchItem> batch;
  for (const ConversationItem& item : items) {
    BatchItem b = request(item.document);
    b.options.retain_only = true;
    batch.push_back(std::move(b));
  }
  std::vector<BatchResult> done = run_batch(engine, batch, hooks);
  std::vector<std::vector<int32_t>> history(n);
  std::vector<size_t> served(n);  // tokens the next turn must find retained
  std::vector<bool> alive(n);
  for (size_t i = 0; i < n; ++i) {
    alive[i] = done[i].ok && done[i].finish_reason == FinishReason::kLength;
    history[i] = items[i].document;
    served[i] = history[i].size();
    if (!alive[i]) {
      EvalItemResult r;
      r.error = "the document: " + (done[i].error.empty() ? std::string(finish_reason_name(done[i].finish_reason)) : done[i].error);
      results[i].push_back(std::move(r));
    }
  }

  size_t num_turns = 0;
  for (const ConversationItem& item : items) num_turns = std::max(num_turns, item.questions.size());
  for (size_t t = 0; t < num_turns; ++t) {
    if (hooks.should_stop && hooks.should_stop()) break;
    std::vector<size_t> index;
    batch.clear();
    for (size_t i = 0; i < n; ++i) {
      if (!alive[i] || t >= items[i].questions.size()) continue;
      std::vector<int32_t> prompt = history[i];
      prompt.insert(prompt.end(), items[i].questions[t].begin(), items[i].questions[t].end());
      batch.push_back(request(std::move(prompt)));
      index.push_back(i);
    }
    if (batch.empty()) break;
    done = run_batch(engine, batch, hooks);
    for (size_t k = 0; k < index.size(); ++k) {
      const size_t i = index[k];
      const BatchResult& br = done[k];
      EvalItemResult r;
      if (!br.ok || br.finish_reason == FinishReason::kAborted || br.finish_reason == FinishReason::kError) {
        r.error = br.error.empty() ? std::string("request ") + finish_reason_name(br.finish_reason) : br.error;
      } else if (static_cast<size_t>(br.num_cached_prompt_tokens) < served[i]) {
        r.error = "turn " + std::to_string(t + 1) + " continued " + std::to_string(br.num_cached_prompt_tokens) + " of " +
                  std::to_string(served[i]) +
                  " retained tokens: its context was released (give the engine more KV memory, or a larger "
                  "--retained-kv-memory), or the policy's query window would reach into it (a policy whose "
                  "compressions score by queries the context never captured, e.g. kvllm, is not continued)";
      } else {
        r.ok = true;
        r.generated_token_ids = br.output_token_ids;
        history[i] = batch[k].prompt_token_ids;
        history[i].insert(history[i].end(), br.output_token_ids.begin(), br.output_token_ids.end());
        // The last output's KV is never computed: the context stands for the rest.
        served[i] = history[i].size() - (br.output_token_ids.empty() ? 0 : 1);
      }
      alive[i] = r.ok;
      results[i].push_back(std::move(r));
    }
  }
  return results;
}

void score_conversations(const Tokenizer& tokenizer, const std::vector<RetrievalExample>& examples,
                         const std::vector<std::vector<EvalItemResult>>& results, PointResult* point,
                         bool first_turn_only, std::vector<int>* turn_correct, std::vector<int>* turn_counts,
                         std::vector<nlohmann::json>* details) {
  point->task = EvalTask::kRetrieval;
  for (size_t i = 0; i < results.size() && i < examples.size(); ++i) {
    const RetrievalExample& ex = examples[i];
    // The turns it has (one for an example without "turns": its own answer), or the first only.
    size_t expected = ex.turns.empty() ? 1 : ex.turns.size();
    if (first_turn_only) expected = 1;
    for (size_t t = 0; t < expected; ++t) {
      const std::string& answer = ex.turns.empty() ? ex.answer : ex.turns[t].answer;
      const EvalItemResult* r = t < results[i].size() ? &results[i][t] : nullptr;
      if (turn_counts->size() <= t) {
        turn_counts->resize(t + 1, 0);
        turn_correct->resize(t + 1, 0);
      }
      ++(*turn_counts)[t];
      ++point->num_documents;
      std::string output;
      bool correct = false;
      if (r != nullptr && r->ok) {
        output = tokenizer.decode(r->generated_token_ids, /*skip_special_tokens=*/true);
        correct = retrieval_answer_matches(output, answer);
      } else {
        ++point->num_failed;
        if (point->first_error.empty())
          point->first_error = r != nullptr ? r->error : "an earlier turn of the conversation failed";
      }
      point->num_correct += correct ? 1 : 0;
      (*turn_correct)[t] += correct ? 1 : 0;
      if (details) {
        nlohmann::json d = {{"id", ex.id},          {"turn", t + 1},   {"policy", point->point.policy},
                            {"budget", point->point.budget}, {"answer", answer}, {"output", output},
                            {"correct", correct}};
        if (r != nullptr && !r->ok) d["error"] = r->error;
        details->push_back(std::move(d));
      }
    }
  }
}

}  // namespace origami::eval
