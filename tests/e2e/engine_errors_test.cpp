// Bad input gets a clear error naming what is wrong, and the engine keeps serving the rest.
#include <filesystem>

#include "engine/prompt_builder.h"
#include "engine/sampling_json.h"
#include "engine_test_util.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

TEST(EngineErrors, PromptLongerThanContextIsRejectedAndOthersComplete) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_model_len = 64;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  std::vector<BatchItem> items(3);
  items[0].prompt_token_ids = {463, 4592, 301};
  items[0].sampling = greedy(8);
  items[1].prompt_token_ids.assign(100, 463);  // longer than max_model_len
  items[1].sampling = greedy(8);
  items[2].prompt_token_ids = {6322, 2171, 264, 738};
  items[2].sampling = greedy(8);
  auto results = run_batch(*engine, items);
  EXPECT_TRUE(results[0].ok);
  EXPECT_EQ(results[0].output_token_ids.size(), 8u);
  EXPECT_FALSE(results[1].ok);
  EXPECT_NE(results[1].error.find("100 tokens"), std::string::npos) << results[1].error;
  EXPECT_NE(results[1].error.find("64"), std::string::npos) << results[1].error;
  EXPECT_TRUE(results[2].ok);
}

TEST(EngineErrors, GenerationStopsAtMaxModelLen) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.max_model_len = 20;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  std::vector<BatchItem> items(1);
  items[0].prompt_token_ids = {463, 4592, 301, 270, 5936};
  items[0].sampling = greedy(100);
  auto results = run_batch(*engine, items);
  ASSERT_TRUE(results[0].ok);
  EXPECT_EQ(results[0].output_token_ids.size(), 15u);
  EXPECT_EQ(results[0].finish_reason, FinishReason::kLength);
}

TEST(EngineErrors, InvalidSamplingValuesNameTheField) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  struct Case { const char* json; const char* field; };
  for (const Case& c : {Case{R"({"temperature": -1})", "temperature"}, Case{R"({"top_p": 0})", "top_p"},
                        Case{R"({"top_p": 1.5})", "top_p"}, Case{R"({"min_p": 2})", "min_p"},
                        Case{R"({"top_k": -5})", "top_k"}, Case{R"({"max_tokens": 0})", "max_tokens"},
                        Case{R"({"temperature": "hot"})", "temperature"}, Case{R"({"stop": 5})", "stop"},
                        Case{R"({"stop_token_ids": ["a"]})", "stop_token_ids"},
                        Case{R"({"stop_token_ids": [4294967298]})", "stop_token_ids"}}) {
    auto sp = sampling_params_from_json(nlohmann::json::parse(c.json), SamplingParams{});
    ASSERT_FALSE(sp.has_value()) << c.json;
    EXPECT_NE(sp.status().message().find(c.field), std::string::npos) << sp.status().message();
  }
  SamplingParams bad;
  bad.temperature = -0.5f;
  auto id = engine->add_request({463, 4592}, bad);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("temperature"), std::string::npos);
  EXPECT_FALSE(engine->has_unfinished());
}

TEST(EngineErrors, OutOfVocabularyAndEmptyPromptsAreRejected) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  auto a = engine->add_request({1, 99999}, greedy(4));
  ASSERT_FALSE(a.has_value());
  EXPECT_NE(a.status().message().find("99999"), std::string::npos);
  auto b = engine->add_request({}, greedy(4));
  ASSERT_FALSE(b.has_value());
  EXPECT_NE(b.status().message().find("empty"), std::string::npos);
}

TEST(EngineErrors, MalformedRequestsNameTheProblem) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  PromptBuilder builder(engine->tokenizer());
  EXPECT_FALSE(builder.from_json(nlohmann::json::parse(R"({"text": "hi"})")).has_value());
  EXPECT_FALSE(builder.from_json(nlohmann::json::parse(R"({"prompt": 3})")).has_value());
  EXPECT_FALSE(builder.from_json(nlohmann::json::parse(R"({"messages": "hi"})")).has_value());
  auto ok = builder.from_json(nlohmann::json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"));
  ASSERT_TRUE(ok.has_value()) << ok.status().to_string();
  // The tiny model's template: <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
  EXPECT_EQ(engine->tokenizer()->decode(*ok, false), "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(EngineErrors, AbortedRequestFreesItsBlocks) {
  auto engine = make_engine(cpu_config(tiny_qwen3_dir()));
  ASSERT_NE(engine, nullptr);
  auto id = engine->add_request({463, 4592, 301}, greedy(1000));
  ASSERT_TRUE(id.has_value());
  engine->step();
  engine->step();
  engine->abort_request(*id);
  bool aborted = false;
  while (engine->has_unfinished())
    for (auto& out : engine->step())
      if (out.finished) aborted = out.finish_reason == FinishReason::kAborted;
  EXPECT_TRUE(aborted);
  auto again = engine->add_request({463, 4592, 301}, greedy(4));
  EXPECT_TRUE(again.has_value());
}

TEST(EngineErrors, BadModelFoldersFailCleanly) {
  const fs::path dir = fs::temp_directory_path() / "origami_bad_model";
  fs::create_directories(dir);
  {
    std::ofstream(dir / "config.json") << R"({"architectures": ["MambaForCausalLM"], "model_type": "mamba"})";
  }
  EngineConfig c = cpu_config(dir.string());
  auto engine = Engine::create(c);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().message().find("Mamba"), std::string::npos) << engine.status().message();
  c.model_dir = (dir / "missing").string();
  auto missing = Engine::create(c);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.status().message().find("config.json"), std::string::npos) << missing.status().message();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace origami::testing
