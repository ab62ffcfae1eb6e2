#include "eval/retrieval_task.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/json_excerpt.h"
#include "core/json_parse.h"

namespace origami::eval {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_four_digits(const std::string& s) {
  return s.size() == 4 && is_digit(s[0]) && is_digit(s[1]) && is_digit(s[2]) && is_digit(s[3]);
}
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

Expected<std::vector<RetrievalExample>> load_retrieval_examples(const std::string& path, int limit) {
  std::ifstream in(path);
  if (!in) return not_found("cannot open '" + path + "'");
  std::vector<RetrievalExample> examples;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (limit > 0 && static_cast<int>(examples.size()) >= limit) break;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    Expected<nlohmann::json> parsed = parse_json(line, kRequestJsonMaxDepth);
    if (!parsed) return invalid_file(where + parsed.status().message());
    const nlohmann::json obj = std::move(*parsed);
    if (!obj.is_object()) return invalid_file(where + "not a JSON object");
    RetrievalExample ex;
    if (obj.contains("turns")) {
      // The document: "context", or "document" as scripts/make_retrieval_set.py --turns writes it.
      const char* doc_key = obj.contains("context") ? "context" : "document";
      if (!obj.contains(doc_key) || !obj[doc_key].is_string() || obj[doc_key].get<std::string>().empty())
        return invalid_file(where + "\"context\" (or \"document\") must be a non-empty string (the document its \"turns\" ask about)");
      if (!obj["turns"].is_array() || obj["turns"].empty())
        return invalid_file(where + "\"turns\" must be a non-empty list of {\"question\", \"answer\"}");
      ex.context = obj[doc_key].get<std::string>();
      for (size_t t = 0; t < obj["turns"].size(); ++t) {
        const nlohmann::json& turn = obj["turns"][t];
        const std::string at = where + "turns[" + std::to_string(t) + "]: ";
        if (!turn.is_object() || !turn.contains("question") || !turn["question"].is_string() ||
            turn["question"].get<std::string>().empty())
          return invalid_file(at + "\"question\" must be a non-empty string");
        if (!turn.contains("answer") || !turn["answer"].is_string() || !is_four_digits(turn["answer"].get<std::string>()))
          return invalid_file(at + "\"answer\" must be a string of 4 digits");
        ex.turns.push_back({turn["question"].get<std::string>(), turn["answer"].get<std::string>()});
      }
      ex.prompt = ex.context + ex.turns.front().question;
      ex.answer = ex.turns.front().answer;
      if (obj.contains("id")) ex.id = obj["id"].is_string() ? obj["id"].get<std::string>() : obj["id"].dump();
      else ex.id = std::to_string(examples.size());
      examples.push_back(std::move(ex));
      continue;
    }
    if (!obj.contains("prompt") || !obj["prompt"].is_string() || obj["prompt"].get<std::string>().empty())
      return invalid_file(where + "\"prompt\" must be a non-empty string");
    ex.prompt = obj["prompt"].get<std::string>();
    if (!obj.contains("answer") || !obj["answer"].is_string())
      return invalid_file(where + "\"answer\" must be a string of 4 digits");
    ex.answer = obj["answer"].get<std::string>();
    if (ex.answer.size() != 4 || !is_digit(ex.answer[0]) || !is_digit(ex.answer[1]) || !is_digit(ex.answer[2]) ||
        !is_digit(ex.answer[3]))
      return invalid_file(where + "\"answer\" must be 4 digits, got \"" + text_excerpt(ex.answer) + "\"");
    if (obj.contains("id")) ex.id = obj["id"].is_string() ? obj["id"].get<std::string>() : obj["id"].dump();
    else ex.id = std::to_string(examples.size());
    examples.push_back(std::move(ex));
  }
  if (examples.empty()) return invalid_file("'" + path + "' holds no examples");
  return examples;
}

bool retrieval_answer_matches(std::string_view generated, std::string_view answer) {
  size_t i = 0;
  while (i < generated.size() && is_space(generated[i])) ++i;
  if (answer.empty() || generated.size() - i < answer.size()) return false;
  if (generated.substr(i, answer.size()) != answer) return false;
  const size_t after = i + answer.size();
  return after == generated.size() || !is_digit(generated[after]);
}

Expected<RetrievalMode> parse_retrieval_mode(std::string_view text) {
  if (text == "prefill") return RetrievalMode::kPrefill;
  if (text == "stream") return RetrievalMode::kStream;
  if (text == "context") return RetrievalMode::kContext;
  if (text == "context-emulated") return RetrievalMode::kContextEmulated;
  if (text == "multiturn") return RetrievalMode::kMultiturn;
  return invalid_argument("--mode: '" + std::string(text).substr(0, 100) +
                          "' is not a mode; use prefill, stream, context, context-emulated or multiturn");
}

const char* retrieval_mode_name(RetrievalMode mode) {
  switch (mode) {
    case RetrievalMode::kPrefill: return "prefill";
    case RetrievalMode::kStream: return "stream";
    case RetrievalMode::kContext: return "context";
    case RetrievalMode::kContextEmulated: return "context-emulated";
    case RetrievalMode::kMultiturn: return "multiturn";
  }
  return "?";
}

Expected<size_t> question_split(const Tokenizer& tokenizer, const std::string& prompt, const std::vector<int32_t>& ids) {
  const size_t question_at = prompt.rfind(kQuestionMarker);
  if (question_at == std::string::npos || question_at == 0)
    return invalid_argument("context mode needs a document followed by its question, but the prompt has no "
                            "\"\\nQuestion:\" after the document");
  const std::string_view document(prompt.data(), question_at);
  // Usually the document tokenized alone is a prefix of the whole (pre-tokenizers split at "\n").
  const std::vector<int32_t> alone = tokenizer.encode(document, /*add_special_tokens=*/true);
  size_t k = std::min(alone.size(), ids.size());
  if (k < ids.size() && std::equal(alone.begin(), alone.end(), ids.begin())) return k;
  // Else the longest run of leading tokens whose text lies within the document.
  for (; k > 0; --k) {
    const std::string text = tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)),
                                              /*skip_special_tokens=*/true);
    if (text.size() <= document.size() && document.substr(0, text.size()) == text) break;
  }
  // A document of special tokens only spells no text: it is still not a document.
  if (k == 0 || k >= ids.size() || tokenizer.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k)), true).empty())
    return invalid_argument("context mode: no token boundary separates the document from its question");
  return k;
}

Expected<EvalItem> make_retrieval_item(const Tokenizer& tokenizer, const RetrievalExample& example, RetrievalMode mode,
                                       int max_answer_tokens) {
  EvalItem item;
  std::vector<int32_t> ids = tokenizer.encode(example.prompt, /*add_special_tokens=*/true);
  item.max_new_tokens = max_answer_tokens;
  size_t prompt_len = ids.size();
  if (mode == RetrievalMode::kStream && ids.size() > 1) prompt_len = 1;
  if (mode == RetrievalMode::kContext || mode == RetrievalMode::kContextEmulated || mode == RetrievalMode::kMultiturn) {
    Expected<size_t> split = question_split(tokenizer, example.prompt, ids);
    if (!split) return invalid_argument("document " + example.id + ": " + split.status().message());
    prompt_len = *split;
  }
  item.forced_token_ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(prompt_len), ids.end());
  ids.resize(prompt_len);
  item.prompt_token_ids = std::move(ids);
  return item;
}

void score_retrieval(const Tokenizer& tokenizer, const std::vector<RetrievalExample>& examples,
                     const std::vector<EvalItemResult>& results, PointResult* point,
                     std::vector<nlohmann::json>* details) {
  point->task = EvalTask::kRetrieval;
  point->num_documents = static_cast<int>(results.size());
  for (size_t i = 0; i < results.size() && i < examples.size(); ++i) {
    const EvalItemResult& r = results[i];
    std::string output;
    bool correct = false;
    if (r.ok) {
      output = tokenizer.decode(r.generated_token_ids, /*skip_special_tokens=*/true);
      correct = retrieval_answer_matches(output, examples[i].answer);
    } else {
      ++point->num_failed;
      if (point->first_error.empty()) point->first_error = r.error;
    }
    point->num_correct += correct ? 1 : 0;
    if (details) {
      nlohmann::json d = {{"id", examples[i].id},
                          {"policy", point->point.policy},
                          {"budget", point->point.budget},
                          {"answer", examples[i].answer},
                          {"output", output},
                          {"correct", correct}};
      if (!r.ok) d["error"] = r.error;
      details->push_back(std::move(d));
    }
  }
}

}  // namespace origami::eval
