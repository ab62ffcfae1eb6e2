#pragma once
// `origami bench serve --multiturn`: conversations over shared documents against a running
// server. Each conversation starts from one of --num-documents random-token documents
// (conversation c uses document c mod D, so D < conversations share them), then asks --turns
// questions of --question-len random tokens; each turn's prompt is the whole conversation so
// far (document, earlier questions and the server's own answers) and is sent only after the
// previous answer has arrived plus --think-time. Each answer joins the conversation as the ids
// the server generated (--answer-ids returned: vLLM's "return_token_ids") or as the server's
// tokens of its text (--answer-ids retokenized: what a text client resends). Reports TTFT per turn index, TPOT, output
// tokens/s and the server's prefix-cache / retained-context counters (from /metrics, when the
// server has one).
#include <cstdint>
#include <string>

#include "serve_client.h"

namespace origami::cli {

// How an answer joins the conversation that the next turn sends.
enum class AnswerIds {
  kReturned,     // the generated ids, asked for with "return_token_ids"
  kRetokenized,  // the server's /tokenize of the answer's text
};

struct MultiturnWorkload {
  int conversations = 16;
  int turns = 4;
  int doc_len = 1024;  // tokens
  int question_len = 32;  // tokens
  int output_len = 64;  // tokens per answer (ignore_eos)
  double think_time = 0.0;  // seconds between an answer and the next question
  int num_documents = 1;
  int max_concurrency = 0;  // conversations in flight; 0: all at once
  uint64_t seed = 0;
  AnswerIds answer_ids = AnswerIds::kReturned;
  double temperature = 0.0;  // every turn's sampling temperature (0: greedy)
};

// Most conversations and turns of one run: bounds on what the client holds and sends.
inline constexpr int kMaxConversations = 100'000;
inline constexpr int kMaxTurns = 256;

// Checks the workload's values; an empty string when they are usable, else the error.
std::string check_multiturn_workload(const MultiturnWorkload& w);

// Runs the workload against `target` (model and vocab already known) and prints the report
// (--json: one JSON object). Returns the exit code: 1 when no turn completed, else 0.
int run_multiturn_bench(const Target& target, const std::string& base_url, const std::string& model, int vocab,
                        const MultiturnWorkload& w, bool json, bool quiet);

}  // namespace origami::cli
