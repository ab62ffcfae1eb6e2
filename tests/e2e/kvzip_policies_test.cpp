// The `fastkvzip` and `kvzip` policies on the CPU backend against brute forces, on
// origami-tiny-qwen3. fastkvzip, with the shipped gates (assets/gates/):
//   - the score the backend wrote with every entry (F, every layer and KV head) is the gate's
//     score of the hidden state that produced the entry, recomputed offline: the prompt run
//     through a separate CPU backend, its layers' attention inputs fed to gates::gate_scores;
//   - the compression keeps, per (layer, KV head), the brute-force top k of those scores with the
//     first 4 entries and the last `window` protected, ties to the newer entry, in order, as
//     bit-exact copies of the source keys;
// and the errors: a fastkvzip request on an engine without gates, and gates of another shape.
// kvzip: the prefill-end compression keeps, per (layer, KV head), the top k of the KVzip scores
// the offline scorer (eval/kvzip_scorer.h, tested against its own brute force) computes for the
// prompt, sinks protected, as bit-exact copies.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "cpu_backend_wrapper.h"
#include "engine_test_util.h"
#include "eval/kvzip_scorer.h"
#include "eval/single_sequence_backend.h"
#include "gates/sink_attention_gate.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;

// Snapshots every job's source keys and scores before the step and checks the kept set after.
class GateCheckingBackend : public CpuBackendWrapper {
 public:
  GateCheckingBackend() : CpuBackendWrapper("gate-checking-cpu") {}

  struct Snapshot {
    int num_entries = 0, num_keep = 0;
    std::vector<BlockId> dst;
    // [layer][head][entry]
    std::vector<std::vector<std::vector<float>>> f;
    std::vector<std::vector<std::vector<std::vector<float>>>> keys;
  };
  std::vector<Snapshot> before, after;  // one per compression (after: the kept entries' keys)

  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    cpu::CpuKVCache& kv = inner_->kv_cache();
    const KVLayout& layout = kv.layout();
    std::vector<Snapshot> pending;
    for (const CompressionJob& j : batch.compressions) {
      Snapshot s;
      s.num_entries = j.num_entries;
      s.num_keep = j.num_keep;
      s.dst = *j.dst_blocks;
      read(kv, layout, *j.src_blocks, j.num_entries, &s);
      pending.push_back(std::move(s));
    }
    Status st = inner_->execute(batch, out);
    for (Snapshot& s : pending) {
      Snapshot kept;
      read(kv, layout, s.dst, s.num_keep, &kept);
      before.push_back(std::move(s));
      after.push_back(std::move(kept));
    }
    return st;
  }


 private:
  static void read(cpu::CpuKVCache& kv, const KVLayout& layout, const std::vector<BlockId>& blocks, int n, Snapshot* s) {
    const int L = layout.num_layers, H = layout.num_kv_heads, d = layout.head_dim;
    s->f.assign(L, std::vector<std::vector<float>>(H, std::vector<float>(n)));
    s->keys.assign(L, std::vector<std::vector<std::vector<float>>>(H, std::vector<std::vector<float>>(n)));
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const cpu::HeadPages p = kv.head(l, h);
        for (int e = 0; e < n; ++e) {
          const BlockId b = blocks[e / kBlock];
          s->f[l][h][e] = p.f[static_cast<size_t>(b) * p.f_block_stride + e % kBlock];
          const float* k = kv.key_at(l, b, h, e % kBlock);
          s->keys[l][h][e].assign(k, k + d);
        }
      }
  }
};

std::vector<int32_t> prompt_tokens(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((i * 7919 + 13) % 8000 + 100));
  return t;
}

// Runs one request of `prompt` (3 tokens generated, so that its compression after the prefill
// runs) through an engine on a GateCheckingBackend; returns the backend once it saw one
// compression of the whole prompt down to `keep` entries (null otherwise).
GateCheckingBackend* run_one_request(const EngineConfig& c, const std::vector<int32_t>& prompt, int keep,
                                     std::unique_ptr<Engine>* engine) {
  auto backend = std::make_unique<GateCheckingBackend>();
  GateCheckingBackend* checker = backend.get();
  auto created = Engine::create(c, std::move(backend));
  EXPECT_TRUE(created.has_value()) << created.status().to_string();
  if (!created) return nullptr;
  *engine = std::move(*created);
  SamplingParams sp;
  sp.max_tokens = 3;
  EXPECT_TRUE((*engine)->add_request(prompt, sp).has_value());
  while ((*engine)->has_unfinished())
    for (const RequestOutput& out : (*engine)->step()) EXPECT_NE(out.finish_reason, FinishReason::kError) << out.error;
  EXPECT_EQ(checker->before.size(), 1u);
  if (checker->before.size() != 1) return nullptr;
  EXPECT_EQ(checker->before[0].num_entries, static_cast<int>(prompt.size()));
  EXPECT_EQ(checker->before[0].num_keep, keep);
  return checker->before[0].num_keep == keep ? checker : nullptr;
}

// The kept entries are the top `keep` of `score` with the first `sinks` and last `window`
// protected (ties to the newer entry), in order, as copies of the source keys.
void expect_kept_top_k(std::vector<float> score, int sinks, int window, const std::vector<std::vector<float>>& src,
                       const std::vector<std::vector<float>>& kept, int keep) {
  const int n = static_cast<int>(score.size());
  for (int e = 0; e < n; ++e)
    if (e < sinks || e >= n - window) score[e] = std::numeric_limits<float>::infinity();
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return score[a] > score[b] || (score[a] == score[b] && a > b); });
  order.resize(keep);
  std::sort(order.begin(), order.end());
  for (int i = 0; i < keep; ++i) ASSERT_EQ(kept[i], src[order[i]]) << "kept entry " << i;
}

TEST(FastKVzip, WritesGateScoresAndKeepsTheirTopK) {
  const int n = 100, budget = 64, window = 16, sinks = 4;  // N_max = 5: compressed after prefill to 64
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.block_size = kBlock;
  c.kv_policy = "fastkvzip";
  // Uniform budgets on one group: every head keeps its own gate top-k (the policy's default, the
  // global threshold on per-head pages, is engine_runtime_allocation_test's).
  c.kv_policy_options = {{"window", std::to_string(window)},
                         {"prefill_chunk_compression", "0"},
                         {"allocation", "uniform"},
                         {"page_aligned", "0"}};
  c.kv_budget = budget;
  c.kv_gates = tiny_qwen3_gates();
  const std::vector<int32_t> prompt = prompt_tokens(n);
  std::unique_ptr<Engine> engine;
  GateCheckingBackend* checker = run_one_request(c, prompt, budget, &engine);
  ASSERT_NE(checker, nullptr);
  const GateCheckingBackend::Snapshot& src = checker->before[0];
  const GateCheckingBackend::Snapshot& dst = checker->after[0];

  // The gates' scores of the prompt, offline.
  Expected<ModelConfig> mc = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(mc.has_value());
  Expected<gates::GateWeights> g = gates::load_gates(tiny_qwen3_gates(), *mc);
  ASSERT_TRUE(g.has_value()) << g.status().message();
  auto runner = eval::SingleSequenceBackend::create(tiny_qwen3_dir(), *mc, n, 1);
  ASSERT_TRUE(runner.has_value());
  std::vector<std::vector<float>> expected(mc->num_layers, std::vector<float>(static_cast<size_t>(n) * mc->num_kv_heads));
  (*runner)->backend().set_layer_observer([&](const CpuBackend::LayerActivations& a) {
    gates::gate_scores(g->shape, g->layers[a.layer], a.normed_input, a.num_tokens, mc->hidden_size,
                       expected[a.layer].data());
  });
  ASSERT_TRUE((*runner)->run(prompt, 0).is_ok());

  for (int l = 0; l < mc->num_layers; ++l)
    for (int h = 0; h < mc->num_kv_heads; ++h) {
      std::vector<float> score(n);
      for (int e = 0; e < n; ++e) {
        score[e] = expected[l][static_cast<size_t>(e) * mc->num_kv_heads + h];
        ASSERT_NEAR(src.f[l][h][e], score[e], 1e-5) << "layer " << l << " head " << h << " entry " << e;
        score[e] = src.f[l][h][e];  // the selection reads the stored float
      }
      expect_kept_top_k(score, sinks, window, src.keys[l][h], dst.keys[l][h], budget);
    }
}

// One pass after the whole prompt (chunk 0), and three chunks of 32, each reconstructed right
// after itself: the policy keeps the top-k of the offline scorer's scores at the same chunk size.
class KVzipPolicyChunks : public ::testing::TestWithParam<int> {};

TEST_P(KVzipPolicyChunks, KeepsTheTopKOfTheOfflineKVzipScores) {
  const int n = 90, budget = 40, sinks = 4, chunk = GetParam();
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  c.block_size = kBlock;
  c.kv_policy = "kvzip";
  c.kv_budget = budget;
  c.kv_policy_options = {{"chunk", std::to_string(chunk)}};
  const std::vector<int32_t> prompt = prompt_tokens(n);
  std::unique_ptr<Engine> engine;
  GateCheckingBackend* checker = run_one_request(c, prompt, budget, &engine);
  ASSERT_NE(checker, nullptr);
  const GateCheckingBackend::Snapshot& src = checker->before[0];
  const GateCheckingBackend::Snapshot& dst = checker->after[0];

  Expected<ModelConfig> mc = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(mc.has_value());
  Expected<std::shared_ptr<Tokenizer>> tok = Tokenizer::load(tiny_qwen3_dir());
  ASSERT_TRUE(tok.has_value());
  eval::KVzipOptions options;
  options.prompts = eval::kvzip_prompts(**tok);
  options.chunk_size = chunk > 0 ? chunk : n;
  auto scorer = eval::KVzipScorer::create(tiny_qwen3_dir(), *mc, options, n, 1);
  ASSERT_TRUE(scorer.has_value());
  Expected<eval::KVzipResult> offline = (*scorer)->score(prompt, false);
  ASSERT_TRUE(offline.has_value()) << offline.status().message();
  for (int l = 0; l < mc->num_layers; ++l)
    for (int h = 0; h < mc->num_kv_heads; ++h) {
      SCOPED_TRACE("layer " + std::to_string(l) + " head " + std::to_string(h));
      expect_kept_top_k(offline->scores[l][h], sinks, 0, src.keys[l][h], dst.keys[l][h], budget);
      // The scores moved with their entries (F of the kept entries).
      for (int i = sinks; i < budget; ++i) EXPECT_GT(dst.f[l][h][i], 0.0f);
    }
}

INSTANTIATE_TEST_SUITE_P(OnePassAndChunked, KVzipPolicyChunks, ::testing::Values(0, 32));

TEST(FastKVzip, RefusedWithoutGatesAndWithGatesOfAnotherShape) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  RequestOptions o;
  o.kv_policy = "fastkvzip";
  SamplingParams sp;
  sp.max_tokens = 1;
  Expected<RequestId> id = engine->add_request(prompt_tokens(8), sp, o);
  ASSERT_FALSE(id.has_value());
  EXPECT_NE(id.status().message().find("--kv-gates"), std::string::npos) << id.status().message();

  EngineConfig s = cpu_config(stories_dir());
  s.kv_gates = tiny_qwen3_gates();
  auto wrong = Engine::create(s);
  ASSERT_FALSE(wrong.has_value());
  EXPECT_NE(wrong.status().message().find("--kv-gates"), std::string::npos) << wrong.status().message();
  EXPECT_NE(wrong.status().message().find("layers than the model's 5"), std::string::npos) << wrong.status().message();
}

}  // namespace
}  // namespace origami::testing
