// The sink-attention gate: its forward against the paper's formula written out directly, its
// hand-written backward against central finite differences, training against a teacher gate,
// and the weight file's round trip and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "gates/gate_trainer.h"
#include "gates/gate_weights.h"
#include "gates/sink_attention_gate.h"
#include "model/safetensors_writer.h"

namespace origami::gates {
namespace {

GateShape small_shape() {
  GateShape s;
  s.num_layers = 2;
  s.num_kv_heads = 2;
  s.group_size = 3;
  s.hidden_size = 10;
  s.rank = 4;
  s.num_sinks = 3;
  return s;
}

// Every parameter random (sinks and biases too, so that every term of the formula matters).
GateWeights random_gates(const GateShape& shape, uint64_t seed) {
  GateWeights w = init_gates(shape, seed);
  std::mt19937_64 rng(seed + 1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (GateLayer& l : w.layers) {
    for (float& x : l.q_norm) x = 1.0f + 0.5f * u(rng);
    for (float& x : l.k_norm) x = 1.0f + 0.5f * u(rng);
    for (float& x : l.sink_keys) x = u(rng);
    for (float& x : l.bias) x = 0.5f * (u(rng) + 1.0f);
    for (float& x : l.q_weight) x *= 3.0f;
    for (float& x : l.k_weight) x *= 3.0f;
  }
  return w;
}

std::vector<float> random_rows(int rows, int d, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows) * d);
  for (float& x : v) x = n(rng);
  return v;
}

// The formula of Fast KVzip §3.4 computed naively for one token and KV head.
double formula_score(const GateShape& g, const GateLayer& w, const float* h, int head) {
  const int R = g.rank, D = g.hidden_size;
  auto project_norm = [&](const std::vector<float>& W, const std::vector<float>* b, int row0,
                          const std::vector<float>& norm) {
    std::vector<double> x(R);
    double ss = 0.0;
    for (int i = 0; i < R; ++i) {
      double acc = b ? (*b)[row0 + i] : 0.0;
      for (int k = 0; k < D; ++k) acc += static_cast<double>(W[static_cast<size_t>(row0 + i) * D + k]) * h[k];
      x[i] = acc;
      ss += acc * acc;
    }
    const double rms = std::sqrt(ss / R + 1e-6);
    for (int i = 0; i < R; ++i) x[i] = x[i] / rms * norm[i];
    return x;
  };
  const std::vector<double> k = project_norm(w.k_weight, nullptr, head * R, w.k_norm);
  double sum = 0.0;
  for (int j = 0; j < g.group_size; ++j) {
    const int hj = head * g.group_size + j;
    const std::vector<double> q = project_norm(w.q_weight, &w.q_bias, hj * R, w.q_norm);
    double qk = 0.0;
    for (int i = 0; i < R; ++i) qk += q[i] * k[i];
    const double num = std::exp(qk / std::sqrt(R));
    double den = num + w.bias[hj];
    for (int r = 0; r < g.num_sinks; ++r) {
      double qs = 0.0;
      for (int i = 0; i < R; ++i) qs += q[i] * w.sink_keys[(static_cast<size_t>(head) * g.num_sinks + r) * R + i];
      den += std::exp(qs / std::sqrt(R));
    }
    sum += num / den;
  }
  return sum / g.group_size;
}

TEST(SinkAttentionGate, ScoresMatchThePapersFormula) {
  const GateShape g = small_shape();
  const GateWeights w = random_gates(g, 7);
  const int rows = 5;
  const std::vector<float> h = random_rows(rows, g.hidden_size, 3);
  std::vector<float> scores(static_cast<size_t>(rows) * g.num_kv_heads);
  gate_scores(g, w.layers[1], h.data(), rows, g.hidden_size, scores.data());
  for (int t = 0; t < rows; ++t)
    for (int hd = 0; hd < g.num_kv_heads; ++hd) {
      const float s = scores[static_cast<size_t>(t) * g.num_kv_heads + hd];
      EXPECT_NEAR(s, formula_score(g, w.layers[1], &h[static_cast<size_t>(t) * g.hidden_size], hd), 1e-6);
      EXPECT_GT(s, 0.0f);
      EXPECT_LT(s, 1.0f);
    }
}

TEST(SinkAttentionGate, InitialScoreIsOneOverOnePlusSinks) {
  const GateShape g = small_shape();
  const GateWeights w = init_gates(g, 1);
  const std::vector<float> h = random_rows(3, g.hidden_size, 4);
  std::vector<float> scores(3 * g.num_kv_heads);
  gate_scores(g, w.layers[0], h.data(), 3, g.hidden_size, scores.data());
  // Zero sink keys give every sink logit 0; the self logit varies, so only bound it loosely.
  for (float s : scores) {
    EXPECT_GT(s, 0.0f);
    EXPECT_LT(s, 1.0f);
  }
  GateWeights flat = init_gates(g, 1);
  for (float& x : flat.layers[0].k_weight) x = 0.0f;  // k = 0: self logit 0 too
  gate_scores(g, flat.layers[0], h.data(), 3, g.hidden_size, scores.data());
  for (float s : scores) EXPECT_NEAR(s, 1.0 / (1 + g.num_sinks), 1e-6);
}

TEST(SinkAttentionGate, BackwardMatchesFiniteDifferences) {
  const GateShape g = small_shape();
  GateWeights w = random_gates(g, 11);
  const int rows = 4;
  const std::vector<float> h = random_rows(rows, g.hidden_size, 5);
  std::vector<float> y(static_cast<size_t>(rows) * g.num_kv_heads);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& x : y) x = u(rng);
  GateLayer& layer = w.layers[0];
  GateLayer grad = zero_gate_layer(g);
  gate_bce_loss(g, layer, h.data(), g.hidden_size, y.data(), rows, &grad);
  auto params = layer.tensors();
  auto grads = grad.tensors();
  int checked = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    std::vector<float>& p = *params[k].second;
    for (size_t i = 0; i < p.size(); i += std::max<size_t>(1, p.size() / 7)) {
      const float saved = p[i];
      const float eps = 1e-2f;
      p[i] = saved + eps;
      const double up = gate_bce_loss(g, layer, h.data(), g.hidden_size, y.data(), rows, nullptr);
      p[i] = saved - eps;
      const double down = gate_bce_loss(g, layer, h.data(), g.hidden_size, y.data(), rows, nullptr);
      p[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      const double analytic = (*grads[k].second)[i];
      EXPECT_NEAR(analytic, numeric, 2e-4 + 2e-3 * std::abs(numeric)) << params[k].first << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(SinkAttentionGate, TrainingFitsATeacherGate) {
  // Targets from a random teacher of the same shape: SGD must bring the loss close to the
  // teacher's own (the targets' entropy), far below the starting loss.
  GateShape g = small_shape();
  g.num_layers = 1;
  g.hidden_size = 16;
  const GateWeights teacher = random_gates(g, 21);
  const int n = 2048;
  const std::vector<float> h = random_rows(n, g.hidden_size, 22);
  std::vector<float> y(static_cast<size_t>(n) * g.num_kv_heads);
  gate_scores(g, teacher.layers[0], h.data(), n, g.hidden_size, y.data());
  GateTrainingSet set;
  set.shape = g;
  set.append({h}, {y}, n);
  GateWeights student = init_gates(g, 5);
  const double start = gate_layer_loss(set, student.layers[0], 0);
  const double floor = gate_layer_loss(set, teacher.layers[0], 0);
  GateTrainOptions options;
  options.batch_size = 64;
  options.epochs = 30;
  const GateTrainReport report = train_gates(set, options, &student);
  const double end = gate_layer_loss(set, student.layers[0], 0);
  EXPECT_EQ(report.steps_per_layer, 30 * 32);
  EXPECT_LT(end - floor, 0.25 * (start - floor)) << "start " << start << " end " << end << " floor " << floor;
  for (float b : student.layers[0].bias) EXPECT_GE(b, 0.0f);
}

TEST(GateWeights, SaveLoadRoundTripAndShapeErrors) {
  ModelConfig config;
  config.num_layers = 2;
  config.num_heads = 6;
  config.num_kv_heads = 2;
  config.hidden_size = 10;
  const GateShape g = gate_shape_for(config, 4, 3);
  GateWeights w = random_gates(g, 3);
  w.metadata["command"] = "test";
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "origami_gates_test.safetensors";
  ASSERT_TRUE(save_gates(path, w).is_ok());
  Expected<GateWeights> back = load_gates(path, config);
  ASSERT_TRUE(back.has_value()) << back.status().message();
  EXPECT_EQ(back->shape, g);
  EXPECT_EQ(back->metadata.at("command"), "test");
  for (int l = 0; l < 2; ++l) {
    auto a = w.layers[l].tensors();
    auto b = back->layers[l].tensors();
    for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(*a[k].second, *b[k].second) << a[k].first;
  }
  ModelConfig other = config;
  other.hidden_size = 12;
  Expected<GateWeights> bad = load_gates(path, other);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("layers.0.q_proj.weight"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("[24, 12]"), std::string::npos) << bad.status().message();
  other = config;
  other.num_layers = 3;
  bad = load_gates(path, other);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("layers.2."), std::string::npos) << bad.status().message();
  other.num_layers = 1;
  bad = load_gates(path, other);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("more layers"), std::string::npos) << bad.status().message();
  // A negative bias is refused.
  w.layers[1].bias[0] = -1.0f;
  ASSERT_TRUE(save_gates(path, w).is_ok());
  bad = load_gates(path, config);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.status().message().find("layers.1.bias"), std::string::npos) << bad.status().message();
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace origami::gates

namespace origami::gates {
namespace {

// A tensor-parallel rank scores its KV heads with slice_gates(): every head's score from the
// slice equals that head's score from the whole gates, bit for bit, for every split of 4 heads.
TEST(GateWeights, SlicedGatesScoreTheirHeadsAsTheWholeGates) {
  GateShape shape = small_shape();
  shape.num_kv_heads = 4;
  const GateWeights whole = random_gates(shape, 21);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  const int rows = 7;
  std::vector<float> hidden(static_cast<size_t>(rows) * shape.hidden_size);
  for (float& x : hidden) x = n(rng);
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    std::vector<float> all(static_cast<size_t>(rows) * shape.num_kv_heads);
    gate_scores(whole.shape, whole.layers[layer], hidden.data(), rows, shape.hidden_size, all.data());
    for (const auto& [first, count] : std::vector<std::pair<int, int>>{{0, 2}, {2, 2}, {1, 3}, {3, 1}, {0, 4}}) {
      const GateWeights part = slice_gates(whole, first, count);
      ASSERT_EQ(part.shape.num_kv_heads, count);
      ASSERT_EQ(part.layers.size(), whole.layers.size());
      std::vector<float> got(static_cast<size_t>(rows) * count);
      gate_scores(part.shape, part.layers[layer], hidden.data(), rows, shape.hidden_size, got.data());
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < count; ++h)
          EXPECT_EQ(got[r * count + h], all[r * shape.num_kv_heads + first + h])
              << "layer " << layer << " heads " << first << "+" << count << " row " << r << " head " << h;
    }
  }
}

}  // namespace
}  // namespace origami::gates
