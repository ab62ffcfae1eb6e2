// Decode-step timing of the CUDA backend on a real model shape with device-generated dummy
// weights, with and without CUDA graphs. Runs only with ORIGAMI_CUDA_BENCH=1 (scripts/gpu_run.sh
// sets it); prints ms per step, tokens/s and the weight bandwidth achieved.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "cuda_test_util.h"
#include "model/config.h"

namespace origami::cuda {
namespace {

TEST(CudaDecodeBench, DummyWeightsDecodeSteps) {
  const char* on = std::getenv("ORIGAMI_CUDA_BENCH");
  if (on == nullptr || std::string(on) != "1") GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  const char* cfg_env = std::getenv("ORIGAMI_BENCH_CONFIG");
  const std::string cfg_name = cfg_env != nullptr ? cfg_env : "qwen3-8b";
  auto config = load_model_config(testing::shared_dir() + "/configs/" + cfg_name);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const ModelConfig& c = *config;
  const int context = 1024, block_size = 16;
  for (bool graphs : {true, false}) {
    BackendOptions opt;
    opt.enable_cuda_graphs = graphs;
    auto backend = std::move(create_cuda_backend(opt)).value();
    ASSERT_TRUE(backend->load_dummy(c, 7).is_ok());
    for (int batch_size : {1, 16, 64, 256}) {
      const int pages_per_seq = (context + 64) / block_size + 1;
      const int num_blocks = 1 + batch_size * pages_per_seq;
      ASSERT_TRUE(backend
                      ->allocate_kv_cache(KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, block_size, num_blocks,
                                                         DType::kBF16))
                      .is_ok());
      std::vector<std::vector<BlockId>> tables(batch_size);
      for (int s = 0; s < batch_size; ++s)
        for (int p = 0; p < pages_per_seq; ++p) tables[s].push_back(1 + s * pages_per_seq + p);
      SamplingParams greedy;
      greedy.temperature = 0.0f;
      auto step = [&](int pos) {
        ForwardBatch batch;
        for (int s = 0; s < batch_size; ++s) {
          SequenceInput in;
          in.query_start = s;
          in.num_query_tokens = 1;
          in.start_position = pos;
          in.num_cached_entries = pos;
          in.block_table = &tables[s];
          in.sampling = &greedy;
          batch.token_ids.push_back((s * 31 + pos) % c.vocab_size);
          batch.positions.push_back(pos);
          batch.sequences.push_back(in);
        }
        StepOutput out;
        ASSERT_TRUE(backend->execute(batch, &out).is_ok());
      };
      for (int i = 0; i < 3; ++i) step(context + i);  // capture + warm up
      const int steps = 30;
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) step(context + 3 + i);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
      const double weight_gb = 2.0 * static_cast<double>(c.num_parameters()) / 1e9;
      std::printf("BENCH %s graphs=%d batch=%d context=%d: %.3f ms/step, %.0f tok/s, weights %.0f GB/s\n",
                  cfg_name.c_str(), graphs, batch_size, context, ms, batch_size * 1000.0 / ms, weight_gb / ms * 1000.0);
    }
  }
}

}  // namespace
}  // namespace origami::cuda
