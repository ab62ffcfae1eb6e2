// Mixed steps (prompt tokens beside decode rows) through the CUDA backend with the decode rows'
// attention in the decode kernels (BackendOptions::mixed_decode_attention, MixedAttentionPlan)
// against one 64-row launch for the whole batch (the option off): tiny-qwen3 (4 KV heads, D 64),
// FP8 KV cache. 12 sequences decode from prompts of 300-520 tokens while 3 more prefill their
// prompts in chunks beside them, every step teacher-forced with fixed tokens and returning every
// row's logits. Both read the same cache and differ in how the decode rows' products are rounded
// and, for the prompts, in the split plan made for their part alone, so the logits must differ far
// less than the FP8 cache itself changes them (the same steps over a bf16 cache). The backend must
// report the split steps (none with the option off), or the comparison would check nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

constexpr int kBlockSize = 16, kDecodeSeqs = 12, kNewSeqs = 3, kNewLen = 192, kSteps = 4;

int prompt_len(int s) { return 300 + 20 * s; }  // the decoding sequences' prompts

std::unique_ptr<Backend> make(const testing::Model& m, bool kv_fp8, bool mixed) {
  BackendOptions opt;
  opt.device = "cuda";
  opt.mixed_decode_attention = mixed;
  int blocks = 1;
  for (int s = 0; s < kDecodeSeqs; ++s) blocks += (prompt_len(s) + kSteps) / kBlockSize + 1;
  blocks += kNewSeqs * (kNewLen / kBlockSize + 1);
  KVLayout layout = KVLayout::full(m.config.num_layers, m.config.num_kv_heads, m.config.head_dim, kBlockSize, blocks,
                                   DType::kBF16);
  layout.fp8 = kv_fp8;
  return testing::make_cuda_backend(m, opt, layout);
}

int32_t token(int s, int i) { return 20 + (s * 131 + i * 17) % 880; }

// Prefills the decoding sequences' prompts in one step, then runs kSteps mixed steps: the
// kDecodeSeqs sequences one fixed token each (listed first, as the scheduler lists running
// requests), then each new sequence's next chunk of kNewLen / kSteps prompt tokens. Returns
// every row's logits of the mixed steps.
std::vector<float> mixed_steps(Backend& backend) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<std::vector<BlockId>> tables(kDecodeSeqs + kNewSeqs);
  BlockId next = 1;
  for (int s = 0; s < kDecodeSeqs + kNewSeqs; ++s) {
    const int entries = s < kDecodeSeqs ? prompt_len(s) + kSteps : kNewLen;
    for (int i = 0; i * kBlockSize < entries; ++i) tables[s].push_back(next++);
  }
  std::vector<int> cached(kDecodeSeqs + kNewSeqs, 0);
  std::vector<float> logits;
  for (int step = 0; step <= kSteps; ++step) {
    ForwardBatch batch;
    std::vector<int32_t> feed;
    for (int s = 0; s < kDecodeSeqs + kNewSeqs; ++s) {
      const bool decoding = s < kDecodeSeqs;
      if (step == 0 && !decoding) continue;  // the new sequences arrive with the mixed steps
      const int count = step == 0 ? prompt_len(s) : decoding ? 1 : kNewLen / kSteps;
      feed.clear();
      for (int i = 0; i < count; ++i) feed.push_back(token(s, cached[s] + i));
      SequenceInput in;
      in.request_id = static_cast<uint64_t>(s);
      in.start_position = cached[s];
      in.num_cached_entries = cached[s];
      in.block_table = &tables[s];
      in.logits_mode = step > 0 ? LogitsMode::kAll : LogitsMode::kLast;
      in.sampling = &greedy;
      testing::append_sequence(batch, in, feed.data(), count);
      cached[s] += count;
    }
    StepOutput o;
    const Status st = backend.execute(batch, &o);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    if (!st.is_ok()) break;
    if (step > 0)
      for (const auto& rows : o.all_logits) logits.insert(logits.end(), rows.begin(), rows.end());
  }
  return logits;
}

int64_t mixed_attention_steps(Backend& b) { return testing::cuda_step_count(b, &CudaBackend::num_mixed_attention_steps); }

TEST(MixedAttention, DecodeRowsInTheDecodeKernelsFollowOneLaunch) {
  const testing::Model m = testing::load_model(testing::shared_dir() + "/models/origami-tiny-qwen3");
  auto off = make(m, true, false), on = make(m, true, true), bf16_kv = make(m, false, true);
  ASSERT_TRUE(off && on && bf16_kv);
  const std::vector<float> l_off = mixed_steps(*off), l_on = mixed_steps(*on), l_bf16 = mixed_steps(*bf16_kv);
  EXPECT_EQ(mixed_attention_steps(*off), 0) << "the option off still split a mixed step";
  EXPECT_EQ(mixed_attention_steps(*on), kSteps) << "the mixed steps were not split: the test checks nothing";
  EXPECT_EQ(mixed_attention_steps(*bf16_kv), 0) << "a bf16 cache was split (its 64-row reads are as fast)";
  ASSERT_FALSE(l_off.empty());
  ASSERT_EQ(l_on.size(), l_off.size());
  ASSERT_EQ(l_bf16.size(), l_off.size());
  const double diff = testing::rel_err(l_on, l_off), fp8_effect = testing::rel_err(l_off, l_bf16);
  std::printf("[mixed attention] mixed-step logits: split vs one launch rel err %.3e; FP8 cache vs bf16 cache %.3e\n",
              diff, fp8_effect);
  EXPECT_LT(diff, 0.5 * fp8_effect) << "running the decode rows in the decode kernels moved the logits as much as "
                                       "quantizing the cache";
}

}  // namespace
}  // namespace origami::cuda
