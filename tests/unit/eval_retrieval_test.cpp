// The retrieval task: the scoring rule, the JSONL reader's errors, and how documents become
// requests in prefill, stream and context mode.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "eval/retrieval_task.h"

namespace origami::eval {
namespace {

namespace fs = std::filesystem;

TEST(RetrievalScoring, ExactDigitsAtTheStartMatch) {
  EXPECT_TRUE(retrieval_answer_matches(" 0181.", "0181"));
  EXPECT_TRUE(retrieval_answer_matches("0181", "0181"));
  EXPECT_TRUE(retrieval_answer_matches(" 0181", "0181"));
  EXPECT_TRUE(retrieval_answer_matches(" 0181. The secret number of", "0181"));
  EXPECT_TRUE(retrieval_answer_matches(" 0181,", "0181"));
}

TEST(RetrievalScoring, LeadingWhitespaceOfAnyKindIsSkipped) {
  EXPECT_TRUE(retrieval_answer_matches("\n\t  0181.", "0181"));
  EXPECT_TRUE(retrieval_answer_matches("\r\n5908\n", "5908"));
  // Whitespace inside the number is not the number.
  EXPECT_FALSE(retrieval_answer_matches(" 01 81.", "0181"));
  EXPECT_FALSE(retrieval_answer_matches(" 0 181", "0181"));
}

TEST(RetrievalScoring, WrongOrPartialDigitsDoNotMatch) {
  EXPECT_FALSE(retrieval_answer_matches(" 0182.", "0181"));
  EXPECT_FALSE(retrieval_answer_matches(" 1810.", "0181"));
  EXPECT_FALSE(retrieval_answer_matches(" 018", "0181"));     // cut short
  EXPECT_FALSE(retrieval_answer_matches(" 01812.", "0181"));  // a longer number is another number
  EXPECT_FALSE(retrieval_answer_matches(" 181.", "0181"));    // leading zero dropped
  EXPECT_FALSE(retrieval_answer_matches("", "0181"));
  EXPECT_FALSE(retrieval_answer_matches("   ", "0181"));
  EXPECT_FALSE(retrieval_answer_matches(" the 0181.", "0181"));  // must be at the start
  EXPECT_FALSE(retrieval_answer_matches(" 0181", ""));
}

class RetrievalFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("origami_eval_retrieval_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(RetrievalFile, ReadsExamplesAndKeepsTheFirstNWithLimit) {
  const std::string path = write("ok.jsonl",
                                 "{\"id\": 0, \"prompt\": \"a is\", \"answer\": \"0181\", \"depth\": 0.1}\n"
                                 "\n"
                                 "{\"id\": \"x\", \"prompt\": \"b is\", \"answer\": \"5908\"}\n"
                                 "{\"prompt\": \"c is\", \"answer\": \"1234\"}\n");
  auto all = load_retrieval_examples(path);
  ASSERT_TRUE(all.has_value()) << all.status().to_string();
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].id, "0");
  EXPECT_EQ((*all)[0].answer, "0181");
  EXPECT_EQ((*all)[1].id, "x");
  EXPECT_EQ((*all)[2].id, "2");  // no id: its index
  EXPECT_EQ((*all)[2].prompt, "c is");
  auto two = load_retrieval_examples(path, 2);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(two->size(), 2u);
}

TEST_F(RetrievalFile, ErrorsNameTheFileLineAndField) {
  auto missing = load_retrieval_examples((dir_ / "nope.jsonl").string());
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("nope.jsonl"), std::string::npos) << missing.status().message();

  auto bad_json = load_retrieval_examples(write("a.jsonl", "{\"prompt\": \"a\", \"answer\": \"0181\"}\n{oops\n"));
  ASSERT_FALSE(bad_json.has_value());
  EXPECT_NE(bad_json.status().message().find("a.jsonl:2"), std::string::npos) << bad_json.status().message();

  auto bad_answer = load_retrieval_examples(write("b.jsonl", "{\"prompt\": \"a\", \"answer\": \"18\"}\n"));
  ASSERT_FALSE(bad_answer.has_value());
  EXPECT_NE(bad_answer.status().message().find("\"answer\""), std::string::npos) << bad_answer.status().message();
  EXPECT_NE(bad_answer.status().message().find("18"), std::string::npos);

  auto numeric_answer = load_retrieval_examples(write("c.jsonl", "{\"prompt\": \"a\", \"answer\": 181}\n"));
  ASSERT_FALSE(numeric_answer.has_value());
  EXPECT_NE(numeric_answer.status().message().find("\"answer\""), std::string::npos);

  auto no_prompt = load_retrieval_examples(write("d.jsonl", "{\"answer\": \"0181\"}\n"));
  ASSERT_FALSE(no_prompt.has_value());
  EXPECT_NE(no_prompt.status().message().find("\"prompt\""), std::string::npos);

  auto empty = load_retrieval_examples(write("e.jsonl", "\n\n"));
  ASSERT_FALSE(empty.has_value());
  EXPECT_NE(empty.status().message().find("no examples"), std::string::npos);
}

TEST(RetrievalMode, ParsesTheThreeModesAndNamesABadOne) {
  EXPECT_EQ(*parse_retrieval_mode("prefill"), RetrievalMode::kPrefill);
  EXPECT_EQ(*parse_retrieval_mode("stream"), RetrievalMode::kStream);
  EXPECT_EQ(*parse_retrieval_mode("context"), RetrievalMode::kContext);
  for (RetrievalMode m : {RetrievalMode::kPrefill, RetrievalMode::kStream, RetrievalMode::kContext})
    EXPECT_EQ(*parse_retrieval_mode(retrieval_mode_name(m)), m);
  auto bad = parse_retrieval_mode("streaming");
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("--mode"), std::string::npos);
  EXPECT_NE(bad.status().message().find("streaming"), std::string::npos);
}

TEST(RetrievalItems, StreamModeForcesEverythingAfterTheFirstToken) {
  auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().to_string();
  RetrievalExample ex{"0", "The secret number of the red fox is 1234. Question: the red fox? Answer: it is", "1234"};
  const std::vector<int32_t> ids = (*tokenizer)->encode(ex.prompt, true);
  ASSERT_GT(ids.size(), 5u);

  const EvalItem prefill = *make_retrieval_item(**tokenizer, ex, RetrievalMode::kPrefill, 6);
  EXPECT_EQ(prefill.prompt_token_ids, ids);
  EXPECT_TRUE(prefill.forced_token_ids.empty());
  EXPECT_EQ(prefill.max_new_tokens, 6);

  const EvalItem stream = *make_retrieval_item(**tokenizer, ex, RetrievalMode::kStream, 6);
  // This tokenizer adds no BOS, so the prompt is the document's first token.
  ASSERT_FALSE((*tokenizer)->bos_token_id().has_value() && ids[0] == *(*tokenizer)->bos_token_id());
  ASSERT_EQ(stream.prompt_token_ids.size(), 1u);
  EXPECT_EQ(stream.prompt_token_ids[0], ids[0]);
  std::vector<int32_t> joined = stream.prompt_token_ids;
  joined.insert(joined.end(), stream.forced_token_ids.begin(), stream.forced_token_ids.end());
  EXPECT_EQ(joined, ids);
  EXPECT_EQ(stream.max_new_tokens, 6);
  EXPECT_FALSE(stream.return_forced_logprobs);
}

TEST(RetrievalItems, ContextModePromptsWithTheDocumentAndForcesTheQuestion) {
  auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().to_string();
  const Tokenizer& tok = **tokenizer;
  const std::string document = "The secret number of the red fox is 1234. A Question: is not here.\nQuestion: a decoy?";
  const std::string question = "\nQuestion: What is the secret number of the red fox?\nAnswer: The secret number of the red fox is";
  RetrievalExample ex{"7", document + question, "1234"};
  const std::vector<int32_t> ids = tok.encode(ex.prompt, true);

  const EvalItem context = *make_retrieval_item(tok, ex, RetrievalMode::kContext, 6);
  // The same token sequence as prefill mode, cut where the last question starts.
  std::vector<int32_t> joined = context.prompt_token_ids;
  joined.insert(joined.end(), context.forced_token_ids.begin(), context.forced_token_ids.end());
  EXPECT_EQ(joined, ids);
  // "?\n" is one token of this tokenizer: the cut is the last token boundary inside the document,
  // before the decoy's "?" (the document tokenized alone is no prefix of the whole).
  const std::string head = tok.decode(context.prompt_token_ids, true);
  EXPECT_EQ(head, document.substr(0, document.size() - 1));
  EXPECT_EQ(tok.decode(context.forced_token_ids, true), "?" + question);
  // Without such a merge the document is exactly the text before the question.
  RetrievalExample plain{"8", "The secret number of the red fox is 1234. Filler" + question, "1234"};
  const EvalItem cut = *make_retrieval_item(tok, plain, RetrievalMode::kContext, 6);
  EXPECT_EQ(tok.decode(cut.prompt_token_ids, true), "The secret number of the red fox is 1234. Filler");
  EXPECT_EQ(tok.decode(cut.forced_token_ids, true), question);
  EXPECT_EQ(context.max_new_tokens, 6);
  EXPECT_FALSE(context.return_forced_logprobs);
}

TEST(RetrievalItems, ContextModeCutsAtATokenBoundaryWhenTheDocumentTokenizesDifferentlyAlone) {
  auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(tokenizer.has_value());
  const Tokenizer& tok = **tokenizer;
  // Spaces before the marker: alone, the document ends in "   "; in the whole prompt the
  // pre-tokenizer may group them with the newline. Whatever it does, the cut is a token boundary
  // inside the document's text and both parts are non-empty.
  const std::string prompt = "Some facts here.   \nQuestion: what?\nAnswer: it is";
  const std::vector<int32_t> ids = tok.encode(prompt, true);
  Expected<size_t> k = question_split(tok, prompt, ids);
  ASSERT_TRUE(k.has_value()) << k.status().to_string();
  ASSERT_GT(*k, 0u);
  ASSERT_LT(*k, ids.size());
  const std::string head = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(*k)), true);
  EXPECT_EQ(prompt.rfind(head, 0), 0u) << head;
  EXPECT_LE(head.size(), prompt.find("\nQuestion:"));
  EXPECT_GE(head.size(), std::string("Some facts here.").size());
}

TEST(RetrievalItems, ContextModeWithoutAQuestionIsAnErrorNamingTheDocument) {
  auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(tokenizer.has_value());
  for (const char* prompt : {"The secret number of the red fox is", "\nQuestion: only a question?"}) {
    RetrievalExample ex{"doc-3", prompt, "1234"};
    Expected<EvalItem> item = make_retrieval_item(**tokenizer, ex, RetrievalMode::kContext, 6);
    ASSERT_FALSE(item.has_value()) << prompt;
    EXPECT_NE(item.status().message().find("doc-3"), std::string::npos) << item.status().message();
    EXPECT_NE(item.status().message().find("Question:"), std::string::npos) << item.status().message();
    // The other modes do not need the question.
    EXPECT_TRUE(make_retrieval_item(**tokenizer, ex, RetrievalMode::kPrefill, 6).has_value());
  }
}

TEST(RetrievalScore, CountsCorrectAnswersAndFailuresAsWrong) {
  auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(tokenizer.has_value());
  const Tokenizer& tok = **tokenizer;
  std::vector<RetrievalExample> examples = {{"a", "p", "0181"}, {"b", "p", "5908"}, {"c", "p", "1234"}};
  std::vector<EvalItemResult> results(3);
  results[0].ok = true;
  results[0].generated_token_ids = tok.encode(" 0181.", false);
  results[1].ok = true;
  results[1].generated_token_ids = tok.encode(" 5909.", false);
  results[2].ok = false;
  results[2].error = "out of blocks";
  PointResult point;
  point.point = SweepPoint{"full", 0, true};
  std::vector<nlohmann::json> details;
  score_retrieval(tok, examples, results, &point, &details);
  EXPECT_EQ(point.num_documents, 3);
  EXPECT_EQ(point.num_correct, 1);
  EXPECT_EQ(point.num_failed, 1);
  EXPECT_EQ(point.first_error, "out of blocks");
  EXPECT_DOUBLE_EQ(point.accuracy(), 1.0 / 3.0);
  ASSERT_EQ(details.size(), 3u);
  EXPECT_EQ(details[0]["output"], " 0181.");
  EXPECT_EQ(details[0]["correct"], true);
  EXPECT_EQ(details[1]["correct"], false);
  EXPECT_EQ(details[2]["error"], "out of blocks");
}

}  // namespace
}  // namespace origami::eval
