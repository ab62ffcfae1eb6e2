// The CPU backend against a plain, dense, double-precision forward pass written from the model
// definitions, on random weights: covers what the golden models do not (Qwen2 q/k/v biases,
// Llama 3.1 RoPE scaling, untied lm_head, random q/k-norm weights), and logical positions that
// run ahead of the cache's entry slots.
#include <cmath>
#include <deque>
#include <random>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

// Random weights held by the test; norms are random around 1 so that their use is visible.
struct RandomModel {
  ModelConfig config;
  ModelWeights weights;
  std::deque<std::vector<float>> buffers;
  std::mt19937 rng{1234};

  TensorView tensor(const std::string& name, std::vector<int64_t> shape, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    buffers.emplace_back(n);
    for (float& x : buffers.back()) x = dist(rng);
    return {name, DType::kF32, std::move(shape), buffers.back().data()};
  }

  explicit RandomModel(const ModelConfig& c, bool tied) : config(c) {
    const int64_t h = c.hidden_size, q = c.q_size(), kv = c.kv_size(), i = c.intermediate_size;
    weights.embed_tokens = tensor("embed", {c.vocab_size, h}, 0.0f, 1.0f);
    weights.final_norm = tensor("final_norm", {h}, 1.0f, 0.2f);
    weights.lm_head = tied ? weights.embed_tokens : tensor("lm_head", {c.vocab_size, h}, 0.0f, 0.2f);
    for (int l = 0; l < c.num_layers; ++l) {
      LayerWeights lw;
      const float s = 0.15f;
      lw.input_norm = tensor("in_norm", {h}, 1.0f, 0.2f);
      lw.post_attn_norm = tensor("post_norm", {h}, 1.0f, 0.2f);
      lw.q_proj = tensor("q", {q, h}, 0.0f, s);
      lw.k_proj = tensor("k", {kv, h}, 0.0f, s);
      lw.v_proj = tensor("v", {kv, h}, 0.0f, s);
      if (c.qkv_bias) {
        lw.q_bias = tensor("qb", {q}, 0.0f, 0.5f);
        lw.k_bias = tensor("kb", {kv}, 0.0f, 0.5f);
        lw.v_bias = tensor("vb", {kv}, 0.0f, 0.5f);
      }
      if (c.qk_norm) {
        lw.q_norm = tensor("qn", {c.head_dim}, 1.0f, 0.3f);
        lw.k_norm = tensor("kn", {c.head_dim}, 1.0f, 0.3f);
      }
      lw.o_proj = tensor("o", {h, q}, 0.0f, s);
      lw.gate_proj = tensor("gate", {i, h}, 0.0f, s);
      lw.up_proj = tensor("up", {i, h}, 0.0f, s);
      lw.down_proj = tensor("down", {h, i}, 0.0f, s);
      weights.layers.push_back(lw);
    }
  }
};

using Mat = std::vector<std::vector<double>>;  // [rows][cols]

Mat linear(const Mat& x, const TensorView& w, const TensorView& b) {
  const float* wd = static_cast<const float*>(w.data);
  const int64_t out = w.shape[0], in = w.shape[1];
  Mat y(x.size(), std::vector<double>(out));
  for (size_t t = 0; t < x.size(); ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : static_cast<const float*>(b.data)[o];
      for (int64_t k = 0; k < in; ++k) s += x[t][k] * wd[o * in + k];
      y[t][o] = s;
    }
  return y;
}

void rms_norm(std::vector<double>* x, size_t begin, size_t n, const TensorView& w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += (*x)[begin + i] * (*x)[begin + i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (size_t i = 0; i < n; ++i) (*x)[begin + i] *= inv * static_cast<const float*>(w.data)[i];
}

// Rotary frequencies straight from the definitions, in double.
std::vector<double> inv_freq(const RopeConfig& r, int d) {
  std::vector<double> f(d / 2);
  for (int i = 0; i < d / 2; ++i) {
    f[i] = std::pow(static_cast<double>(r.theta), -2.0 * i / d);
    if (r.type != "llama3") continue;
    const double wavelen = 2 * M_PI / f[i];
    const double lo = r.original_max_position_embeddings / r.low_freq_factor;
    const double hi = r.original_max_position_embeddings / r.high_freq_factor;
    if (wavelen > lo) {
      f[i] /= r.factor;
    } else if (wavelen >= hi) {
      const double smooth = (r.original_max_position_embeddings / wavelen - r.low_freq_factor) /
                            (r.high_freq_factor - r.low_freq_factor);
      f[i] = (1 - smooth) * f[i] / r.factor + smooth * f[i];
    }
  }
  return f;
}

// Logits [T][vocab] of tokens at the given positions, attending causally over all of them.
Mat reference_forward(const RandomModel& m, const std::vector<int32_t>& ids, const std::vector<int>& positions) {
  const ModelConfig& c = m.config;
  const int T = static_cast<int>(ids.size()), d = c.head_dim, H = c.hidden_size;
  const auto freq = inv_freq(c.rope, d);
  Mat x(T, std::vector<double>(H));
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < H; ++i) x[t][i] = static_cast<const float*>(m.weights.embed_tokens.data)[ids[t] * H + i];
  auto rope = [&](std::vector<double>* v, int heads, int pos) {
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const double a = pos * freq[i], x1 = (*v)[h * d + i], x2 = (*v)[h * d + i + d / 2];
        (*v)[h * d + i] = x1 * std::cos(a) - x2 * std::sin(a);
        (*v)[h * d + i + d / 2] = x2 * std::cos(a) + x1 * std::sin(a);
      }
  };
  for (const LayerWeights& lw : m.weights.layers) {
    Mat h = x;
    for (auto& row : h) rms_norm(&row, 0, H, lw.input_norm, c.rms_norm_eps);
    Mat q = linear(h, lw.q_proj, lw.q_bias), k = linear(h, lw.k_proj, lw.k_bias), v = linear(h, lw.v_proj, lw.v_bias);
    for (int t = 0; t < T; ++t) {
      if (c.qk_norm) {
        for (int hh = 0; hh < c.num_heads; ++hh) rms_norm(&q[t], hh * d, d, lw.q_norm, c.rms_norm_eps);
        for (int hh = 0; hh < c.num_kv_heads; ++hh) rms_norm(&k[t], hh * d, d, lw.k_norm, c.rms_norm_eps);
      }
      rope(&q[t], c.num_heads, positions[t]);
      rope(&k[t], c.num_kv_heads, positions[t]);
    }
    Mat att(T, std::vector<double>(c.q_size(), 0.0));
    const int group = c.num_heads / c.num_kv_heads;
    for (int t = 0; t < T; ++t)
      for (int hh = 0; hh < c.num_heads; ++hh) {
        const int g = hh / group;
        std::vector<double> p(t + 1);
        double mx = -1e300, sum = 0;
        for (int j = 0; j <= t; ++j) {
          double s = 0;
          for (int i = 0; i < d; ++i) s += q[t][hh * d + i] * k[j][g * d + i];
          mx = std::max(mx, p[j] = s / std::sqrt(static_cast<double>(d)));
        }
        for (double& e : p) sum += (e = std::exp(e - mx));
        for (int j = 0; j <= t; ++j)
          for (int i = 0; i < d; ++i) att[t][hh * d + i] += p[j] / sum * v[j][g * d + i];
      }
    Mat o = linear(att, lw.o_proj, {});
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < H; ++i) x[t][i] += o[t][i];
    h = x;
    for (auto& row : h) rms_norm(&row, 0, H, lw.post_attn_norm, c.rms_norm_eps);
    Mat gate = linear(h, lw.gate_proj, {}), up = linear(h, lw.up_proj, {});
    for (int t = 0; t < T; ++t)
      for (size_t i = 0; i < gate[t].size(); ++i) gate[t][i] = gate[t][i] / (1 + std::exp(-gate[t][i])) * up[t][i];
    Mat down = linear(gate, lw.down_proj, {});
    for (int t = 0; t < T; ++t)
      for (int i = 0; i < H; ++i) x[t][i] += down[t][i];
  }
  for (auto& row : x) rms_norm(&row, 0, H, m.weights.final_norm, c.rms_norm_eps);
  return linear(x, m.weights.lm_head, {});
}

ModelConfig small_config(Architecture arch) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 97;
  c.hidden_size = 48;
  c.intermediate_size = 75;
  c.num_layers = 2;
  c.num_heads = 6;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-5f;
  c.qkv_bias = arch == Architecture::kQwen2;
  c.qk_norm = arch == Architecture::kQwen3;
  return c;
}

struct RefCase {
  const char* name;
  Architecture arch;
  bool llama3_rope;
  bool tied;
};

class CpuReference : public ::testing::TestWithParam<RefCase> {};

TEST_P(CpuReference, MatchesDenseDoubleForward) {
  const RefCase rc = GetParam();
  ModelConfig c = small_config(rc.arch);
  if (rc.llama3_rope) {
    // Small context numbers so that a 16-wide head spans all three frequency regimes.
    c.rope.type = "llama3";
    c.rope.factor = 8.0f;
    c.rope.low_freq_factor = 1.0f;
    c.rope.high_freq_factor = 4.0f;
    c.rope.original_max_position_embeddings = 256;
  }
  RandomModel model(c, rc.tied);
  BackendOptions options;
  CpuBackend backend(options);
  ASSERT_TRUE(backend.load(c, model.weights).is_ok());
  const int block_size = 4;
  ASSERT_TRUE(backend.allocate_kv_cache(KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, block_size, 64,
                                                       DType::kF32))
                  .is_ok());
  std::vector<int32_t> ids;
  std::mt19937 rng(7);
  for (int t = 0; t < 23; ++t) ids.push_back(static_cast<int32_t>(rng() % c.vocab_size));

  // Logical positions start at 1000 while entry slots start at 0 (as after compression): RoPE
  // must follow positions, the cache the slots. Two chunks: 15 tokens then 8.
  std::vector<int> positions(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) positions[t] = 1000 + static_cast<int>(t);
  const Mat ref = reference_forward(model, ids, positions);

  std::vector<BlockId> table = {5, 2, 9, 7, 1, 3};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<float> got;
  int cached = 0;
  for (int n : {15, 8}) {
    ForwardBatch batch;
    batch.token_ids.assign(ids.begin() + cached, ids.begin() + cached + n);
    batch.positions.assign(positions.begin() + cached, positions.begin() + cached + n);
    SequenceInput in;
    in.num_query_tokens = n;
    in.start_position = positions[cached];
    in.num_cached_entries = cached;
    in.block_table = &table;
    in.logits_mode = LogitsMode::kAll;
    in.sampling = &greedy;
    batch.sequences.push_back(in);
    StepOutput out;
    ASSERT_TRUE(backend.execute(batch, &out).is_ok());
    got.insert(got.end(), out.all_logits[0].begin(), out.all_logits[0].end());
    // The sampled token is the argmax of the last row.
    const double* last = ref[cached + n - 1].data();
    EXPECT_EQ(out.sampled_tokens[0], std::max_element(last, last + c.vocab_size) - last);
    cached += n;
  }
  // fp32 against double: rounding of sums and of the fp32 rotary angles at positions ~1000
  // (~6e-5 rad) is all that may differ; a formula error shows up at the scale of the logits.
  double worst = 0, scale = 1.0;
  for (size_t t = 0; t < ids.size(); ++t)
    for (int v = 0; v < c.vocab_size; ++v) {
      worst = std::max(worst, std::fabs(got[t * c.vocab_size + v] - ref[t][v]));
      scale = std::max(scale, std::fabs(ref[t][v]));
    }
  EXPECT_LT(worst, 1e-4 * scale) << rc.name;
  std::printf("[ info ] %s: max |logit - double reference| = %.3g (logit scale %.3g)\n", rc.name, worst, scale);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CpuReference,
                         ::testing::Values(RefCase{"llama_default_rope", Architecture::kLlama, false, true},
                                           RefCase{"llama3_rope_untied", Architecture::kLlama, true, false},
                                           RefCase{"qwen2_bias", Architecture::kQwen2, false, true},
                                           RefCase{"qwen3_qk_norm", Architecture::kQwen3, false, false}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace origami::test
