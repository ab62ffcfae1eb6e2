#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "model/weight_layout.h"
#include "model/weights.h"
#include "model_test_util.h"

namespace origami {
namespace {

ModelConfig small_config(const std::string& arch, bool tie) {
  auto c = parse_model_config(testing::small_llama_config_json(arch, tie), "small.json");
  EXPECT_TRUE(c.has_value()) << c.status().message();
  return *c;
}

size_t num_bytes(const TensorView& v) { return static_cast<size_t>(v.numel()) * dtype_size(v.dtype); }

bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.shape == b.shape && a.dtype == b.dtype && std::memcmp(a.data, b.data, num_bytes(a)) == 0;
}

// Every tensor of the config, in the same order, for two weight sets.
std::vector<std::pair<const TensorView*, const TensorView*>> pairs(const ModelConfig& c, ModelWeights& a,
                                                                   ModelWeights& b) {
  std::vector<std::pair<const TensorView*, const TensorView*>> out;
  auto sa = weight_slots(c, &a);
  auto sb = weight_slots(c, &b);
  for (size_t i = 0; i < sa.size(); ++i) out.emplace_back(sa[i].view, sb[i].view);
  return out;
}

TEST(DummyWeights, ShapesMatchTheConfig) {
  for (const char* arch : {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    for (bool tie : {false, true}) {
      SCOPED_TRACE(std::string(arch) + (tie ? " tied" : " untied"));
      const ModelConfig c = small_config(arch, tie);
      ModelWeights w = make_dummy_weights(c, DType::kBF16, 1);
      ASSERT_EQ(w.layers.size(), 2u);
      EXPECT_FALSE(w.storage.empty());
      size_t total = 0;
      for (const WeightSlot& s : weight_slots(c, &w)) {
        EXPECT_EQ(s.view->shape, s.shape) << s.name;
        EXPECT_EQ(s.view->name, s.name);
        EXPECT_EQ(s.view->dtype, DType::kBF16);
        EXPECT_EQ(reinterpret_cast<uintptr_t>(s.view->data) % 64, 0u) << s.name;
        total += s.view->numel();
      }
      EXPECT_EQ(total, c.num_parameters());
      EXPECT_EQ(w.layers[0].q_bias.empty(), !c.qkv_bias);
      EXPECT_EQ(w.layers[0].q_norm.empty(), !c.qk_norm);
      EXPECT_EQ(w.lm_head.shape, (std::vector<int64_t>{40, 32}));
      EXPECT_EQ(w.lm_head.data == w.embed_tokens.data, tie);
    }
  }
}

TEST(DummyWeights, DeterministicInSeed) {
  const ModelConfig c = small_config("Qwen2ForCausalLM", false);
  ModelWeights a = make_dummy_weights(c, DType::kBF16, 42);
  ModelWeights b = make_dummy_weights(c, DType::kBF16, 42);
  ModelWeights d = make_dummy_weights(c, DType::kBF16, 43);
  for (auto [x, y] : pairs(c, a, b)) EXPECT_TRUE(same_bytes(*x, *y)) << x->name;
  for (auto [x, y] : pairs(c, a, d)) {
    const bool is_norm = x->name.find("norm") != std::string::npos;
    EXPECT_EQ(same_bytes(*x, *y), is_norm) << x->name;  // norms are 1 whatever the seed
  }
  // Different tensors of one set are not copies of each other.
  EXPECT_FALSE(std::memcmp(a.layers[0].q_proj.data, a.layers[1].q_proj.data, num_bytes(a.layers[0].q_proj)) == 0);
  EXPECT_FALSE(std::memcmp(a.layers[0].gate_proj.data, a.layers[0].up_proj.data, num_bytes(a.layers[0].up_proj)) == 0);
}

TEST(DummyWeights, IndependentOfThreadCount) {
  const ModelConfig c = small_config("Qwen3ForCausalLM", false);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  ModelWeights a = make_dummy_weights(c, DType::kF32, 5);
  omp_set_num_threads(3);
  ModelWeights b = make_dummy_weights(c, DType::kF32, 5);
  omp_set_num_threads(saved);
  for (auto [x, y] : pairs(c, a, b)) EXPECT_TRUE(same_bytes(*x, *y)) << x->name;
}

TEST(DummyWeights, DtypesAreRoundingsOfTheSameValues) {
  const ModelConfig c = small_config("Qwen2ForCausalLM", true);
  ModelWeights f32 = make_dummy_weights(c, DType::kF32, 9);
  ModelWeights bf16 = make_dummy_weights(c, DType::kBF16, 9);
  ModelWeights f16 = make_dummy_weights(c, DType::kF16, 9);
  auto sf = weight_slots(c, &f32);
  auto sb = weight_slots(c, &bf16);
  auto sh = weight_slots(c, &f16);
  for (size_t i = 0; i < sf.size(); ++i) {
    const std::vector<float> ref = sf[i].view->to_f32();
    const std::vector<float> vb = sb[i].view->to_f32();
    const std::vector<float> vh = sh[i].view->to_f32();
    for (size_t j = 0; j < ref.size(); ++j) {
      ASSERT_EQ(vb[j], bf16_to_f32(f32_to_bf16(ref[j]))) << sf[i].name << " " << j;
      ASSERT_EQ(vh[j], f16_to_f32(f32_to_f16(ref[j]))) << sf[i].name << " " << j;
    }
  }
}

TEST(DummyWeights, Statistics) {
  // A config big enough for tight statistics (~3M parameters), small enough to be quick.
  auto cfg = parse_model_config(R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 1000, "hidden_size": 256,
      "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2})",
                                "stats.json");
  ASSERT_TRUE(cfg.has_value()) << cfg.status().message();
  ModelWeights w = make_dummy_weights(*cfg, DType::kF32, 123);
  for (const WeightSlot& s : weight_slots(*cfg, &w)) {
    const std::vector<float> v = s.view->to_f32();
    if (s.kind == WeightKind::kNorm) {
      for (float x : v) ASSERT_EQ(x, 1.0f) << s.name;
      continue;
    }
    double sum = 0, sum_sq = 0, max_abs = 0;
    for (float x : v) {
      sum += x;
      sum_sq += static_cast<double>(x) * x;
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(x)));
    }
    const double n = static_cast<double>(v.size());
    const double mean = sum / n;
    const double stddev = std::sqrt(sum_sq / n - mean * mean);
    const double expected_std = s.kind == WeightKind::kBias ? 0.01 : 0.02;
    // Standard error of the std estimate is ~std / sqrt(2n); allow 6 of them plus a little.
    const double tol = expected_std * (6.0 / std::sqrt(2.0 * n) + 0.002);
    EXPECT_NEAR(stddev, expected_std, tol) << s.name;
    EXPECT_NEAR(mean, 0.0, 6.0 * expected_std / std::sqrt(n)) << s.name;
    EXPECT_LE(max_abs, expected_std * 3.47) << s.name;
    if (n > 10000) {
      EXPECT_GT(max_abs, expected_std * 2.5) << s.name;  // tails exist
    }
  }
  // Neighbouring elements are uncorrelated (a weak counter-based generator would show here).
  const std::vector<float> q = w.layers[0].gate_proj.to_f32();
  double cov = 0;
  for (size_t i = 1; i < q.size(); ++i) cov += static_cast<double>(q[i]) * q[i - 1];
  EXPECT_NEAR(cov / (q.size() - 1) / (0.02 * 0.02), 0.0, 0.02);
}

}  // namespace
}  // namespace origami
