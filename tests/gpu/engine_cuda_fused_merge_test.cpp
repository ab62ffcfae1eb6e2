// Decode attention's split merge in the last CTA of each (sequence, KV head) (AttentionArgs::
// split_counters, used from kFusedMergeMinSplits splits) against the merge kernel, through the
// engine: greedy tokens and forced log-probabilities of tiny-qwen3 must be bit for bit the same.
// Graph steps plan their splits for the capture length (many splits at these batch sizes); the
// eager case decodes one 2,100-token prompt, whose plan has 17 splits of its own. bf16 and FP8
// weights + FP8 KV (the streamed FP8 kernel, its balanced variant off), one group and per-head pages.
#include <gtest/gtest.h>

#include <random>

#include "engine_run_util.h"

namespace origami::testing {
namespace {

std::vector<std::vector<int32_t>> long_prompt(int length) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(20, 900);
  std::vector<int32_t> p(static_cast<size_t>(length));
  for (int32_t& t : p) t = tok(rng);
  return {p};
}

TEST(EngineCudaFusedMerge, OutputsAreBitIdenticalToTheMergeKernel) {
  struct Case {
    bool graphs;
    bool fp8;
    int heads_per_group;
  };
  for (const Case& k : {Case{true, false, 0}, Case{true, true, 0}, Case{true, false, 1}, Case{false, false, 0},
                        Case{false, true, 0}}) {
    SCOPED_TRACE(std::string(k.graphs ? "graphs" : "eager") + (k.fp8 ? ", fp8" : ", bf16") + ", heads per group " +
                 std::to_string(k.heads_per_group));
    // Eager steps plan for their own longest sequence: 2,100 entries give 17 splits of 128.
    const std::vector<std::vector<int32_t>> prompts = k.graphs ? shared_prefix_prompts(31, 20, 17) : long_prompt(2100);
    EngineConfig c = tiny_qwen3_engine_config("cuda", k.heads_per_group, k.graphs);
    if (!k.graphs) {
      c.num_kv_blocks = 160;  // 2,560 entries
      c.max_num_batched_tokens = 512;
    }
    if (k.fp8) {
      c.quantization = "fp8";
      c.kv_cache_dtype = KVCacheDType::kFP8;
    }
    // The balanced FP8 kernel shares tiles out instead of splitting (it always merges in the
    // kernel): off, so that both runs split alike.
    c.balanced_attention = false;
    c.fused_attention_merge = false;
    const RunResult kernel = run(c, prompts, 24);
    const RunResult forced_kernel = run(c, prompts, 24, &kernel.tokens);
    c.fused_attention_merge = true;
    const RunResult fused = run(c, prompts, 24);
    const RunResult forced_fused = run(c, prompts, 24, &kernel.tokens);
    expect_bit_identical_runs(kernel, forced_kernel, fused, forced_fused, 24);
  }
}

}  // namespace
}  // namespace origami::testing
