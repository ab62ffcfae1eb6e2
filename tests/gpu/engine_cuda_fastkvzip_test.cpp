// fastkvzip (Fast KVzip gates) on the CUDA engine, end to end on origami-tiny-qwen3 with the
// shipped gates, budget 64 (a protected window of 16), chunked prefill and prefix caching:
//  1. CUDA graphs on and off give the same greedy tokens (the gate runs inside the decode graphs
//     and eagerly alike), and so do head groups of uniform budgets (--heads-per-group 1 and 2:
//     per-group slot tables and F pages) against the one-group layout;
//  2. against the CPU backend (the fp32 oracle) teacher-forced on the CPU's greedy output, the
//     GPU's log-probabilities agree within bf16 noise (mean |diff| < 0.05, as the other policies'
//     engine tests) and the number of compressions is the same; the same GPU run with the
//     StreamingLLM policy at the same budget (other entries kept) is at least 4x further off, so
//     the GPU keeps the CPU's entries;
//  3. --kv-gates random is refused without --dummy-weights and serves fastkvzip with them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "engine/engine.h"
#include "engine_run_util.h"

namespace origami {
namespace {

using testing::RunResult;

EngineConfig fastkvzip_config(const std::string& device, bool graphs, int heads_per_group = 0) {
  EngineConfig c = testing::tiny_qwen3_engine_config(device, heads_per_group, graphs);  // chunked prefill
  c.kv_policy = "fastkvzip";
  // Uniform per-head budgets on the layout the test chooses (the policy's default, the global
  // threshold on per-head pages, is engine_cuda_joint_selection_test's).
  c.kv_policy_options = {{"window", "16"}, {"allocation", "uniform"}, {"page_aligned", "0"}};
  c.kv_budget = 64;
  c.kv_gates = std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors";
  return c;
}

std::vector<std::vector<int32_t>> prompts() { return testing::shared_prefix_prompts(17, 20, 40); }

constexpr int kTokens = 120;

RunResult run(const EngineConfig& c, const std::vector<std::vector<int32_t>>* forced = nullptr) {
  return testing::run(c, prompts(), kTokens, forced);
}

using testing::mean_abs_diff;

TEST(CudaFastKVzip, GraphsAndHeadGroupsGiveTheSameTokens) {
  const RunResult graphs = run(fastkvzip_config("cuda", true));
  EXPECT_GT(graphs.compressions, 0);
  const RunResult eager = run(fastkvzip_config("cuda", false));
  EXPECT_EQ(eager.tokens, graphs.tokens) << "CUDA graphs change the output";
  EXPECT_EQ(eager.compressions, graphs.compressions);
  for (int hp : {1, 2}) {
    const RunResult grouped = run(fastkvzip_config("cuda", true, hp));
    EXPECT_EQ(grouped.compressions, graphs.compressions) << "H_p " << hp;
    EXPECT_EQ(grouped.tokens, graphs.tokens) << "H_p " << hp;
  }
}

TEST(CudaFastKVzip, KeepsTheCpuBackendsEntries) {
  const RunResult cpu = run(fastkvzip_config("cpu", false));
  ASSERT_GT(cpu.compressions, 0);
  const RunResult cpu_forced = run(fastkvzip_config("cpu", false), &cpu.tokens);
  const RunResult gpu_forced = run(fastkvzip_config("cuda", true), &cpu.tokens);
  EngineConfig streaming = fastkvzip_config("cuda", true);
  streaming.kv_policy = "streaming";
  streaming.kv_policy_options.clear();
  streaming.kv_gates.clear();  // no global-score pages without a policy that needs them
  const RunResult gpu_streaming = run(streaming, &cpu.tokens);
  EXPECT_EQ(gpu_forced.compressions, cpu_forced.compressions);
  const double err = mean_abs_diff(gpu_forced, cpu_forced);
  const double other = mean_abs_diff(gpu_streaming, cpu_forced);
  ASSERT_GT(gpu_streaming.compressions, 0);
  const RunResult gpu = run(fastkvzip_config("cuda", true));
  int agree = 0;
  while (agree < kTokens && gpu.tokens[0][agree] == cpu.tokens[0][agree]) ++agree;
  std::printf("[tiny-qwen3 fastkvzip] compressions cpu %lld gpu %lld; forced log-prob |gpu - cpu| mean %.4f "
              "(gpu streaming: %.4f); greedy prompt 0 agrees for %d/%d tokens\n",
              static_cast<long long>(cpu_forced.compressions), static_cast<long long>(gpu_forced.compressions), err,
              other, agree, kTokens);
  EXPECT_LT(err, 0.05) << "bf16 noise";
  EXPECT_LT(err, 0.25 * other) << "the GPU keeps other entries than the CPU";
}

TEST(CudaFastKVzip, RandomGatesOnlyWithDummyWeights) {
  EngineConfig c = fastkvzip_config("cuda", true);
  c.kv_gates = kRandomKvGates;
  auto refused = Engine::create(c);
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.status().message().find("--dummy-weights"), std::string::npos) << refused.status().to_string();
  c.dummy_weights = true;
  const RunResult r = testing::run(c, prompts(), 40);
  EXPECT_GT(r.compressions, 0);
  for (const auto& t : r.tokens) EXPECT_EQ(t.size(), 40u);
}

}  // namespace
}  // namespace origami
