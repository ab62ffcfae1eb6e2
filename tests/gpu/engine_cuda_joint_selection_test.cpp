// Runtime head budgets (joint selection, src/backend/cuda/joint_selection.h) on the CUDA engine,
// end to end on origami-tiny-qwen3 with chunked prefill and prefix caching: `adakv` (SnapKV's
// score, one top-k per layer) and `fastkvzip` with allocation=global (the shipped gates, one
// threshold over every head; with entry counts and with page_aligned=1), on the default layout
// (one group) and on per-head pages (--heads-per-group 1):
//  1. CUDA graphs on and off give the same greedy tokens and compressions;
//  2. against the CPU backend (the fp32 oracle) teacher-forced on the CPU's greedy output, the
//     GPU's log-probabilities agree within bf16 noise (mean |diff| < 0.05, as the other policies'
//     engine tests), the compressions are as many, and the pages held after the compactions
//     (the joint counts the scheduler trims each table to) agree within 3%; StreamingLLM at the
//     same budget on the GPU is at least 4x further off, so the GPU keeps the CPU's entries;
//  3. adakv once more on an FP8 KV cache (--kv-cache-dtype fp8 on both backends: the CUDA
//     compression kernels read the codes, the CPU its emulation), under the same bounds;
//  4. every run ends without a request error and with every KV block returned (the scheduler's
//     trims and reservations hold under the counts the device chose).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine_run_util.h"

namespace origami {
namespace {

using testing::RunResult;

struct Case {
  const char* policy;
  PolicyOptionMap options;
  bool gates;
  KVCacheDType kv_cache_dtype = KVCacheDType::kAuto;  // fp8: both backends' caches (the CPU emulates it)
};

std::vector<Case> cases() {
  return {{"adakv", {{"window", "16"}}, false},
          {"fastkvzip", {{"window", "16"}, {"allocation", "global"}, {"page_aligned", "0"}}, true},
          {"fastkvzip", {{"window", "16"}, {"allocation", "global"}, {"page_aligned", "1"}}, true},
          {"adakv", {{"window", "16"}}, false, KVCacheDType::kFP8}};
}

// The case's name in traces and printed lines: the policy, its allocation options and the cache dtype.
std::string label(const Case& c) {
  std::string name = c.policy;
  for (const char* key : {"allocation", "page_aligned"})
    if (auto it = c.options.find(key); it != c.options.end()) name += std::string(" ") + key + "=" + it->second;
  if (c.kv_cache_dtype != KVCacheDType::kAuto) name += std::string(" kv=") + kv_cache_dtype_name(c.kv_cache_dtype);
  return name;
}

EngineConfig joint_config(const Case& c, const std::string& device, bool graphs, int heads_per_group) {
  EngineConfig config = testing::tiny_qwen3_engine_config(device, heads_per_group, graphs);
  config.kv_policy = c.policy;
  config.kv_policy_options = c.options;
  config.kv_budget = 64;
  config.kv_cache_dtype = c.kv_cache_dtype;
  if (c.gates) config.kv_gates = std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors";
  return config;
}

std::vector<std::vector<int32_t>> prompts() { return testing::shared_prefix_prompts(23, 60, 50); }

constexpr int kTokens = 100;

RunResult run(const EngineConfig& c, const std::vector<std::vector<int32_t>>* forced = nullptr) {
  return testing::run(c, prompts(), kTokens, forced);
}

TEST(CudaJointSelectionEngine, GraphsOnAndOffGiveTheSameTokens) {
  for (const Case& c : cases())
    for (int hp : {0, 1}) {
      SCOPED_TRACE(label(c) + " heads_per_group " + std::to_string(hp));
      const RunResult graphs = run(joint_config(c, "cuda", true, hp));
      EXPECT_GT(graphs.compressions, 0);
      const RunResult eager = run(joint_config(c, "cuda", false, hp));
      EXPECT_EQ(eager.tokens, graphs.tokens) << "CUDA graphs change the output";
      EXPECT_EQ(eager.compressions, graphs.compressions);
      EXPECT_EQ(eager.kept_pages, graphs.kept_pages);
    }
}

TEST(CudaJointSelectionEngine, KeepsTheCpuBackendsCountsAndEntries) {
  for (const Case& c : cases())
    for (int hp : {0, 1}) {
      SCOPED_TRACE(label(c) + " heads_per_group " + std::to_string(hp));
      const RunResult cpu = run(joint_config(c, "cpu", false, hp));
      ASSERT_GT(cpu.compressions, 0);
      const RunResult cpu_forced = run(joint_config(c, "cpu", false, hp), &cpu.tokens);
      const RunResult gpu_forced = run(joint_config(c, "cuda", true, hp), &cpu.tokens);
      EngineConfig streaming = joint_config(c, "cuda", true, hp);
      streaming.kv_policy = "streaming";
      streaming.kv_policy_options.clear();
      streaming.kv_gates.clear();
      const RunResult gpu_streaming = run(streaming, &cpu.tokens);
      ASSERT_GT(gpu_streaming.compressions, 0);
      EXPECT_EQ(gpu_forced.compressions, cpu_forced.compressions);
      const double err = testing::mean_abs_diff(gpu_forced, cpu_forced);
      const double other = testing::mean_abs_diff(gpu_streaming, cpu_forced);
      const double pages_diff = std::fabs(static_cast<double>(gpu_forced.kept_pages - cpu_forced.kept_pages)) /
                                static_cast<double>(std::max<int64_t>(1, cpu_forced.kept_pages));
      std::printf("[tiny-qwen3 %s hp=%d] compressions cpu %lld gpu %lld; kept pages cpu %lld gpu %lld; forced "
                  "log-prob |gpu - cpu| mean %.4f (gpu streaming: %.4f)\n",
                  label(c).c_str(), hp, static_cast<long long>(cpu_forced.compressions),
                  static_cast<long long>(gpu_forced.compressions), static_cast<long long>(cpu_forced.kept_pages),
                  static_cast<long long>(gpu_forced.kept_pages), err, other);
      // The FP8 cache adds its own GPU-vs-CPU noise (a K or V value that rounds differently
      // before quantization can move a code by a whole E4M3 step, 6-12%): measured in the same
      // run as full KV on the same cache and forced tokens, and added to the bf16 bound.
      double cache_noise = 0.0;
      if (c.kv_cache_dtype == KVCacheDType::kFP8) {
        EngineConfig full_cpu = joint_config(c, "cpu", false, hp), full_gpu = joint_config(c, "cuda", true, hp);
        for (EngineConfig* f : {&full_cpu, &full_gpu}) {
          f->kv_policy = "full";
          f->kv_policy_options.clear();
          f->kv_gates.clear();
        }
        cache_noise = testing::mean_abs_diff(run(full_gpu, &cpu.tokens), run(full_cpu, &cpu.tokens));
        std::printf("[tiny-qwen3 %s hp=%d] full KV on this cache: log-prob |gpu - cpu| mean %.4f\n", label(c).c_str(),
                    hp, cache_noise);
      }
      EXPECT_LT(err, 0.05 + cache_noise) << "bf16 noise (+ the FP8 cache's own, measured with full KV)";
      EXPECT_LT(err, 0.25 * other) << "the GPU keeps other entries than the CPU";
      EXPECT_LE(pages_diff, 0.03) << "the GPU's joint counts differ from the CPU's";
    }
}

}  // namespace
}  // namespace origami
