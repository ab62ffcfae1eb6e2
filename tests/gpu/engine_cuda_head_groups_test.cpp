// Head groups (ragged paging, TANGRAM §4.2-4.3) on the CUDA backend, end to end on
// origami-tiny-qwen3 (6 layers, 4 KV heads):
//  1. Uniform budgets: --heads-per-group 1 and 2 give the same greedy tokens as the one-group
//     layout, with CUDA graphs and eager, under full KV and under snapkv (query capture and
//     compaction of every group's own pages). The arithmetic per (query, head) and per
//     compressed (layer, head) is the same whatever the grouping, so the tokens must be equal.
//  2. Non-uniform budgets (--group-budget-ratios 0.25,1.0 and a --kv-head-budgets file whose
//     heads cluster into NON-adjacent groups {0, 2} and {1, 3}) under knorm: graphs on and off
//     give the same tokens; against the CPU backend (the fp32 oracle) on the same configuration,
//     teacher-forced on the CPU's greedy output, the GPU's log-probabilities agree within bf16
//     noise (mean |diff| < 0.05), 4x closer than those of the same GPU run with uniform budgets
//     (0.42-0.53 on an H100: far outside the noise), and the number of
//     compressions is the same.
//  3. `tangram` (calibrated budgets, groups of 2) compressing prompts of 183-256 tokens chunk by
//     chunk (chunks of 64, budget 64) with `chunk_score=keydiff`: the chunks before a prompt's end
//     are scored by KeyDiff and its end by the window's attention, so one compression batch may
//     mix scorers. Teacher-forced on the CPU's greedy output, the GPU's log-probabilities agree
//     with the CPU's within bf16 noise, much closer than a GPU run whose chunks are scored by
//     their window (`chunk_score=window`), and the number of compressions is the same.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "e2e/head_budgets_test_util.h"
#include "engine_run_util.h"
#include "engine/engine.h"
#include "engine/head_budget_loader.h"
#include "kv/head_budgets.h"
#include "model/config.h"

namespace origami {
namespace {

EngineConfig tiny_config(const std::string& device, int heads_per_group, bool graphs) {
  return testing::tiny_qwen3_engine_config(device, heads_per_group, graphs);
}

std::vector<std::vector<int32_t>> prompts() { return testing::shared_prefix_prompts(11, 10, 30); }

using testing::RunResult;

RunResult run(const EngineConfig& c, int max_tokens, const std::vector<std::vector<int32_t>>* forced = nullptr) {
  return testing::run(c, prompts(), max_tokens, forced);
}

TEST(CudaHeadGroups, UniformBudgetsGiveTheOneGroupTokens) {
  for (const std::string policy : {"full", "snapkv"}) {
    EngineConfig base = tiny_config("cuda", 0, true);
    base.kv_policy = policy;
    base.kv_budget = policy == "full" ? 0 : 64;
    const RunResult full = run(base, 100);
    if (policy != "full") {
      EXPECT_GT(full.compressions, 0);
    }
    for (int hp : {1, 2})
      for (bool graphs : {true, false}) {
        EngineConfig c = base;
        c.heads_per_group = hp;
        c.enable_cuda_graphs = graphs;
        const RunResult grouped = run(c, 100);
        EXPECT_EQ(grouped.compressions, full.compressions) << policy << " H_p " << hp;
        for (size_t i = 0; i < full.tokens.size(); ++i)
          EXPECT_EQ(grouped.tokens[i], full.tokens[i])
              << "policy '" << policy << "' H_p " << hp << " graphs " << graphs << " prompt " << i;
      }
  }
}

using testing::mean_abs_diff;

void check_non_uniform(const std::vector<float>& ratios, const std::string& budgets) {
  auto configure = [&](EngineConfig c) {
    c.heads_per_group = 2;
    c.group_budget_ratios = ratios;
    c.kv_head_budgets = budgets;
    c.kv_policy = "knorm";
    c.kv_budget = 64;
    return c;
  };
  const int kTokens = 120;
  const RunResult cpu = run(configure(tiny_config("cpu", 2, false)), kTokens);
  ASSERT_GT(cpu.compressions, 0);
  const RunResult gpu_graphs = run(configure(tiny_config("cuda", 2, true)), kTokens);
  const RunResult gpu_eager = run(configure(tiny_config("cuda", 2, false)), kTokens);
  EXPECT_EQ(gpu_graphs.tokens, gpu_eager.tokens) << "CUDA graphs change the output";
  // Teacher-forced on the CPU's tokens: the same cache contents up to rounding on both backends.
  const RunResult cpu_forced = run(configure(tiny_config("cpu", 2, false)), kTokens, &cpu.tokens);
  const RunResult gpu_forced = run(configure(tiny_config("cuda", 2, true)), kTokens, &cpu.tokens);
  EngineConfig uniform = tiny_config("cuda", 2, true);
  uniform.kv_policy = "knorm";
  uniform.kv_budget = 64;
  const RunResult gpu_uniform = run(uniform, kTokens, &cpu.tokens);
  EXPECT_EQ(gpu_forced.compressions, cpu_forced.compressions);
  const double err = mean_abs_diff(gpu_forced, cpu_forced);
  const double other = mean_abs_diff(gpu_uniform, cpu_forced);
  int agree = 0;
  while (agree < kTokens && gpu_graphs.tokens[0][agree] == cpu.tokens[0][agree]) ++agree;
  std::printf("[tiny-qwen3 head groups] %s: compressions cpu %lld gpu %lld; forced log-prob |gpu - cpu| mean %.4f "
              "(uniform-budget gpu run: %.4f); greedy prompt 0 agrees for %d/%d tokens\n",
              budgets.empty() ? "ratios 0.25,1.0" : "calibrated budgets", static_cast<long long>(cpu_forced.compressions),
              static_cast<long long>(gpu_forced.compressions), err, other, agree, kTokens);
  EXPECT_LT(err, 0.05) << "bf16 noise (measured 0.026-0.028 on an H100)";
  EXPECT_LT(err, 0.25 * other) << "the GPU follows the non-uniform budgets like the CPU";
}

TEST(CudaHeadGroups, NonUniformRatiosMatchCpu) { check_non_uniform({0.25f, 1.0f}, ""); }

TEST(CudaHeadGroups, CalibratedBudgetsWithNonAdjacentGroupsMatchCpu) { check_non_uniform({}, testing::write_head_budgets("cuda_tiny_budgets.json")); }

TEST(CudaHeadGroups, TangramChunksScoredByKeyDiffMatchCpu) {
  const std::vector<std::vector<int32_t>> long_prompts = testing::shared_prefix_prompts(23, 150, 33);
  auto configure = [&](EngineConfig c, const std::string& chunk_score) {
    c.heads_per_group = 2;
    c.kv_head_budgets = testing::write_head_budgets("cuda_tiny_budgets_chunks.json");
    c.kv_policy = "tangram";
    c.kv_budget = 64;
    c.kv_policy_options = {{"chunk_score", chunk_score}};
    return c;
  };
  const int kTokens = 40;
  const RunResult cpu = testing::run(configure(tiny_config("cpu", 2, false), "keydiff"), long_prompts, kTokens);
  ASSERT_GT(cpu.compressions, 8) << "every long prompt compresses after several chunks";
  const RunResult cpu_forced =
      testing::run(configure(tiny_config("cpu", 2, false), "keydiff"), long_prompts, kTokens, &cpu.tokens);
  const RunResult gpu_forced =
      testing::run(configure(tiny_config("cuda", 2, true), "keydiff"), long_prompts, kTokens, &cpu.tokens);
  // The GPU run is classified by the CPU reference it lies nearest: KeyDiff's, not the window
  // scorer's. (On this fixture the two CPU scorers differ by 0.09 mean |log p| and bf16 noise is
  // 0.027, so a GPU that scored chunks by the window would lie 3x nearer the window's reference.)
  const RunResult cpu_window =
      testing::run(configure(tiny_config("cpu", 2, false), "window"), long_prompts, kTokens, &cpu.tokens);
  EXPECT_EQ(gpu_forced.compressions, cpu_forced.compressions);
  const double err = mean_abs_diff(gpu_forced, cpu_forced);
  const double to_window = mean_abs_diff(gpu_forced, cpu_window);
  std::printf("[tiny-qwen3 tangram chunk_score=keydiff] compressions cpu %lld gpu %lld; forced log-prob |gpu - cpu| "
              "mean %.4f (|gpu - cpu with chunk_score=window|: %.4f; the two CPU scorers differ by %.4f)\n",
              static_cast<long long>(cpu_forced.compressions), static_cast<long long>(gpu_forced.compressions), err,
              to_window, mean_abs_diff(cpu_window, cpu_forced));
  EXPECT_LT(err, 0.05) << "bf16 noise";
  EXPECT_LT(err, 0.5 * to_window) << "the GPU scores the chunks by KeyDiff as the CPU does";
}

}  // namespace
}  // namespace origami
