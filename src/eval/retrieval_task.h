#pragma once
// The long-range retrieval task (../shared/models/README.md): a ~2000-token document with 1-4
// facts " The secret number of the {adjective} {noun} is {4 digits}. " ends with a question
// whose answer is one of them; the model must continue with " {4 digits}.".
//
// Scoring rule (exact match, documented in docs/fidelity.md): leading whitespace of the greedy
// continuation is skipped; the next four characters must be exactly the expected digits, and
// the character after them, if any, must not be a digit (" 01812" is wrong, " 0181." and
// " 0181" are right). Anything else, including an empty continuation, is wrong.
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "eval/eval_item.h"
#include "eval/eval_result.h"
#include "tokenizer/tokenizer.h"

namespace origami::eval {

struct RetrievalTurn {
  std::string question;  // appended verbatim after the conversation so far, ending in "... is"
  std::string answer;    // four ASCII digits
};

struct RetrievalExample {
  std::string id;      // the JSONL "id" as written (number or string)
  std::string prompt;  // the document, ending in "... is"
  std::string answer;  // four ASCII digits
  // Several questions about one document ({"context", "turns": [{"question", "answer"}, ...]}):
  // `context` is the document; `prompt` / `answer` are then context + the first question and its
  // answer, so single-question modes ask the first. Empty for a {"prompt", "answer"} line.
  std::string context;
  std::vector<RetrievalTurn> turns;
};

// Reads the JSONL file: one object per line with "prompt" (string) and "answer" (4 digits), or
// "context" (string) and "turns" (a non-empty list of {"question", "answer"}), and an optional
// "id"; blank lines are skipped. `limit` > 0 keeps the first `limit` examples.
// Errors name the file, line and field.
Expected<std::vector<RetrievalExample>> load_retrieval_examples(const std::string& path, int limit = 0);

// The scoring rule above.
bool retrieval_answer_matches(std::string_view generated, std::string_view answer);

// prefill: the document is the prompt (prefill-time compression sees the question).
// stream: the document is fed as forced decode tokens after its first token, so decode-time
// compression runs through all of it, query-agnostic, before the answer is generated.
// context: two requests on retained contexts (eval/conversation_task.h): the document alone,
// prefilled and compressed before the question exists (every compression its prompt triggers is
// decided on the document), then the question continuing its retained KV (the second turn of a
// conversation over a shared context, as in KVzip / SCBench).
// context-emulated: the same in one request: the prompt is the document without its question,
// and the question is fed as forced decode tokens attending to the compressed cache.
// multiturn: every question of a document in sequence, each turn continuing the previous turn's
// KV, the model's own answers included (conversation_task.h).
enum class RetrievalMode { kPrefill, kStream, kContext, kContextEmulated, kMultiturn };
// Modes that run as conversations on retained contexts.
inline bool is_conversation_mode(RetrievalMode mode) {
  return mode == RetrievalMode::kContext || mode == RetrievalMode::kMultiturn;
}
Expected<RetrievalMode> parse_retrieval_mode(std::string_view text);
const char* retrieval_mode_name(RetrievalMode mode);

// The question marker: a document's question starts at its last "\nQuestion:".
inline constexpr const char* kQuestionMarker = "\nQuestion:";

// Tokenizes the document as `origami generate` does (the tokenizer's special tokens, e.g. BOS,
// included) and splits it for the mode: prefill -> prompt = all tokens; stream -> prompt = the
// first token (BOS when the tokenizer adds one, else the document's first token), forced = the
// rest; context-emulated -> prompt = the tokens before the question (question_split()), forced =
// the question. (Conversation modes build a ConversationItem instead.) Every mode feeds the very same token sequence. `max_answer_tokens` are generated
// greedily after that. Context mode fails for a document without the question marker.
Expected<EvalItem> make_retrieval_item(const Tokenizer& tokenizer, const RetrievalExample& example, RetrievalMode mode,
                                       int max_answer_tokens);

// Where the question starts in `ids` (the tokenized `prompt`): the number of leading tokens that
// spell the text before the last kQuestionMarker. The whole prompt is tokenized once and cut at
// a token boundary, so the question's tokens are those prefill mode feeds (tokenizing the two
// parts apart could merge differently). Errors: no marker, or no token boundary that leaves a
// non-empty document and a non-empty question.
Expected<size_t> question_split(const Tokenizer& tokenizer, const std::string& prompt, const std::vector<int32_t>& ids);

// Scores a point: decodes each document's generated tokens (special tokens skipped) and applies
// the rule above; failed documents count as wrong. With `details`, appends one record per
// document: {"id", "policy", "budget", "answer", "output", "correct"[, "error"]}.
void score_retrieval(const Tokenizer& tokenizer, const std::vector<RetrievalExample>& examples,
                     const std::vector<EvalItemResult>& results, PointResult* point,
                     std::vector<nlohmann::json>* details = nullptr);

}  // namespace origami::eval
