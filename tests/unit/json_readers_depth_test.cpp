// Every JSON reader of origami refuses input nested 10^6 levels deep with an error that says so
// (core/json_parse.h), instead of overflowing the stack in what follows the parse: HTTP bodies,
// JSONL requests, model config.json, generation_config.json and hf_quant_config.json, safetensors
// headers and index, tokenizer.json and tokenizer_config.json, head budget files, and eval data.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/json_parse.h"
#include "eval/head_calibration.h"
#include "eval/retrieval_task.h"
#include "engine/jsonl_requests.h"
#include "kv/head_budgets.h"
#include "model/config.h"
#include "model/quantization_config.h"
#include "model/safetensors.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace origami {
namespace {

namespace fs = std::filesystem;

constexpr int kDepth = 1000000;

// {"a": [[[ ... 1 ... ]]]} with kDepth levels: deep below a field, as a hostile file would be.
const std::string& deep_json() {
  static const std::string text = "{\"a\":" + std::string(kDepth, '[') + "1" + std::string(kDepth, ']') + "}";
  return text;
}

std::string tiny_model_dir() { return std::string(ORIGAMI_SHARED_DIR) + "/models/origami-tiny-qwen3"; }

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class JsonReadersDepth : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("origami_json_depth_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text) const {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return dir_ / name;
  }
  // The error names the nesting and its limit, and quotes none of the input.
  static void expect_depth_error(const std::string& message, int limit) {
    EXPECT_NE(message.find("JSON nested deeper than " + std::to_string(limit) + " levels at byte offset "), std::string::npos)
        << message.substr(0, 300);
    EXPECT_EQ(message.find("[[["), std::string::npos) << message.substr(0, 300);
    EXPECT_LT(message.size(), 400u);
  }
  fs::path dir_;
};

TEST_F(JsonReadersDepth, HttpBody) {
  nlohmann::json body;
  std::optional<server::ApiError> e = server::parse_json_body(deep_json(), &body);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  expect_depth_error(e->message, kRequestJsonMaxDepth);
}

TEST_F(JsonReadersDepth, JsonlRequestLineAndTheNextLineStillRuns) {
  auto tokenizer = Tokenizer::load(tiny_model_dir());
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
  const PromptBuilder builder(*tokenizer);
  const fs::path p = write("requests.jsonl", "{\"prompt\": \"hi\", \"stop\": " + std::string(kDepth, '[') + "\"x\"" +
                                                 std::string(kDepth, ']') + "}\n{\"prompt\": \"hi\"}\n");
  Expected<std::vector<JsonlRequest>> r = read_jsonl_requests(p.string(), builder, SamplingParams{});
  ASSERT_TRUE(r.has_value()) << r.status().message();
  ASSERT_EQ(r->size(), 2u);
  expect_depth_error((*r)[0].item.error, kRequestJsonMaxDepth);
  EXPECT_EQ((*r)[1].item.error, "");
}

TEST_F(JsonReadersDepth, ModelConfigAndGenerationConfig) {
  Expected<ModelConfig> c = parse_model_config(deep_json(), "config.json");
  ASSERT_FALSE(c.has_value());
  expect_depth_error(c.status().message(), kFileJsonMaxDepth);

  write("config.json", read_all(fs::path(tiny_model_dir()) / "config.json"));
  write("generation_config.json", deep_json());
  Expected<ModelConfig> g = load_model_config(dir_);
  ASSERT_FALSE(g.has_value());
  EXPECT_NE(g.status().message().find("generation_config.json"), std::string::npos);
  expect_depth_error(g.status().message(), kFileJsonMaxDepth);
}

TEST_F(JsonReadersDepth, ModelOptQuantizationFile) {
  QuantizationConfig q;
  const Status st = parse_modelopt_quant_file(deep_json(), "hf_quant_config.json", &q);
  ASSERT_FALSE(st.is_ok());
  expect_depth_error(st.message(), kFileJsonMaxDepth);
}

TEST_F(JsonReadersDepth, SafetensorsHeaderAndIndex) {
  Expected<std::vector<SafetensorsTensorInfo>> h = parse_safetensors_header(deep_json(), 0, "model.safetensors");
  ASSERT_FALSE(h.has_value());
  expect_depth_error(h.status().message(), kFileJsonMaxDepth);

  write("model.safetensors.index.json", deep_json());
  Expected<std::shared_ptr<SafetensorsCheckpoint>> ckpt = SafetensorsCheckpoint::open(dir_);
  ASSERT_FALSE(ckpt.has_value());
  expect_depth_error(ckpt.status().message(), kFileJsonMaxDepth);
}

TEST_F(JsonReadersDepth, TokenizerJsonAndTokenizerConfig) {
  Expected<std::shared_ptr<Tokenizer>> t = Tokenizer::from_json_text(deep_json(), "tokenizer.json");
  ASSERT_FALSE(t.has_value());
  expect_depth_error(t.status().message(), kFileJsonMaxDepth);

  const std::string tokenizer_json = read_all(fs::path(tiny_model_dir()) / "tokenizer.json");
  Expected<std::shared_ptr<Tokenizer>> with_config =
      Tokenizer::from_json_text(tokenizer_json, "tokenizer.json", &deep_json(), "tokenizer_config.json");
  ASSERT_FALSE(with_config.has_value());
  expect_depth_error(with_config.status().message(), kFileJsonMaxDepth);

  Expected<ChatTemplate> ct = ChatTemplate::from_tokenizer_config(write("tokenizer_config.json", deep_json()).string());
  ASSERT_FALSE(ct.has_value());
  expect_depth_error(ct.status().message(), kFileJsonMaxDepth);
}

TEST_F(JsonReadersDepth, HeadBudgetFile) {
  Expected<HeadBudgets> b = parse_head_budgets(deep_json(), "budgets.json");
  ASSERT_FALSE(b.has_value());
  expect_depth_error(b.status().message(), kFileJsonMaxDepth);
}

TEST_F(JsonReadersDepth, EvalRetrievalDataAndCalibrationSamples) {
  const fs::path data = write("data.jsonl", deep_json() + "\n");
  Expected<std::vector<eval::RetrievalExample>> r = eval::load_retrieval_examples(data.string());
  ASSERT_FALSE(r.has_value());
  expect_depth_error(r.status().message(), kRequestJsonMaxDepth);

  auto tokenizer = Tokenizer::load(tiny_model_dir());
  ASSERT_TRUE(tokenizer.has_value()) << tokenizer.status().message();
  const PromptBuilder builder(*tokenizer);
  Expected<std::vector<eval::CalibrationSample>> s = eval::read_calibration_samples(data.string(), builder, {});
  ASSERT_FALSE(s.has_value());
  expect_depth_error(s.status().message(), kRequestJsonMaxDepth);
}

}  // namespace
}  // namespace origami
