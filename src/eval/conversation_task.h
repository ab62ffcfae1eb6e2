#pragma once
// Conversations over one document on retained contexts (kv/retained_contexts.h): the document is
// prefilled (and compressed, if the policy does at a prompt's end) by a retain-only request, then
// every question is its own request whose prompt is the conversation so far (the document, the
// earlier questions and the model's own answers) plus the question: it continues the previous
// turn's retained KV and computes only the new tokens. `--mode context` is one such turn,
// `--mode multiturn` all of a document's turns in sequence.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "eval/eval_item.h"
#include "eval/eval_result.h"
#include "eval/eval_runner.h"
#include "eval/retrieval_task.h"
#include "tokenizer/tokenizer.h"

namespace origami::eval {

struct ConversationItem {
  std::vector<int32_t> document;                // the first request's prompt (special tokens included)
  std::vector<std::vector<int32_t>> questions;  // appended after the history, one per turn
};

// The conversation of a retrieval example: its "context" and "turns" (all turns, or the first with
// `first_turn_only`); an example with only a "prompt" is cut at its question (question_split), so
// that its one turn feeds the very tokens prefill mode does.
Expected<ConversationItem> make_conversation_item(const Tokenizer& tokenizer, const RetrievalExample& example,
                                                  bool first_turn_only);

// Runs every conversation, turn by turn (each turn of all documents as one batch), greedily
// generating `max_answer_tokens` per answer. Result [document][turn]. A turn whose request did not
// continue its retained context (it was released: too little KV memory or --retained-kv-memory)
// fails with that reason rather than being scored on a different computation; a failed turn ends
// its conversation. The engine must retain contexts (EngineConfig::retain_contexts); those left
// from earlier runs are released first.
std::vector<std::vector<EvalItemResult>> run_conversations(Engine& engine, const std::vector<ConversationItem>& items,
                                                           const PolicyChoice& choice, int max_answer_tokens,
                                                           const BatchHooks& hooks);

// Scores every turn (or each document's first, as context mode asks it) with the retrieval rule:
// the point counts (document, turn) pairs, a turn never reached (an earlier one failed) as wrong;
// `turn_correct` gets the correct answers per turn and `turn_counts` the documents that have it. With
// `details`, one record per (document, turn), as score_retrieval's plus "turn".
void score_conversations(const Tokenizer& tokenizer, const std::vector<RetrievalExample>& examples,
                         const std::vector<std::vector<EvalItemResult>>& results, PointResult* point,
                         bool first_turn_only, std::vector<int>* turn_correct, std::vector<int>* turn_counts,
                         std::vector<nlohmann::json>* details = nullptr);

}  // namespace origami::eval
