// Configurations and models that used to abort, or silently do something other than asked, are
// errors naming the cause: values above the model's context, a tokenizer the embedding cannot
// serve, sizes beyond the machine's memory, a budget for a policy without one, and weights that
// turn every logit into NaN.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include <unistd.h>

#include "engine/engine_setup_check.h"
#include "engine_test_util.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"

namespace origami::testing {
namespace {

namespace fs = std::filesystem;

::testing::AssertionResult fails_with(const EngineConfig& config, const std::string& part) {
  Expected<std::unique_ptr<Engine>> engine = Engine::create(config);
  if (engine.has_value()) return ::testing::AssertionFailure() << "Engine::create succeeded";
  if (engine.status().message().find(part) == std::string::npos)
    return ::testing::AssertionFailure() << "message '" << engine.status().message() << "' lacks '" << part << "'";
  return ::testing::AssertionSuccess();
}

TEST(EngineHardening, MaxModelLenAboveTheContextOrNegativeIsRejected) {
  EngineConfig c = cpu_config(stories_dir());  // max_position_embeddings 512
  c.max_model_len = 701;
  EXPECT_TRUE(fails_with(c, "--max-model-len 701 exceeds the model's context of 512 tokens"));
  c.max_model_len = -3;
  EXPECT_TRUE(fails_with(c, "max_model_len must be positive"));
  c.max_model_len = 512;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  EXPECT_EQ(engine->config().max_model_len, 512);
}

TEST(EngineHardening, TokenizerWithIdsBeyondTheEmbeddingIsRejected) {
  EngineConfig c = cpu_config(stories_dir());  // 512-row embedding
  c.tokenizer_dir = tiny_qwen3_dir();          // 8192 tokens
  EXPECT_TRUE(fails_with(c, "has 8192 tokens, but the model's embedding has only 512 rows"));
  // Benchmarks on dummy weights borrow any tokenizer (e.g. Llama shapes with Qwen's): a warning.
  c.dummy_weights = true;
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  EXPECT_NE(tokenizer_mismatch_warning(c, engine->model_config(), *engine->tokenizer()).find("will be rejected"),
            std::string::npos);
  auto own = make_engine(cpu_config(stories_dir()));  // the model's own tokenizer: nothing to say
  ASSERT_NE(own, nullptr);
  EXPECT_EQ(tokenizer_mismatch_warning(own->config(), own->model_config(), *own->tokenizer()), "");
}

TEST(EngineHardening, KvCacheBeyondHostMemoryIsRejectedBeforeAllocating) {
  EngineConfig c = cpu_config(stories_dir());
  c.num_kv_blocks = 0;
  c.kv_cache_bytes = static_cast<int64_t>(1e16);
  EXPECT_TRUE(fails_with(c, "the KV cache (--kv-cache-memory) needs about 8.9 PiB"));
  c.kv_cache_bytes = 0;
  c.num_kv_blocks = (1 << 30);
  c.model_dir = tiny_qwen3_dir();  // 48 KiB blocks: 48 TiB
  EXPECT_TRUE(fails_with(c, "the KV cache (--num-kv-blocks 1073741824) needs about"));
}

TEST(EngineHardening, DummyWeightsBeyondHostMemoryAreRejectedBeforeAllocating) {
  const fs::path dir = fs::temp_directory_path() / ("origami_huge_config_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  nlohmann::json config = read_json(stories_dir() + "/config.json");
  config["num_hidden_layers"] = 1000000000;
  std::ofstream(dir / "config.json") << config.dump();
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(fs::path(stories_dir()) / f, dir / f);
  EngineConfig c = cpu_config(dir.string());
  c.dummy_weights = true;
  Expected<std::unique_ptr<Engine>> engine = Engine::create(c);  // must not throw std::bad_alloc
  ASSERT_FALSE(engine.has_value());
  EXPECT_EQ(engine.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(engine.status().message().find("of host memory is available"), std::string::npos) << engine.status().message();
  fs::remove_all(dir);
}

TEST(EngineHardening, BudgetForAPolicyThatDoesNotCompressIsRejected) {
  auto engine = make_engine(cpu_config(stories_dir()));
  ASSERT_NE(engine, nullptr);
  RequestOptions o;
  o.kv_budget = 512;  // the engine's default policy is full
  Expected<RequestId> id = engine->add_request({1, 2, 3}, greedy(4), o);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("kv_budget 512 is given, but KV policy full does not compress"), std::string::npos)
      << id.status().message();
  o.kv_policy = "full";
  EXPECT_FALSE(engine->add_request({1, 2, 3}, greedy(4), o).has_value());
  o.kv_budget = 0;
  EXPECT_TRUE(engine->add_request({1, 2, 3}, greedy(4), o).has_value());
}

// stories260k with every weight NaN: every logit is NaN.
fs::path write_nan_model() {
  const fs::path dir = fs::temp_directory_path() / ("origami_nan_model_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(stories_dir()) / f, dir / f, fs::copy_options::overwrite_existing);
  auto ckpt = SafetensorsCheckpoint::open(stories_dir());
  EXPECT_TRUE(ckpt.has_value());
  std::vector<std::vector<float>> data;
  std::vector<SafetensorsWriteEntry> entries;
  for (const std::string& name : (*ckpt)->tensor_names()) {
    Expected<TensorView> t = (*ckpt)->tensor(name);
    EXPECT_TRUE(t.has_value());
    data.emplace_back(static_cast<size_t>(t->numel()), std::numeric_limits<float>::quiet_NaN());
  }
  size_t i = 0;
  for (const std::string& name : (*ckpt)->tensor_names()) {
    Expected<TensorView> t = (*ckpt)->tensor(name);
    entries.push_back({name, "F32", t->shape, data[i].data(), data[i].size() * sizeof(float)});
    ++i;
  }
  EXPECT_TRUE(write_safetensors(dir / "model.safetensors", entries).is_ok());
  return dir;
}

TEST(EngineHardening, NonFiniteLogitsFailTheRequestWithAClearError) {
  const fs::path dir = write_nan_model();
  auto engine = make_engine(cpu_config(dir.string()));
  ASSERT_NE(engine, nullptr);
  SamplingParams sampled = greedy(8);
  sampled.temperature = 0.8f;
  std::vector<BatchItem> items(3);
  items[0].prompt_token_ids = {1, 5, 9};
  items[0].sampling = greedy(8);
  items[1].prompt_token_ids = {1, 7};
  items[1].sampling = sampled;
  items[2].prompt_token_ids = {1, 7, 3};  // teacher forcing asks for log-probabilities, also NaN
  items[2].sampling = greedy(4);
  items[2].options.forced_output_tokens = {4, 5, 6};
  items[2].options.return_forced_logprobs = true;
  std::vector<BatchResult> results = run_batch(*engine, items);
  for (const BatchResult& r : results) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.finish_reason, FinishReason::kError);
    EXPECT_NE(r.error.find("the model's logits are not finite"), std::string::npos) << r.error;
    EXPECT_TRUE(r.output_token_ids.empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace origami::testing
