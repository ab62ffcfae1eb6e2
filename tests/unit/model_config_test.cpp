#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model_test_util.h"

namespace origami {
namespace {

using testing::message_has;
using testing::TempDir;
using testing::write_text;

std::filesystem::path config_dir(const std::string& name) { return testing::shared_dir() / "configs" / name; }

ModelConfig must_load(const std::filesystem::path& dir) {
  auto c = load_model_config(dir);
  EXPECT_TRUE(c.has_value()) << c.status().message();
  return c.has_value() ? *c : ModelConfig{};
}

Status parse_error(const std::string& text, const std::string& source = "cfg.json") {
  auto c = parse_model_config(text, source);
  return c.has_value() ? Status::ok() : c.status();
}

TEST(ModelConfig, Stories260k) {
  const ModelConfig c = must_load(testing::stories_dir());
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope.theta, 10000.0f);
  EXPECT_EQ(c.rope.type, "default");
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.dtype, DType::kF32);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(c.q_size(), 64);
  EXPECT_EQ(c.kv_size(), 32);
}

TEST(ModelConfig, TinyQwen3) {
  const ModelConfig c = must_load(testing::tiny_qwen3_dir());
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_EQ(c.vocab_size, 8192);
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.intermediate_size, 1408);
  EXPECT_EQ(c.num_layers, 6);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope.theta, 100000.0f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.bos_token_id, 0);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{0});
}

TEST(ModelConfig, NumParametersMatchesCheckpointIndex) {
  // The index's metadata was written by the trainer from the real tensors (tied: lm_head not counted).
  std::ifstream in(testing::tiny_qwen3_dir() / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  const ModelConfig c = must_load(testing::tiny_qwen3_dir());
  EXPECT_EQ(c.num_parameters(), index["metadata"]["total_parameters"].get<size_t>());
}

TEST(ModelConfig, NumParametersOfRealShapes) {
  // Published parameter counts: Llama-3.1-8B 8.03B, Qwen3-8B 8.19B, Qwen3-0.6B 0.596B (tied).
  EXPECT_EQ(must_load(config_dir("llama-3.1-8b")).num_parameters(), 8030261248u);
  EXPECT_EQ(must_load(config_dir("qwen3-8b")).num_parameters(), 8190735360u);
  EXPECT_EQ(must_load(config_dir("qwen3-0.6b")).num_parameters(), 596049920u);
}

TEST(ModelConfig, Llama31WithLlama3RopeScaling) {
  const ModelConfig c = must_load(config_dir("llama-3.1-8b"));
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // not in the file: hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c.rope.theta, 500000.0f);
  EXPECT_EQ(c.rope.type, "llama3");
  EXPECT_FLOAT_EQ(c.rope.factor, 8.0f);
  EXPECT_FLOAT_EQ(c.rope.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c.rope.high_freq_factor, 4.0f);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, DType::kBF16);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{128001});
}

TEST(ModelConfig, Qwen3Shapes) {
  struct Expect {
    const char* name;
    int hidden, inter, layers, heads, kv_heads;
    bool tie;
  };
  for (const Expect& e : {Expect{"qwen3-0.6b", 1024, 3072, 28, 16, 8, true}, Expect{"qwen3-4b", 2560, 9728, 36, 32, 8, true},
                          Expect{"qwen3-8b", 4096, 12288, 36, 32, 8, false},
                          Expect{"qwen3-32b", 5120, 25600, 64, 64, 8, false}}) {
    SCOPED_TRACE(e.name);
    const ModelConfig c = must_load(config_dir(e.name));
    EXPECT_EQ(c.arch, Architecture::kQwen3);
    EXPECT_EQ(c.vocab_size, 151936);
    EXPECT_EQ(c.hidden_size, e.hidden);
    EXPECT_EQ(c.intermediate_size, e.inter);
    EXPECT_EQ(c.num_layers, e.layers);
    EXPECT_EQ(c.num_heads, e.heads);
    EXPECT_EQ(c.num_kv_heads, e.kv_heads);
    EXPECT_EQ(c.head_dim, 128);  // explicit; differs from hidden / heads for 0.6b/4b/32b
    EXPECT_EQ(c.max_position_embeddings, 40960);
    EXPECT_FLOAT_EQ(c.rope.theta, 1000000.0f);
    EXPECT_EQ(c.rope.type, "default");  // rope_scaling: null
    EXPECT_EQ(c.tie_word_embeddings, e.tie);
    EXPECT_TRUE(c.qk_norm);
    EXPECT_EQ(c.eos_token_ids, std::vector<int>{151645});
  }
}

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.num_heads, b.num_heads);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.type, b.rope.type);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.low_freq_factor, b.rope.low_freq_factor);
  EXPECT_EQ(a.rope.high_freq_factor, b.rope.high_freq_factor);
  EXPECT_EQ(a.rope.original_max_position_embeddings, b.rope.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
}

TEST(ModelConfig, Transformers4And5SpellingsAgree) {
  // The Llama 3.1 config as transformers 5 writes it: rope_parameters holds theta and scaling.
  std::ifstream in(config_dir("llama-3.1-8b") / "config.json");
  nlohmann::json v4 = nlohmann::json::parse(in);
  nlohmann::json v5 = v4;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5.erase("torch_dtype");
  v5["rope_parameters"] = {{"rope_theta", 500000.0},  {"rope_type", "llama3"},
                           {"factor", 8.0},          {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  v5["dtype"] = "bfloat16";
  auto a = parse_model_config(v4.dump(), "v4.json");
  auto b = parse_model_config(v5.dump(), "v5.json");
  ASSERT_TRUE(a.has_value()) << a.status().message();
  ASSERT_TRUE(b.has_value()) << b.status().message();
  expect_same(*a, *b);
  EXPECT_EQ(b->rope.type, "llama3");

  // The older "type" key in rope_scaling means the same as "rope_type".
  nlohmann::json old = v4;
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  auto c = parse_model_config(old.dump(), "old.json");
  ASSERT_TRUE(c.has_value()) << c.status().message();
  expect_same(*a, *c);

  // And the tiny Qwen3 (written by transformers 5) rewritten in transformers-4 spelling.
  std::ifstream tin(testing::tiny_qwen3_dir() / "config.json");
  nlohmann::json t5 = nlohmann::json::parse(tin);
  nlohmann::json t4 = t5;
  t4.erase("rope_parameters");
  t4.erase("dtype");
  t4["rope_theta"] = 100000.0;
  t4["rope_scaling"] = nullptr;
  t4["torch_dtype"] = "bfloat16";
  auto d = parse_model_config(t5.dump(), "t5.json");
  auto e = parse_model_config(t4.dump(), "t4.json");
  ASSERT_TRUE(d.has_value()) << d.status().message();
  ASSERT_TRUE(e.has_value()) << e.status().message();
  expect_same(*d, *e);
}

TEST(ModelConfig, DefaultsAndQwen2Bias) {
  // No head_dim, no num_key_value_heads, eos as a list, model_type only.
  auto c = parse_model_config(R"({"model_type": "qwen2", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
      "eos_token_id": [5, 7, 5], "attention_bias": false})",
                              "cfg.json");
  ASSERT_TRUE(c.has_value()) << c.status().message();
  EXPECT_EQ(c->arch, Architecture::kQwen2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_TRUE(c->qkv_bias);  // always for Qwen2
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int>{5, 7}));
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_STREQ(architecture_name(c->arch), "qwen2");
  EXPECT_STREQ(architecture_name(Architecture::kLlama), "llama");
  EXPECT_STREQ(architecture_name(Architecture::kQwen3), "qwen3");
}

TEST(ModelConfig, GenerationConfigEosIdsAreMerged) {
  TempDir dir;
  write_text(dir.path() / "config.json", testing::small_llama_config_json());
  write_text(dir.path() / "generation_config.json", R"({"bos_token_id": 1, "eos_token_id": [3, 2, 4]})");
  const ModelConfig c = must_load(dir.path());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{2, 3, 4}));

  write_text(dir.path() / "generation_config.json", "{not json");
  auto bad = load_model_config(dir.path());
  EXPECT_TRUE(message_has(bad.status(), {"generation_config.json", "JSON"}));
}

TEST(ModelConfig, MissingFile) {
  TempDir dir;
  auto c = load_model_config(dir.path() / "nope");
  ASSERT_FALSE(c.has_value());
  EXPECT_EQ(c.status().code(), ErrorCode::kNotFound);
  EXPECT_TRUE(message_has(c.status(), {"nope", "config.json"}));
}

TEST(ModelConfig, UnknownArchitectureNamesItAndTheFile) {
  EXPECT_TRUE(message_has(parse_error(testing::small_llama_config_json("MistralForCausalLM"), "/m/config.json"),
                          {"MistralForCausalLM", "/m/config.json"}));
  EXPECT_TRUE(message_has(parse_error(R"({"model_type": "gpt2", "vocab_size": 10})", "/m/config.json"),
                          {"gpt2", "/m/config.json"}));
  EXPECT_TRUE(message_has(parse_error(R"({"vocab_size": 10})", "/m/config.json"), {"architectures", "/m/config.json"}));
}

TEST(ModelConfig, InvalidValuesNameTheField) {
  nlohmann::json base = nlohmann::json::parse(testing::small_llama_config_json());
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = base;
    if (value.is_discarded()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return parse_error(j.dump(), "/m/config.json");
  };
  ASSERT_TRUE(with("hidden_size", 32).is_ok());
  EXPECT_TRUE(message_has(with("hidden_size", -32), {"/m/config.json", "hidden_size", "positive"}));
  EXPECT_TRUE(message_has(with("num_key_value_heads", 3), {"/m/config.json", "num_attention_heads", "divisible"}));
  EXPECT_TRUE(message_has(with("vocab_size", 0), {"vocab_size"}));
  EXPECT_TRUE(message_has(with("num_hidden_layers", "two"), {"num_hidden_layers", "integer"}));
  EXPECT_TRUE(message_has(with("intermediate_size", nlohmann::json(nlohmann::json::value_t::discarded)),
                          {"intermediate_size", "missing"}));
  EXPECT_TRUE(message_has(with("rms_norm_eps", -1.0), {"rms_norm_eps"}));
  EXPECT_TRUE(message_has(with("dtype", "int8"), {"dtype", "int8"}));
  EXPECT_TRUE(message_has(with("eos_token_id", 400), {"eos_token_id", "vocab_size"}));
  EXPECT_TRUE(message_has(with("hidden_act", "gelu"), {"hidden_act"}));
  EXPECT_TRUE(message_has(with("head_dim", 7), {"head_dim", "even"}));
  EXPECT_TRUE(message_has(with("rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}),
                          {"rope_parameters.rope_type", "yarn"}));
  EXPECT_TRUE(message_has(with("rope_parameters", {{"rope_type", "llama3"}}), {"rope_parameters.factor", "missing"}));
  EXPECT_TRUE(message_has(with("attention_bias", true), {"attention_bias"}));
  // hidden_size not divisible by heads and no head_dim to say otherwise.
  nlohmann::json j = base;
  j["hidden_size"] = 30;
  EXPECT_TRUE(message_has(parse_error(j.dump()), {"hidden_size", "divisible"}));
  EXPECT_TRUE(message_has(parse_error("{\"vocab_size\": "), {"cfg.json", "JSON"}));
}

}  // namespace
}  // namespace origami
