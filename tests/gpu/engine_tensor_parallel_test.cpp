// Tensor parallelism (backend/cuda/tensor_parallel_backend.h) on origami-tiny-qwen3 (4 KV heads,
// 8 query heads): TP = 2 against TP = 1 on the same engine path. Greedy outputs of full KV and of
// zipage (every rank compressing its own heads with the same jobs) must equal TP = 1's, and the
// perplexity of forced tokens (LM-head logits gathered over the vocabulary shards) must agree
// within bf16 noise. The bad configurations are refused before anything is allocated.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "cuda_test_util.h"
#include "engine_run_util.h"
#include "engine/engine.h"
#include "model/config.h"

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

TEST_F(EngineTensorParallel, GreedyFullKvEqualsOneGpu) {
  const auto ps = prompts(8, 8192);
  const RunResult one = run(tiny_config(1), ps, 48);
  const RunResult two = run(tiny_config(2), ps, 48);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(two.tokens[i], one.tokens[i]) << "prompt " << i;
}

TEST_F(EngineTensorParallel, GreedyEagerEqualsGraphs) {
  const auto ps = prompts(4, 8192);
  EngineConfig eager = tiny_config(2);
  eager.enable_cuda_graphs = false;
  EXPECT_EQ(run(eager, ps, 32).tokens, run(tiny_config(2), ps, 32).tokens);
}

TEST_F(EngineTensorParallel, ZipageCompressesEveryRankLikeOneGpu) {
  const auto ps = prompts(6, 8192);
  EngineConfig one = tiny_config(1), two = tiny_config(2);
  for (EngineConfig* c : {&one, &two}) {
    c->kv_policy = "zipage";
    c->kv_budget = 128;
  }
  const RunResult a = run(one, ps, 200);
  const RunResult b = run(two, ps, 200);
  EXPECT_GT(b.compressions, 0);
  EXPECT_EQ(b.compressions, a.compressions);
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(b.tokens[i], a.tokens[i]) << "prompt " << i;
}

TEST_F(EngineTensorParallel, ForcedLogprobsAgreeWithinBf16Noise) {
  const auto ps = prompts(4, 8192);
  const auto forced = prompts(4, 8192);
  const RunResult one = run(tiny_config(1), ps, 64, &forced);
  const RunResult two = run(tiny_config(2), ps, 64, &forced);
  double max_diff = 0.0;
  for (size_t i = 0; i < ps.size(); ++i) {
    ASSERT_EQ(two.forced_logprobs[i].size(), one.forced_logprobs[i].size());
    for (size_t j = 0; j < one.forced_logprobs[i].size(); ++j)
      max_diff = std::max(max_diff, std::fabs(static_cast<double>(two.forced_logprobs[i][j] - one.forced_logprobs[i][j])));
  }
  std::printf("[tp] max |log p(TP=2) - log p(TP=1)| over forced tokens: %.4f\n", max_diff);
  EXPECT_LT(max_diff, 0.1);
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
