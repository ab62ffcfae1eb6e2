// The JSONL request reader shared by `generate --input` and `bench --input`: one item per line
// (index = line number - 1), and every way a line can be wrong is an error naming the line and
// the field, never a silent wrap, drop or skip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <sys/stat.h>
#include <unistd.h>

#include "engine/jsonl_requests.h"
#include "kv/head_budgets.h"

namespace origami {
namespace {

namespace fs = std::filesystem;

class JsonlRequests : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::load(std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3");
    ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
    builder_ = std::make_unique<PromptBuilder>(*tokenizer);
    path_ = fs::temp_directory_path() / ("origami_jsonl_" + std::to_string(::getpid()) + ".jsonl");
    budgets_path_ = fs::temp_directory_path() / ("origami_jsonl_budgets_" + std::to_string(::getpid()) + ".json");
    std::ofstream(budgets_path_) << head_budgets_to_json(sample_budgets());
  }
  void TearDown() override {
    fs::remove(path_);
    fs::remove(budgets_path_);
  }

  static HeadBudgets sample_budgets() {
    HeadBudgets b;
    b.model = {"qwen3", 2, 4, 8, 64, 512, 8192};
    b.scorer = "snapkv";
    b.samples = 1;
    b.sample_tokens = {512};
    b.ratios = {{0.1, 0.25, 0.5, 1.0}, {0.3, 0.2, 0.7, 0.05}};
    b.mean = b.ratios;
    b.stddev = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    return b;
  }

  std::vector<JsonlRequest> read(const std::string& text) {
    { std::ofstream(path_, std::ios::binary) << text; }
    Expected<std::vector<JsonlRequest>> r = read_jsonl_requests(path_.string(), *builder_, SamplingParams{});
    EXPECT_TRUE(r.has_value()) << r.status().message();
    return r ? *r : std::vector<JsonlRequest>{};
  }
  // The error of a one-line file.
  std::string error_of(const std::string& line) {
    std::vector<JsonlRequest> r = read(line + "\n");
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? "" : r[0].item.error;
  }
  std::string where(int line) const { return path_.string() + ":" + std::to_string(line) + ": "; }

  std::unique_ptr<PromptBuilder> builder_;
  fs::path path_;
  fs::path budgets_path_;
};

TEST_F(JsonlRequests, EveryLineGetsAnItemIncludingBlankOnes) {
  std::vector<JsonlRequest> r = read("{\"prompt\": [1, 2], \"id\": \"a\"}\n\n   \n{\"prompt\": \"hi\", \"max_tokens\": 3}\n");
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].item.error, "");
  EXPECT_EQ(r[0].item.prompt_token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(r[0].id, "a");
  EXPECT_EQ(r[0].item.label, where(1));
  EXPECT_EQ(r[1].item.error.rfind(where(2) + "blank line", 0), 0u) << r[1].item.error;
  EXPECT_EQ(r[2].item.error.rfind(where(3) + "blank line", 0), 0u) << r[2].item.error;
  EXPECT_EQ(r[3].item.error, "");
  EXPECT_EQ(r[3].item.sampling.max_tokens, 3);
}

TEST_F(JsonlRequests, TokenIdsAreRangeCheckedIn64BitsBeforeNarrowing) {
  // 4294967301 = 2^32 + 5 used to run as id 5; 2^63 - 1 was reported as id -1.
  std::string e = error_of(R"({"prompt": [1, 4294967301]})");
  EXPECT_EQ(e.rfind(where(1), 0), 0u) << e;
  EXPECT_NE(e.find("'prompt'[1] = 4294967301 is not a token id"), std::string::npos) << e;
  e = error_of(R"({"prompt": [9223372036854775807]})");
  EXPECT_NE(e.find("9223372036854775807 is not a token id"), std::string::npos) << e;
  e = error_of(R"({"prompt": [18446744073709551615]})");
  EXPECT_NE(e.find("18446744073709551615 is not a token id"), std::string::npos) << e;
  e = error_of(R"({"prompt": [-1]})");
  EXPECT_NE(e.find("-1 is not a token id"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "stop_token_ids": [4294967298]})");
  EXPECT_NE(e.find("'stop_token_ids'[0] = 4294967298"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "forced_output_tokens": [2147483648]})");
  EXPECT_NE(e.find("'forced_output_tokens'[0] = 2147483648"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "max_tokens": 18446744073709551615})");
  EXPECT_NE(e.find("'max_tokens' is out of range"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "kv_budget": 18446744073709551615})");
  EXPECT_NE(e.find("kv_budget"), std::string::npos) << e;
  EXPECT_EQ(error_of(R"({"prompt": [0, 2147483647]})"), "");  // the engine checks the vocabulary
}

TEST_F(JsonlRequests, UnknownFieldsAreErrorsWithASuggestion) {
  std::string e = error_of(R"({"prompt": "x", "max_tokns": 5})");
  EXPECT_EQ(e.rfind(where(1), 0), 0u) << e;
  EXPECT_NE(e.find("unknown field 'max_tokns' (did you mean 'max_tokens'?)"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "metadata": {"a": 1}})");
  EXPECT_NE(e.find("unknown field 'metadata'"), std::string::npos) << e;
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;
  // Every field the readers take is known.
  EXPECT_EQ(error_of(R"({"id": 7, "prompt": "x", "temperature": 0.5, "top_p": 0.9, "top_k": 5, "min_p": 0.1,)"
                     R"( "max_tokens": 4, "ignore_eos": true, "seed": 3, "stop": ["a"], "stop_token_ids": [2],)"
                     R"( "include_stop_str_in_output": false, "kv_policy": "streaming", "kv_budget": 64,)"
                     R"( "kv_policy_options": {"sinks": 4}, "kv_head_budgets": ")" + budgets_path_.string() + R"(", "forced_output_tokens": [1],)"
                     R"( "return_forced_logprobs": true})"),
            "");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {}})"), "");
}

TEST_F(JsonlRequests, PenaltiesMinTokensAndLogitBias) {
  std::vector<JsonlRequest> r = read(
      R"({"prompt": "x", "presence_penalty": 1.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,)"
      R"( "min_tokens": 2, "logit_bias": {"5": 10}})" "\n");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].item.error, "");
  const SamplingParams& sp = r[0].item.sampling;
  EXPECT_EQ(sp.presence_penalty, 1.5f);
  EXPECT_EQ(sp.frequency_penalty, -0.5f);
  EXPECT_EQ(sp.repetition_penalty, 1.1f);
  EXPECT_EQ(sp.min_tokens, 2);
  EXPECT_EQ(sp.logit_bias, (std::vector<std::pair<int32_t, float>>{{5, 10.0f}}));
  EXPECT_NE(error_of(R"({"prompt": "x", "repetition_penalty": 0})").find("repetition_penalty"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "x", "frequency_penalty": -3})").find("frequency_penalty"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "x", "logit_bias": [1]})").find("logit_bias"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "x", "logit_bias": {"-1": 1}})").find("token ids"), std::string::npos);
  EXPECT_NE(error_of(R"({"prompt": "x", "temprature": 1})").find("did you mean 'temperature'"), std::string::npos);
}

// A line's kv_head_budgets is a file (the operator's: read as the line is parsed, once per path)
// or the budget object itself; never a FIFO or device, which would stall or exhaust the reader.
TEST_F(JsonlRequests, HeadBudgetsAreAFileReadAtParseOrAnObject) {
  const std::string line = R"({"prompt": "x", "kv_policy": "tangram", "kv_head_budgets": ")" + budgets_path_.string() + R"("})";
  std::vector<JsonlRequest> r = read(line + "\n" + line + "\n");
  ASSERT_EQ(r.size(), 2u);
  ASSERT_EQ(r[0].item.error, "");
  ASSERT_NE(r[0].item.options.kv_head_budgets, nullptr);
  EXPECT_EQ(r[0].item.options.kv_head_budgets->ratios, sample_budgets().ratios);
  EXPECT_EQ(r[0].item.options.kv_head_budgets, r[1].item.options.kv_head_budgets) << "read once per path";
  fs::remove(budgets_path_);  // already read: a later line naming it uses the copy read

  r = read(R"({"prompt": "x", "kv_head_budgets": )" + nlohmann::json::parse(head_budgets_to_json(sample_budgets())).dump() + "}\n");
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].item.error, "") << "an inline object is read as the file's content";
  EXPECT_EQ(r[0].item.options.kv_head_budgets->ratios, sample_budgets().ratios);

  const fs::path fifo = fs::temp_directory_path() / ("origami_jsonl_fifo_" + std::to_string(::getpid()));
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = error_of(R"({"prompt": "x", "kv_head_budgets": ")" + fifo.string() + R"("})");
  EXPECT_NE(e.find("is not a regular file"), std::string::npos) << e;
  fs::remove(fifo);
  e = error_of(R"({"prompt": "x", "kv_head_budgets": "/dev/zero"})");
  EXPECT_NE(e.find("/dev/zero: is not a regular file"), std::string::npos) << e;
  e = error_of(R"({"prompt": "x", "kv_head_budgets": "/no/such/budgets.json"})");
  EXPECT_NE(e.find("/no/such/budgets.json: cannot open file"), std::string::npos) << e;
  for (const char* bad : {R"({"prompt": "x", "kv_head_budgets": 3})", R"({"prompt": "x", "kv_head_budgets": ""})"}) {
    e = error_of(bad);
    EXPECT_NE(e.find("field 'kv_head_budgets' must be a head budget object"), std::string::npos) << e;
  }
  e = error_of(R"({"prompt": "x", "kv_head_budgets": {"format": "sk-live-secret"}})");
  EXPECT_NE(e.find("kv_head_budgets: field 'format' is not 'origami-head-budgets'"), std::string::npos) << e;
  EXPECT_EQ(e.find("sk-live"), std::string::npos) << e;
}

TEST_F(JsonlRequests, NegativeSeedIsAnError) {
  std::string e = error_of(R"({"prompt": "x", "seed": -1})");
  EXPECT_NE(e.find("field 'seed' must be a non-negative integer"), std::string::npos) << e;
  std::vector<JsonlRequest> r = read(R"({"prompt": "x", "seed": 18446744073709551615})" "\n");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].item.error, "");
  EXPECT_EQ(r[0].item.sampling.seed, 18446744073709551615ull);
}

TEST_F(JsonlRequests, MissingFileIsAnError) {
  Expected<std::vector<JsonlRequest>> r = read_jsonl_requests("/nonexistent/in.jsonl", *builder_, SamplingParams{});
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.status().message().find("/nonexistent/in.jsonl"), std::string::npos);
}

}  // namespace
}  // namespace origami
