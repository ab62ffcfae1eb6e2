// Query capture during execute() on the fixture model (origami-tiny-qwen3): a capturing sequence
// writes its post-q-norm, post-RoPE queries of every layer into its slot at row
// entry_index % max_window. Layer 0 is checked against a naive recomputation from the weights
// (embedding -> RMSNorm -> q_proj -> q_norm -> RoPE at the token's logical position, which differs
// from its entry index once a cache is compressed); every layer is checked to be bit-identical
// however the prompt is chunked, and rows before query_capture_from stay untouched.
#include <cmath>

#include "backend_cpu_test_util.h"

namespace origami::test {
namespace {

constexpr char kModel[] = "origami-tiny-qwen3";
constexpr int kWindow = 16;

std::vector<int32_t> prompt_tokens(int count, int salt) {
  std::vector<int32_t> t(count);
  for (int i = 0; i < count; ++i) t[i] = (i * 37 + salt * 101 + 11) % 8192;
  return t;
}

// One step of one sequence, capturing into `slot` from entry `capture_from`.
Status run_chunk(Backend& backend, std::vector<BlockId>* table, int block_size, int* next_page, int num_cached,
                 int start_position, const std::vector<int32_t>& tokens, int slot, int capture_from) {
  while (static_cast<int>(table->size()) * block_size < num_cached + static_cast<int>(tokens.size()))
    table->push_back((*next_page)++);
  SamplingParams sampling;
  sampling.temperature = 0.0f;
  ForwardBatch batch;
  batch.token_ids = tokens;
  SequenceInput in;
  in.num_query_tokens = static_cast<int>(tokens.size());
  in.start_position = start_position;
  in.num_cached_entries = num_cached;
  in.block_table = table;
  in.sampling = &sampling;
  in.query_slot = slot;
  in.query_capture_from = capture_from;
  for (size_t i = 0; i < tokens.size(); ++i) batch.positions.push_back(start_position + static_cast<int>(i));
  batch.sequences.push_back(in);
  StepOutput out;
  return backend.execute(batch, &out);
}

// Layer 0's query of `token` at logical `position`, [num_heads * head_dim], in double.
std::vector<double> layer0_query(const ModelConfig& c, const ModelWeights& w, int token, int position) {
  const int hidden = c.hidden_size, d = c.head_dim, half = d / 2;
  const std::vector<float> embed = w.embed_tokens.to_f32();
  const std::vector<float> norm = w.layers[0].input_norm.to_f32();
  const std::vector<float> wq = w.layers[0].q_proj.to_f32();
  const std::vector<float> qn = w.layers[0].q_norm.to_f32();
  std::vector<double> h(hidden);
  double ss = 0;
  for (int i = 0; i < hidden; ++i) ss += static_cast<double>(embed[static_cast<size_t>(token) * hidden + i]) *
                                         embed[static_cast<size_t>(token) * hidden + i];
  const double inv = 1.0 / std::sqrt(ss / hidden + c.rms_norm_eps);
  for (int i = 0; i < hidden; ++i) h[i] = embed[static_cast<size_t>(token) * hidden + i] * inv * norm[i];
  std::vector<double> q(c.q_size());
  for (int o = 0; o < c.q_size(); ++o) {
    double s = 0;
    for (int i = 0; i < hidden; ++i) s += wq[static_cast<size_t>(o) * hidden + i] * h[i];
    q[o] = s;
  }
  for (int head = 0; head < c.num_heads; ++head) {
    double* x = &q[static_cast<size_t>(head) * d];
    double hs = 0;
    for (int i = 0; i < d; ++i) hs += x[i] * x[i];
    const double hinv = 1.0 / std::sqrt(hs / d + c.rms_norm_eps);
    for (int i = 0; i < d; ++i) x[i] = x[i] * hinv * qn[i];
    for (int i = 0; i < half; ++i) {  // rotate_half: pair (i, i + half) turns by position * theta^(-2i/d)
      const double angle = position * std::pow(static_cast<double>(c.rope.theta), -2.0 * i / d);
      const double a = x[i], b = x[i + half];
      x[i] = a * std::cos(angle) - b * std::sin(angle);
      x[i + half] = b * std::cos(angle) + a * std::sin(angle);
    }
  }
  return q;
}

TEST(CpuQueryCapture, Layer0QueriesMatchANaiveRecomputationAtLogicalPositions) {
  const int bs = 16;
  auto config = load_model_config(model_dir(kModel));
  ASSERT_TRUE(config.has_value());
  auto weights = load_model_weights(model_dir(kModel), *config);
  ASSERT_TRUE(weights.has_value());
  ASSERT_EQ(config->rope.type, "default");
  auto backend = make_cpu_backend(kModel, bs, 8, 2);
  ASSERT_TRUE(backend);
  CompressionConfig cc;
  cc.num_query_slots = 2;
  cc.max_window = kWindow;
  ASSERT_TRUE(backend->configure_compression(cc).is_ok());
  std::vector<BlockId> table;
  int next_page = 1;
  const auto prompt = prompt_tokens(20, 1);
  ASSERT_TRUE(run_chunk(*backend, &table, bs, &next_page, 0, 0, prompt, 1, 0).is_ok());
  // A decode whose logical position (50) runs ahead of its entry index (20), as after compression.
  const int decode_token = 4321;
  ASSERT_TRUE(run_chunk(*backend, &table, bs, &next_page, 20, 50, {decode_token}, 1, 0).is_ok());

  // Rows are keyed by logical position (row = position % max_window, which compaction never
  // changes) and hold the newest position of their residue: the decode (position 50) took row 2
  // from prompt position 18; positions 4..19 otherwise.
  auto check = [&](int token, int position) {
    const auto want = layer0_query(*config, *weights, token, position);
    const float* got = backend->kv_cache().query_row(0, 1, position % kWindow);
    for (int i = 0; i < config->q_size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-4 * std::max(1.0, std::abs(want[i]))) << "position " << position << " element " << i;
  };
  ASSERT_EQ(50 % kWindow, 18 % kWindow);
  for (int p = 20 - kWindow; p < 20; ++p)
    if (p != 18) check(prompt[p], p);
  check(decode_token, 50);
}

TEST(CpuQueryCapture, EveryLayerIsChunkingInvariantAndRespectsCaptureFrom) {
  const int bs = 16, n = 40, capture_from = 30;
  auto backend = make_cpu_backend(kModel, bs, 16, 2);
  ASSERT_TRUE(backend);
  const ModelConfig& c = backend->config();
  CompressionConfig cc;
  cc.num_query_slots = 2;
  cc.max_window = kWindow;
  ASSERT_TRUE(backend->configure_compression(cc).is_ok());
  cpu::CpuKVCache& kv = backend->kv_cache();
  const size_t row_floats = static_cast<size_t>(c.q_size());
  constexpr float kSentinel = 12345.0f;
  for (int l = 0; l < c.num_layers; ++l)
    for (int r = 0; r < kWindow; ++r) std::fill_n(kv.query_row(l, 1, r), row_floats, kSentinel);

  const auto prompt = prompt_tokens(n, 2);
  int next_page = 1;
  // Sequence A: one prefill, capturing everything into slot 0.
  std::vector<BlockId> table_a;
  ASSERT_TRUE(run_chunk(*backend, &table_a, bs, &next_page, 0, 0, prompt, 0, 0).is_ok());
  // Sequence B: the same prompt in chunks of 7, capturing from entry 30 into slot 1.
  std::vector<BlockId> table_b;
  for (int start = 0; start < n; start += 7) {
    std::vector<int32_t> chunk(prompt.begin() + start, prompt.begin() + std::min(n, start + 7));
    ASSERT_TRUE(run_chunk(*backend, &table_b, bs, &next_page, start, start, chunk, 1, capture_from).is_ok());
  }
  for (int l = 0; l < c.num_layers; ++l) {
    for (int e = n - kWindow; e < n; ++e) {
      const float* a = kv.query_row(l, 0, e % kWindow);
      const float* b = kv.query_row(l, 1, e % kWindow);
      bool nonzero = false;
      for (size_t i = 0; i < row_floats; ++i) nonzero |= a[i] != 0.0f;
      ASSERT_TRUE(nonzero) << "layer " << l << " entry " << e << " was not captured";
      if (e >= capture_from) {
        ASSERT_EQ(std::vector<float>(a, a + row_floats), std::vector<float>(b, b + row_floats))
            << "layer " << l << " entry " << e;
      } else {
        for (size_t i = 0; i < row_floats; ++i)
          ASSERT_EQ(b[i], kSentinel) << "layer " << l << " entry " << e << " captured before query_capture_from";
      }
    }
    // Layers differ (each layer's own queries, not one layer's copied everywhere).
    if (l > 0) {
      EXPECT_NE(std::vector<float>(kv.query_row(l, 0, 0), kv.query_row(l, 0, 0) + row_floats),
                std::vector<float>(kv.query_row(0, 0, 0), kv.query_row(0, 0, 0) + row_floats));
    }
  }
}

}  // namespace
}  // namespace origami::test
