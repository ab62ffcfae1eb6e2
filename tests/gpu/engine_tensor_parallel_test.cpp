// Tensor parallelism (backend/cuda/tensor_parallel_backend.h) on origami-tiny-qwen3 (4 KV heads,
// 8 query heads): TP = 2 against TP = 1 and the CPU on the same engine path, full KV and zipage
// (every rank compressing its own heads with the same jobs), with the fused peer all-reduce and
// with NCCL's. The bad configurations are refused before anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "engine_run_util.h"
#include "engine/engine.h"
#include "model/config.h"
#include "policy/policy_registry.h"

namespace origami {
namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

EngineConfig tiny_config(int tp) {
  EngineConfig c;
  c.model_dir = cuda::testing::shared_dir() + "/models/origami-tiny-qwen3";
  c.device = "cuda";
  c.block_size = 16;
  c.max_num_seqs = 16;
  c.kv_cache_bytes = int64_t{256} << 20;
  c.tensor_parallel_size = tp;
  return c;
}

std::vector<std::vector<int32_t>> prompts(int n, int vocab) {
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> out(n);
  for (int i = 0; i < n; ++i) {
    out[i].resize(20 + 37 * i);
    for (int32_t& t : out[i]) t = static_cast<int32_t>(1 + rng() % (vocab - 1));
  }
  return out;
}

using testing::RunResult;
using testing::run;

class EngineTensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (gpu_count() < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; " << gpu_count() << " visible";
  }
};

// TP = 2 rounds differently from TP = 1 (each rank's partial sums are rounded to bf16 before they
// are added: tensor_parallel_trace_test shows it layer by layer), so the two decide as the
// single-GPU tests decide against the CPU: TP = 2's log-probabilities of forced tokens are within
// the bf16 noise the single-GPU engine tests allow (mean |diff| < 0.05 against the fp32 CPU), and
// where TP = 2's greedy output parts from TP = 1's, it is at a near-tie: the CPU's log-probability
// gap between the two choices is below 4 sigma of the TP = 2 - CPU noise measured on the same
// prompts (as cuda_fp8_test decides the FP8 partings).
struct Comparison {
  double mean_tp1 = 0, mean_tp2 = 0, sigma_tp2 = 0;
  int parted = 0;
  int64_t compressions = 0;  // TP = 2's
};

// near_ties: whether greedy partings must be near-ties of the CPU. Not under compression: there a
// near-tie of the scores at a cut keeps a different entry on one side (as on one GPU against the
// CPU: cuda_compression_e2e_test), after which the outputs may part anywhere; the forced
// log-probabilities, on the same tokens, are what the single-GPU compressed tests compare too.
Comparison compare_with_cpu(EngineConfig one, EngineConfig two, const std::vector<std::vector<int32_t>>& ps,
                            int max_tokens, const char* tag, bool near_ties = true) {
  Comparison r;
  EngineConfig cpu = one;
  cpu.device = "cpu";
  const RunResult a = run(one, ps, max_tokens);
  const RunResult b = run(two, ps, max_tokens);
  EXPECT_EQ(b.compressions, a.compressions) << tag;
  r.compressions = b.compressions;
  if (a.compressions > 0)
    std::printf("[tp] %s: %lld compressions; pages kept after them TP=1 %lld, TP=2 %lld\n", tag,
                static_cast<long long>(a.compressions), static_cast<long long>(a.kept_pages),
                static_cast<long long>(b.kept_pages));
  // Noise: every path teacher-forced on TP = 1's outputs.
  const RunResult fc = run(cpu, ps, max_tokens, &a.tokens);
  const RunResult f1 = run(one, ps, max_tokens, &a.tokens);
  const RunResult f2 = run(two, ps, max_tokens, &a.tokens);
  r.mean_tp1 = testing::mean_abs_diff(f1, fc);
  r.mean_tp2 = testing::mean_abs_diff(f2, fc);
  double sq = 0;
  size_t n = 0;
  for (size_t i = 0; i < ps.size(); ++i)
    for (size_t t = 0; t < fc.forced_logprobs[i].size() && t < f2.forced_logprobs[i].size(); ++t, ++n)
      sq += (f2.forced_logprobs[i][t] - fc.forced_logprobs[i][t]) * (f2.forced_logprobs[i][t] - fc.forced_logprobs[i][t]);
  r.sigma_tp2 = std::sqrt(sq / std::max<size_t>(n, 1));
  std::printf("[tp] %s: forced log p vs the CPU: mean |diff| TP=1 %.4f, TP=2 %.4f; TP=2 sigma %.4f\n", tag, r.mean_tp1,
              r.mean_tp2, r.sigma_tp2);
  // The split must not add error: within bf16 noise of the CPU where one GPU is (0.05, as the
  // single-GPU engine tests); where one GPU itself is farther from the CPU (kvllm's many
  // compressions: 0.112 on an H200), TP = 2 no farther than TP = 1 plus that noise.
  const double bound = r.mean_tp1 < 0.05 ? 0.05 : r.mean_tp1 + 0.05;
  EXPECT_LT(r.mean_tp2, bound) << tag << ": bf16 noise";
  for (size_t i = 0; i < ps.size(); ++i) {
    size_t agree = 0;
    while (agree < a.tokens[i].size() && agree < b.tokens[i].size() && a.tokens[i][agree] == b.tokens[i][agree]) ++agree;
    std::printf("[tp] %s prompt %zu: TP=2 greedy agrees with TP=1 for %zu/%zu tokens\n", tag, i, agree,
                a.tokens[i].size());
    if (agree == a.tokens[i].size()) continue;
    ++r.parted;
    if (!near_ties) continue;
    // The CPU's log-probabilities of both choices after the common prefix.
    std::vector<std::vector<int32_t>> p1 = {ps[i]}, f_one = {std::vector<int32_t>(a.tokens[i].begin(), a.tokens[i].begin() + agree + 1)};
    std::vector<std::vector<int32_t>> f_two = f_one;
    f_two[0].back() = b.tokens[i][agree];
    const RunResult c1 = run(cpu, p1, static_cast<int>(agree) + 1, &f_one);
    const RunResult c2 = run(cpu, p1, static_cast<int>(agree) + 1, &f_two);
    const double gap = c1.forced_logprobs[0].back() - c2.forced_logprobs[0].back();
    std::printf("[tp] %s   parted at token %zu: CPU log p gap (TP=1's choice - TP=2's) %.4f, bound 4 sigma %.4f\n", tag,
                agree, gap, 4 * r.sigma_tp2);
    EXPECT_LT(gap, 4 * r.sigma_tp2) << tag << " prompt " << i << " parted at a clear choice";
  }
  return r;
}

TEST_F(EngineTensorParallel, GreedyFullKvPartsFromOneGpuOnlyAtNearTies) {
  compare_with_cpu(tiny_config(1), tiny_config(2), prompts(8, 8192), 48, "full KV");
}

TEST_F(EngineTensorParallel, NcclReductionPartsOnlyAtNearTies) {
  EngineConfig nccl = tiny_config(2);
  nccl.custom_all_reduce = false;
  compare_with_cpu(tiny_config(1), nccl, prompts(8, 8192), 48, "full KV, NCCL all-reduce");
}

// FP8 weights (quantized whole, as on one GPU, then sharded: a row-parallel shard keeps every
// channel's scale) and the FP8 KV cache (each rank its own heads) at TP = 2, against TP = 1 and the
// CPU's emulation of the same rounding, with the FP8 GEMV serving decode's 1-2 rows as by default.
// Decided on the forced log-probabilities: TP = 2 no farther from the CPU than TP = 1 plus the bf16
// noise (a shard with wrong scales or heads lands far outside it). Greedy partings are printed, not
// asserted: the bf16 rule (the CPU's gap under 4 sigma of the log-probability noise over all
// tokens) does not hold FP8's heavy-tailed per-token error. On 2 x H100 TP = 2's mean error was
// 0.107 against TP = 1's 0.115, yet 2 of 8 prompts parted at 4.2 and 5.9 sigma; the single-GPU FP8
// tests decide partings on each position's own logit noise (cuda_fp8_test), which needs logits
// the engine does not return.
TEST_F(EngineTensorParallel, Fp8WeightsAndKvStayAsCloseToTheCpuAsOneGpu) {
  EngineConfig one = tiny_config(1), two = tiny_config(2);
  for (EngineConfig* c : {&one, &two}) {
    c->quantization = "fp8";
    c->kv_cache_dtype = KVCacheDType::kFP8;
  }
  compare_with_cpu(one, two, prompts(8, 8192), 48, "FP8 weights + FP8 KV", /*near_ties=*/false);
}

TEST_F(EngineTensorParallel, GreedyEagerEqualsGraphs) {
  const auto ps = prompts(4, 8192);
  EngineConfig eager = tiny_config(2);
  eager.enable_cuda_graphs = false;
  EXPECT_EQ(run(eager, ps, 32).tokens, run(tiny_config(2), ps, 32).tokens);
}

TEST_F(EngineTensorParallel, ZipageCompressesEveryRankLikeOneGpu) {
  EngineConfig one = tiny_config(1), two = tiny_config(2);
  for (EngineConfig* c : {&one, &two}) {
    c->kv_policy = "zipage";
    c->kv_budget = 128;
  }
  EXPECT_GT(compare_with_cpu(one, two, prompts(6, 8192), 200, "zipage 128", /*near_ties=*/false).compressions, 0);
}

// Every registered policy at TP = 2 against TP = 1 and the CPU (the policy matrix across ranks):
// each either runs, every request to its length, the same number of compressions as TP = 1 and
// forced log-probabilities within bf16 noise of the CPU's (mean |diff| < 0.05, as on one GPU), or is
// refused before it runs with an error that names tensor parallelism (what is not split across
// ranks yet: head groups). PagedEviction chooses its block from every rank's heads
// (TensorParallelBackend::execute), Fast KVzip scores with each rank's slice of the gates, and
// the runtime allocations (adakv, Fast KVzip's global threshold) select over every rank's heads
// (CudaCompressor::set_tensor_parallel): ranks that kept different counts fail the request.
TEST_F(EngineTensorParallel, PolicyMatrixAcrossRanks) {
  const PolicyRegistry& registry = PolicyRegistry::builtin();
  const auto ps = prompts(4, 8192);
  int ran = 0, refused = 0;
  // Head groups at TP = 2 take one head from each rank (kv_layout_ranks.h: Fast KVzip's per-head
  // pages become pairs of heads {0, 2}, {1, 3} of the tiny model's 4), so TP = 1 and the CPU run
  // that striped layout too (head_group_stripes), and the joint selection over both ranks' heads
  // must keep their counts.
  auto configure = [&](const std::string& name, EngineConfig* c) {
    c->kv_policy = name;
    c->kv_budget = 64;
    if (name == "kvllm") {
      c->kv_budget = 0;  // it keeps a ratio of a sliding window, no budget
      c->kv_policy_options = {{"window", "48"}, {"buffer", "8"}, {"delta", "4"}, {"chunk_budget", "6"}, {"chunk_len", "5"}};
    }
    if (name == "fastkvzip" || name == "kvzip") c->kv_policy_options["window"] = "16";
    if (name == "fastkvzip") c->kv_gates = std::string(ORIGAMI_SOURCE_DIR) + "/assets/gates/origami-tiny-qwen3.safetensors";
  };
  auto variants = [](const std::string& name) {
    std::vector<std::map<std::string, std::string>> v = {{}};
    if (name == "fastkvzip") v.push_back({{"allocation", "uniform"}, {"page_aligned", "0"}, {"heads-per-group", "4"}});
    // Head groups of two heads, one per rank, under uniform and non-uniform budgets.
    if (name == "snapkv") v.push_back({{"heads-per-group", "2"}});
    if (name == "adakv") v.push_back({{"heads-per-group", "2"}});
    return v;
  };
  for (const PolicyInfo& info : registry.policies()) {
    for (const auto& extra : variants(info.name)) {
      EngineConfig one = tiny_config(1), two = tiny_config(2);
      configure(info.name, &one);
      configure(info.name, &two);
      one.head_group_stripes = 2;  // TP = 2's grouping (it stripes over its ranks by itself)
      for (const auto& [k, v] : extra) {
        if (k == "heads-per-group") one.heads_per_group = two.heads_per_group = std::stoi(v);
        else one.kv_policy_options[k] = two.kv_policy_options[k] = v;
      }
      std::string tag = info.name;
      for (const auto& [k, v] : extra) tag += " " + k + "=" + v;
      // Refused? (at engine start or at the first request)
      auto refusal_of = [&](const EngineConfig& c) -> std::string {
        auto engine = Engine::create(c);
        if (!engine.has_value()) return engine.status().to_string();
        SamplingParams greedy;
        greedy.temperature = 0.0f;
        greedy.max_tokens = 4;
        auto id = (*engine)->add_request(ps[0], greedy, RequestOptions{});
        return id.has_value() ? std::string() : id.status().to_string();
      };
      const std::string refusal = refusal_of(two);
      if (!refusal.empty()) {
        const std::string on_one = refusal_of(one);
        std::printf("[tp matrix] %-34s refused at TP = 2%s: %.200s\n", tag.c_str(),
                    on_one.empty() ? "" : " (and on one GPU)", refusal.c_str());
        // Only the split may be refused here: what one GPU runs, TP = 2 runs or says why not.
        if (on_one.empty()) {
          EXPECT_NE(refusal.find("tensor parallelism"), std::string::npos) << tag << ": " << refusal;
        }
        ++refused;
        continue;
      }
      std::printf("[tp matrix] %-34s runs at TP = 2\n", tag.c_str());
      compare_with_cpu(one, two, ps, 96, tag.c_str(), /*near_ties=*/false);
      ++ran;
    }
  }
  std::printf("[tp matrix] %d configurations ran at TP = 2, %d refused\n", ran, refused);
  EXPECT_GE(ran, 8);
}

TEST(EngineTensorParallelConfig, BadSplitsAreRefusedBeforeAllocation) {
  auto config = load_model_config(cuda::testing::shared_dir() + "/models/origami-tiny-qwen3");
  ASSERT_TRUE(config.has_value());
  EXPECT_TRUE(cuda::CudaBackend::check_tensor_parallel(*config, 1).is_ok());
  EXPECT_TRUE(cuda::CudaBackend::check_tensor_parallel(*config, 2).is_ok());
  const Status three = cuda::CudaBackend::check_tensor_parallel(*config, 3);
  EXPECT_NE(three.to_string().find("do not split evenly"), std::string::npos) << three.to_string();
  const Status eight = cuda::CudaBackend::check_tensor_parallel(*config, 8);
  EXPECT_NE(eight.to_string().find("more ranks than"), std::string::npos) << eight.to_string();
  // More ranks than GPUs.
  EngineConfig c = tiny_config(gpu_count() + 1);
  auto engine = Engine::create(c);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().to_string().find("GPUs"), std::string::npos) << engine.status().to_string();
  // The CPU backend does not split.
  c = tiny_config(2);
  c.device = "cpu";
  engine = Engine::create(c);
  ASSERT_FALSE(engine.has_value());
  EXPECT_NE(engine.status().to_string().find("--device cuda"), std::string::npos) << engine.status().to_string();
}

}  // namespace
}  // namespace origami
