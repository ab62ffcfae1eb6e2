// The balanced FP8 decode attention (AttentionPlan::stream_ctas) through the CUDA backend, against
// the same backend with it off (BackendOptions::balanced_attention, the split kernel): tiny-qwen3
// (4 KV heads, D 64), FP8 KV cache, 40 sequences of 600 tokens, a shape balanced_decode_pays takes
// (160 units in 3-4 splits of 192-256 entries: the split plan fills a wave of short splits). Both
// read the same cache and differ only in where each sequence's entries are cut and merged (fp32
// partials, rounded to bf16 once), so the decode logits must differ far less than the FP8 cache
// itself changes them, and greedy decoding must part no more sequences from the split kernel's
// than the FP8 cache parts from a bf16 one (both are rounding-level changes; the cut is the
// smaller). Eager and graph steps; each backend must report the balanced steps it ran (none with
// the option off), or the comparison would check nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

constexpr int kBlockSize = 16, kSeqs = 40, kPromptLen = 600, kSteps = 8;

std::unique_ptr<Backend> make(const testing::Model& m, bool kv_fp8, bool balanced, bool graphs) {
  BackendOptions opt;
  opt.device = "cuda";
  opt.enable_cuda_graphs = graphs;
  opt.balanced_attention = balanced;
  const int blocks = 1 + kSeqs * ((kPromptLen + kSteps) / kBlockSize + 1);
  KVLayout layout = KVLayout::full(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim, kBlockSize, blocks,
                                   DType::kBF16);
  layout.fp8 = kv_fp8;
  return testing::make_cuda_backend(m, opt, layout);
}

std::vector<std::vector<int32_t>> random_prompts() {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> tok(20, 900);
  std::vector<std::vector<int32_t>> prompts(kSeqs, std::vector<int32_t>(kPromptLen));
  for (auto& p : prompts)
    for (int32_t& t : p) t = tok(rng);
  return prompts;
}

struct Decoded {
  std::vector<std::vector<int32_t>> tokens;  // [sequence][step]
  std::vector<float> logits;                 // forced runs: every decode step's logits, all sequences
};

// Prefills every prompt in one step, then decodes kSteps steps of all sequences. `forced`: each
// step feeds forced[s][i] and returns the logits of every row (LogitsMode::kAll: eager steps);
// null: greedy (LogitsMode::kLast: graph steps where the backend has them).
Decoded decode(Backend& backend, const std::vector<std::vector<int32_t>>& prompts,
               const std::vector<std::vector<int32_t>>* forced) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<std::vector<BlockId>> tables(prompts.size());
  BlockId next = 1;
  for (auto& t : tables)
    for (int i = 0; i * kBlockSize < kPromptLen + kSteps; ++i) t.push_back(next++);
  Decoded d;
  d.tokens.assign(prompts.size(), {});
  std::vector<std::vector<int32_t>> feed = prompts;  // tokens not yet in the cache, per sequence
  std::vector<int> cached(prompts.size(), 0);
  for (int step = 0; step <= kSteps; ++step) {
    ForwardBatch batch;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SequenceInput in;
      in.request_id = s;
      in.start_position = cached[s];
      in.num_cached_entries = cached[s];
      in.block_table = &tables[s];
      in.logits_mode = step > 0 && forced != nullptr ? LogitsMode::kAll : LogitsMode::kLast;
      in.sampling = &greedy;
      testing::append_sequence(batch, in, feed[s].data(), static_cast<int>(feed[s].size()));
    }
    StepOutput o;
    const Status st = backend.execute(batch, &o);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    for (size_t s = 0; s < prompts.size(); ++s) {
      cached[s] += static_cast<int>(feed[s].size());
      if (step > 0 && forced != nullptr) d.logits.insert(d.logits.end(), o.all_logits[s].begin(), o.all_logits[s].end());
      if (step == kSteps) continue;
      d.tokens[s].push_back(o.sampled_tokens[s]);
      feed[s] = {forced != nullptr ? (*forced)[s][step] : o.sampled_tokens[s]};
    }
  }
  return d;
}

int64_t balanced_steps(Backend& b) { return testing::cuda_step_count(b, &CudaBackend::num_balanced_attention_steps); }

TEST(BalancedAttention, DecodeFollowsTheSplitKernel) {
  const testing::Model m = testing::load_model(testing::shared_dir() + "/models/origami-tiny-qwen3");
  const auto prompts = random_prompts();
  for (bool graphs : {true, false}) {
    SCOPED_TRACE(graphs ? "graphs" : "eager");
    auto off = make(m, true, false, graphs), on = make(m, true, true, graphs), bf16_kv = make(m, false, false, graphs);
    ASSERT_TRUE(off && on && bf16_kv);
    const Decoded g_off = decode(*off, prompts, nullptr), g_on = decode(*on, prompts, nullptr);
    const Decoded g_bf16 = decode(*bf16_kv, prompts, nullptr);
    EXPECT_EQ(balanced_steps(*off), 0) << "the option off still ran the balanced kernel";
    EXPECT_GE(balanced_steps(*on), kSteps) << "the balanced kernel did not run at this shape: the test checks nothing";
    int same = 0, same_fp8 = 0;
    for (int s = 0; s < kSeqs; ++s) {
      same += g_on.tokens[s] == g_off.tokens[s];
      same_fp8 += g_off.tokens[s] == g_bf16.tokens[s];
    }
    std::printf("[balanced attention, %s] greedy: %d of %d sequences the same for %d tokens (FP8 cache against bf16: "
                "%d); balanced steps %lld\n",
                graphs ? "graphs" : "eager", same, kSeqs, kSteps, same_fp8, static_cast<long long>(balanced_steps(*on)));
    EXPECT_GE(same, same_fp8) << "the balanced cut parted more sequences from the split kernel than the FP8 cache "
                                 "parts from a bf16 one";
  }
  // Teacher-forced decode logits (eager, the split run's tokens fed to all): balanced against
  // split, next to what the FP8 cache itself changes (the same run over a bf16 cache).
  auto off = make(m, true, false, false), on = make(m, true, true, false), bf16_kv = make(m, false, false, false);
  ASSERT_TRUE(off && on && bf16_kv);
  const Decoded ref = decode(*off, prompts, nullptr);
  const Decoded l_off = decode(*off, prompts, &ref.tokens), l_on = decode(*on, prompts, &ref.tokens);
  const Decoded l_bf16 = decode(*bf16_kv, prompts, &ref.tokens);
  EXPECT_GE(balanced_steps(*on), kSteps);
  const double diff = testing::rel_err(l_on.logits, l_off.logits), fp8_effect = testing::rel_err(l_off.logits, l_bf16.logits);
  std::printf("[balanced attention] decode logits: balanced vs split rel err %.3e; FP8 cache vs bf16 cache %.3e\n", diff,
              fp8_effect);
  ASSERT_FALSE(l_on.logits.empty());
  EXPECT_LT(diff, 0.5 * fp8_effect) << "cutting the KV differently moved the logits as much as quantizing it";
}

}  // namespace
}  // namespace origami::cuda
