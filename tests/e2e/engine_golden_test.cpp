// The engine's greedy continuations equal HuggingFace's (golden files), token for token.
#include "engine_test_util.h"

namespace origami::testing {
namespace {

void check_greedy_golden(const std::string& model_dir, const std::string& golden_file) {
  const nlohmann::json golden = read_json(shared_dir() + "/golden/" + golden_file);
  auto engine = make_engine(cpu_config(model_dir));
  ASSERT_NE(engine, nullptr);
  std::vector<BatchItem> items;
  for (const auto& g : golden["greedy"]) {
    BatchItem item;
    item.prompt_token_ids = g["prompt_ids"].get<std::vector<int32_t>>();
    item.sampling = greedy(static_cast<int>(g["greedy_ids"].size()));
    items.push_back(item);
  }
  // The tokenizer must produce the golden prompt ids from the prompt text.
  for (const auto& g : golden["greedy"]) {
    EXPECT_EQ(engine->tokenizer()->encode(g["prompt"].get<std::string>(), true), g["prompt_ids"].get<std::vector<int32_t>>())
        << g["prompt"];
  }
  std::vector<BatchResult> results = run_batch(*engine, items);
  ASSERT_EQ(results.size(), golden["greedy"].size());
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_TRUE(results[i].ok) << results[i].error;
    EXPECT_EQ(results[i].output_token_ids, golden["greedy"][i]["greedy_ids"].get<std::vector<int32_t>>())
        << "prompt: " << golden["greedy"][i]["prompt"];
    EXPECT_EQ(results[i].text, golden["greedy"][i]["text"].get<std::string>());
  }
}

TEST(EngineGolden, TinyQwen3GreedyMatchesHuggingFace) {
  check_greedy_golden(tiny_qwen3_dir(), "origami-tiny-qwen3_golden.json");
}

TEST(EngineGolden, Stories260kGreedyMatchesHuggingFace) {
  check_greedy_golden(stories_dir(), "stories260k_golden.json");
}

}  // namespace
}  // namespace origami::testing
