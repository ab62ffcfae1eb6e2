// A config.json that implies far more weights than the files hold (a billion layers, a huge
// vocabulary) is an error naming the mismatch, found before anything is sized from the config:
// it used to end in std::bad_alloc and exit 134.
#include <gtest/gtest.h>

#include <limits>

#include "model_test_util.h"

namespace origami {
namespace {

using testing::message_has;

ModelConfig stories_config() {
  auto config = load_model_config(testing::stories_dir());
  EXPECT_TRUE(config.has_value()) << config.status().message();
  return *config;
}

TEST(ModelLoadSize, ParameterCountMatchesTheExactCount) {
  for (const auto& dir : {testing::stories_dir(), testing::tiny_qwen3_dir()}) {
    auto config = load_model_config(dir);
    ASSERT_TRUE(config.has_value());
    EXPECT_EQ(config->parameter_count(), static_cast<double>(config->num_parameters())) << dir;
  }
}

TEST(ModelLoadSize, BillionLayersIsAnErrorNotAnAllocation) {
  ModelConfig c = stories_config();
  c.num_layers = 1000000000;
  Status st;
  ASSERT_NO_THROW(st = load_model_weights(testing::stories_dir(), c).status());
  EXPECT_EQ(st.code(), ErrorCode::kInvalidFile);
  EXPECT_TRUE(message_has(st, {"config.json describes", "parameters", "weight files hold only", "num_hidden_layers"}));
}

TEST(ModelLoadSize, HugeHiddenOrVocabIsAnError) {
  ModelConfig c = stories_config();
  c.vocab_size = std::numeric_limits<int>::max();
  EXPECT_TRUE(message_has(load_model_weights(testing::stories_dir(), c).status(), {"weight files hold only"}));
  c = stories_config();
  c.hidden_size = 1 << 30;
  c.intermediate_size = 1 << 30;
  EXPECT_TRUE(message_has(load_model_weights(testing::stories_dir(), c).status(), {"weight files hold only"}));
}

TEST(ModelLoadSize, ExactSizeBf16CheckpointStillLoads) {
  // The tiny Qwen3 is stored in bf16: exactly 2 bytes per parameter, the check's lower bound.
  auto config = load_model_config(testing::tiny_qwen3_dir());
  ASSERT_TRUE(config.has_value());
  auto w = load_model_weights(testing::tiny_qwen3_dir(), *config);
  EXPECT_TRUE(w.has_value()) << w.status().message();
}

}  // namespace
}  // namespace origami
