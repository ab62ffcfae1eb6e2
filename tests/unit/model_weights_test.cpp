#include <gtest/gtest.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace origami {
namespace {

using testing::message_has;
using testing::TempDir;

// Reads a tensor's raw bytes straight from the file (independently of the mmap reader).
std::string raw_tensor_bytes(const std::filesystem::path& file, const std::string& name) {
  const std::string bytes = testing::read_bytes(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const auto& off = header.at(name).at("data_offsets");
  return bytes.substr(8 + n + off[0].get<size_t>(), off[1].get<size_t>() - off[0].get<size_t>());
}

TEST(ModelWeights, LoadsStories260k) {
  auto config = load_model_config(testing::stories_dir());
  ASSERT_TRUE(config.has_value());
  auto w = load_model_weights(testing::stories_dir(), *config);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ASSERT_EQ(w->layers.size(), 5u);
  EXPECT_EQ(w->embed_tokens.shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(w->embed_tokens.dtype, DType::kF32);
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);  // tied
  EXPECT_EQ(w->lm_head.shape, w->embed_tokens.shape);
  EXPECT_EQ(w->final_norm.shape, (std::vector<int64_t>{64}));
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.q_proj.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(l.k_proj.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(l.v_proj.shape, (std::vector<int64_t>{32, 64}));
    EXPECT_EQ(l.o_proj.shape, (std::vector<int64_t>{64, 64}));
    EXPECT_EQ(l.gate_proj.shape, (std::vector<int64_t>{172, 64}));
    EXPECT_EQ(l.up_proj.shape, (std::vector<int64_t>{172, 64}));
    EXPECT_EQ(l.down_proj.shape, (std::vector<int64_t>{64, 172}));
    EXPECT_EQ(l.input_norm.shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(l.post_attn_norm.shape, (std::vector<int64_t>{64}));
    EXPECT_TRUE(l.q_bias.empty());
    EXPECT_TRUE(l.q_norm.empty());
  }
  const std::string raw = raw_tensor_bytes(testing::stories_dir() / "model.safetensors", "model.layers.3.mlp.down_proj.weight");
  std::vector<float> expected(raw.size() / 4);
  std::memcpy(expected.data(), raw.data(), raw.size());
  EXPECT_EQ(w->layers[3].down_proj.to_f32(), expected);
  EXPECT_EQ(w->layers[3].down_proj.name, "model.layers.3.mlp.down_proj.weight");
}

TEST(ModelWeights, LoadsShardedTinyQwen3) {
  auto config = load_model_config(testing::tiny_qwen3_dir());
  ASSERT_TRUE(config.has_value());
  auto w = load_model_weights(testing::tiny_qwen3_dir(), *config);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  ASSERT_EQ(w->layers.size(), 6u);
  EXPECT_EQ(w->embed_tokens.shape, (std::vector<int64_t>{8192, 512}));
  EXPECT_EQ(w->embed_tokens.dtype, DType::kBF16);
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
  size_t total = w->embed_tokens.numel() + w->final_norm.numel();
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.q_proj.shape, (std::vector<int64_t>{512, 512}));
    EXPECT_EQ(l.k_proj.shape, (std::vector<int64_t>{256, 512}));
    EXPECT_EQ(l.o_proj.shape, (std::vector<int64_t>{512, 512}));
    EXPECT_EQ(l.q_norm.shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(l.k_norm.shape, (std::vector<int64_t>{64}));
    EXPECT_EQ(l.down_proj.shape, (std::vector<int64_t>{512, 1408}));
    EXPECT_TRUE(l.q_bias.empty());
    for (const TensorView* t : {&l.input_norm, &l.q_proj, &l.k_proj, &l.v_proj, &l.q_norm, &l.k_norm, &l.o_proj,
                                &l.post_attn_norm, &l.gate_proj, &l.up_proj, &l.down_proj}) {
      total += t->numel();
    }
  }
  EXPECT_EQ(total, config->num_parameters());
  // Layer 5 lives in the second shard: its values must come from there.
  const std::string raw = raw_tensor_bytes(testing::tiny_qwen3_dir() / "model-00002-of-00002.safetensors",
                                           "model.layers.5.mlp.up_proj.weight");
  const std::vector<float> got = w->layers[5].up_proj.to_f32();
  ASSERT_EQ(got.size() * 2, raw.size());
  for (size_t i = 0; i < got.size(); i += 997) {
    uint16_t bits;
    std::memcpy(&bits, raw.data() + 2 * i, 2);
    EXPECT_EQ(got[i], bf16_to_f32(bits));
  }
}

TEST(ModelWeights, UntiedUsesLmHead) {
  TempDir dir;
  const ModelConfig c = testing::write_model_folder(dir.path(), testing::small_llama_config_json());
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_NE(w->lm_head.data, w->embed_tokens.data);
  EXPECT_EQ(w->lm_head.name, "lm_head.weight");
  EXPECT_EQ(w->lm_head.shape, (std::vector<int64_t>{40, 32}));
  // The values round-trip from the dummy generator through the file.
  const ModelWeights ref = make_dummy_weights(c, DType::kF32, 7);
  EXPECT_EQ(w->lm_head.to_f32(), ref.lm_head.to_f32());
  EXPECT_EQ(w->layers[1].v_proj.to_f32(), ref.layers[1].v_proj.to_f32());
}

TEST(ModelWeights, TiedIgnoresStrayLmHeadAndExtraTensors) {
  TempDir dir;
  const std::vector<float> junk(40 * 32, 9.0f);
  const std::vector<float> inv_freq(4, 1.0f);
  const ModelConfig c = testing::write_model_folder(
      dir.path(), testing::small_llama_config_json("LlamaForCausalLM", /*tie=*/true), {},
      {{"lm_head.weight", "F32", {40, 32}, junk.data(), junk.size() * 4},
       {"model.layers.0.self_attn.rotary_emb.inv_freq", "F32", {4}, inv_freq.data(), 16}});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_EQ(w->lm_head.data, w->embed_tokens.data);
}

TEST(ModelWeights, Qwen2LoadsBiases) {
  TempDir dir;
  const ModelConfig c = testing::write_model_folder(dir.path(), testing::small_llama_config_json("Qwen2ForCausalLM"));
  ASSERT_TRUE(c.qkv_bias);
  auto w = load_model_weights(dir.path(), c);
  ASSERT_TRUE(w.has_value()) << w.status().message();
  EXPECT_EQ(w->layers[0].q_bias.shape, (std::vector<int64_t>{32}));
  EXPECT_EQ(w->layers[0].k_bias.shape, (std::vector<int64_t>{16}));
  EXPECT_EQ(w->layers[1].v_bias.name, "model.layers.1.self_attn.v_proj.bias");

  // And a Qwen2 folder without the biases fails, naming the bias.
  TempDir dir2;
  testing::write_model_folder(dir2.path(), testing::small_llama_config_json("Qwen2ForCausalLM"),
                              {{"model.layers.1.self_attn.k_proj.bias", /*drop=*/true}});
  EXPECT_TRUE(message_has(load_model_weights(dir2.path(), c).status(), {"model.layers.1.self_attn.k_proj.bias"}));
}

TEST(ModelWeights, WrongShapeNamesTensorShapesAndFile) {
  TempDir dir;
  const ModelConfig c = testing::write_model_folder(dir.path(), testing::small_llama_config_json(),
                                                    {{"model.layers.1.self_attn.q_proj.weight", false, {32, 16}}});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.status().code(), ErrorCode::kInvalidFile);
  EXPECT_TRUE(message_has(w.status(), {"model.layers.1.self_attn.q_proj.weight", "[32, 16]", "[32, 32]",
                                       (dir.path() / "model.safetensors").string()}));
}

TEST(ModelWeights, MissingTensorNamesTensorAndFile) {
  TempDir dir;
  const ModelConfig c = testing::write_model_folder(dir.path(), testing::small_llama_config_json(),
                                                    {{"model.layers.0.mlp.up_proj.weight", /*drop=*/true}});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(message_has(w.status(), {"model.layers.0.mlp.up_proj.weight", "[48, 32]", "model.safetensors"}));

  TempDir dir2;
  testing::write_model_folder(dir2.path(), testing::small_llama_config_json(), {{"lm_head.weight", /*drop=*/true}});
  EXPECT_TRUE(message_has(load_model_weights(dir2.path(), c).status(), {"lm_head.weight", "tie_word_embeddings"}));
}

TEST(ModelWeights, UnsupportedDtypeNamesTensorAndDtype) {
  TempDir dir;
  const ModelConfig c = testing::write_model_folder(dir.path(), testing::small_llama_config_json(),
                                                    {{"model.norm.weight", false, {}, "I32"}});
  auto w = load_model_weights(dir.path(), c);
  ASSERT_FALSE(w.has_value());
  EXPECT_TRUE(message_has(w.status(), {"model.norm.weight", "I32", "model.safetensors"}));
}

TEST(ModelWeights, ShardedMissingShardAndTruncation) {
  TempDir dir;
  for (const char* name : {"config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors"}) {
    std::filesystem::copy_file(testing::tiny_qwen3_dir() / name, dir.path() / name);
  }
  auto config = load_model_config(dir.path());
  ASSERT_TRUE(config.has_value());
  auto w = load_model_weights(dir.path(), *config);
  EXPECT_TRUE(message_has(w.status(), {"model-00002-of-00002.safetensors"}));

  const std::string shard2 = testing::read_bytes(testing::tiny_qwen3_dir() / "model-00002-of-00002.safetensors");
  testing::write_text(dir.path() / "model-00002-of-00002.safetensors", shard2.substr(0, shard2.size() / 2));
  w = load_model_weights(dir.path(), *config);
  EXPECT_TRUE(message_has(w.status(), {"model-00002-of-00002.safetensors", "past the end"}));
}

TEST(ModelWeights, ConfigDisagreeingWithCheckpoint) {
  // stories260k's weights with a config claiming more heads: the q_proj shape check catches it.
  auto config = load_model_config(testing::stories_dir());
  ASSERT_TRUE(config.has_value());
  ModelConfig c = *config;
  c.head_dim = 16;
  auto w = load_model_weights(testing::stories_dir(), c);
  EXPECT_TRUE(message_has(w.status(), {"model.layers.0.self_attn.q_proj.weight", "[128, 64]", "[64, 64]"}));
  c = *config;
  c.num_layers = 6;
  EXPECT_TRUE(message_has(load_model_weights(testing::stories_dir(), c).status(), {"model.layers.5."}));
}

}  // namespace
}  // namespace origami
