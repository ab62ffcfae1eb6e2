// The cost of Fast KVzip's gates on the CUDA backend at a real model shape (Qwen3-8B by default),
// dummy weights and random gates of the model's shape (gates::init_gates, as `--kv-gates random`).
// Runs only with ORIGAMI_CUDA_BENCH=1 (scripts/gpu_run.sh gates). Lines start with GATE:
//   - the gates alone: every layer's DeviceSinkGates::enqueue (projection GEMM + score kernel) at
//     N tokens, captured in one graph, median replay time (CUDA events);
//   - whole steps through Backend::execute on one backend, first without gates, then with them
//     (compression configured with global scores both times, so only the gate differs): decode
//     steps of `batch` sequences at `context` entries (CUDA graphs; median host time per step,
//     which ends with the sampled tokens' copy) and the prefill of one chunk of P tokens (eager).
// Environment: ORIGAMI_BENCH_CONFIG (configs/ folder name, default qwen3-8b).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/sink_gate.h"
#include "cuda_test_util.h"
#include "bench_util.h"
#include "gates/gate_weights.h"
#include "model/config.h"

namespace origami::cuda {
namespace {

constexpr int kBlockSize = 16;
constexpr int kContext = 1024;
const int kBatches[] = {1, 64, 256};
const int kPrefills[] = {2048, 8192};

// Median host time (ms) of `reps` calls of `step` after `warmup` (each call ends synchronized).
template <typename F>
double median_step_ms(int warmup, int reps, F&& step) {
  for (int i = 0; i < warmup; ++i) step(i);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step(warmup + i);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct StepTimes {
  std::vector<double> decode, prefill;  // per kBatches, per kPrefills
};

// Decode steps at kContext for every batch, then the prefill chunks, on pages 1.. of the pool
// (sequence s owns pages_per_seq of them; the prefill reuses the first ones).
StepTimes time_steps(Backend& backend, const ModelConfig& c, int pages_per_seq) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  StepTimes out;
  for (int batch : kBatches) {
    std::vector<std::vector<BlockId>> tables(batch);
    for (int s = 0; s < batch; ++s)
      for (int p = 0; p < pages_per_seq; ++p) tables[s].push_back(1 + s * pages_per_seq + p);
    out.decode.push_back(median_step_ms(3, 20, [&](int i) {
      const ForwardBatch fb = testing::decode_step_batch(tables, kContext + i % 16, c.vocab_size, &greedy);
      StepOutput so;
      const Status st = backend.execute(fb, &so);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }));
  }
  for (int tokens : kPrefills) {
    std::vector<BlockId> table;
    for (int p = 0; p < (tokens + kBlockSize - 1) / kBlockSize; ++p) table.push_back(1 + p);
    out.prefill.push_back(median_step_ms(2, 5, [&](int) {
      ForwardBatch fb;
      SequenceInput in;
      in.num_query_tokens = tokens;
      in.block_table = &table;
      in.sampling = &greedy;
      for (int t = 0; t < tokens; ++t) {
        fb.token_ids.push_back((t * 17) % c.vocab_size);
        fb.positions.push_back(t);
      }
      fb.sequences.push_back(in);
      StepOutput so;
      const Status st = backend.execute(fb, &so);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }));
  }
  return out;
}

TEST(CudaGateBench, GateCostAtModelShape) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  const std::string cfg_name = testing::bench_config_name();
  auto config = load_model_config(testing::shared_dir() + "/configs/" + cfg_name);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const ModelConfig& c = *config;
  const gates::GateWeights gates = gates::init_gates(gates::gate_shape_for(c), 9);
  const gates::GateShape& gs = gates.shape;
  std::printf("GATE %s: %d layers, H %d, G %d, D %d, D' %d, %d sinks: %d projection outputs per token and layer\n",
              cfg_name.c_str(), gs.num_layers, gs.num_kv_heads, gs.group_size, gs.hidden_size, gs.rank,
              gs.num_sinks, gs.q_rows() + gs.k_rows());

  // The gates alone.
  {
    cudaStream_t stream;
    ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DeviceSinkGates dev;
    ASSERT_TRUE(dev.load(gates).is_ok());
    const int max_tokens = *std::max_element(std::begin(kPrefills), std::end(kPrefills));
    ASSERT_TRUE(dev.reserve(max_tokens).is_ok());
    Gemm gemm;
    gemm.set_stream(stream);
    testing::DeviceBuffer<__nv_bfloat16> hidden(static_cast<size_t>(max_tokens) * c.hidden_size);
    testing::DeviceBuffer<float> scores(static_cast<size_t>(max_tokens) * c.num_kv_heads);
    launch_fill_random_bf16(hidden.get(), static_cast<size_t>(max_tokens) * c.hidden_size, 1.0f, 0.0f, 5, stream);
    for (int n : {1, 64, 256, 2048, 8192}) {
      GateScoreDestination dst;
      dst.token_scores = scores.get();
      const float ms = testing::graph_ms(stream, 20, [&] {
        for (int l = 0; l < c.num_layers; ++l) dev.enqueue(l, hidden.get(), n, dst, gemm, stream);
      });
      std::printf("GATE alone tokens=%d: %.3f ms for %d layers (%.1f us per layer)\n", n, ms, c.num_layers,
                  1e3 * ms / c.num_layers);
    }
    ORIGAMI_CUDA_CHECK(cudaStreamDestroy(stream));
  }

  // Whole steps without, then with the gates.
  BackendOptions opt;
  opt.enable_cuda_graphs = true;
  auto backend = std::move(create_cuda_backend(opt)).value();
  ASSERT_TRUE(backend->load_dummy(c, 7).is_ok());
  const int max_batch = *std::max_element(std::begin(kBatches), std::end(kBatches));
  const int pages_per_seq = (kContext + 32) / kBlockSize + 1;
  const int num_blocks = 1 + max_batch * pages_per_seq;
  ASSERT_TRUE(backend
                  ->allocate_kv_cache(KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, kBlockSize, num_blocks,
                                                     DType::kBF16))
                  .is_ok());
  CompressionConfig cc;
  cc.global_scores = true;
  ASSERT_TRUE(backend->configure_compression(cc).is_ok());
  const StepTimes base = time_steps(*backend, c, pages_per_seq);
  const Status st = backend->load_gates(gates);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  const StepTimes gated = time_steps(*backend, c, pages_per_seq);
  for (size_t i = 0; i < base.decode.size(); ++i)
    std::printf("GATE decode batch=%d context=%d: %.3f ms/step without gates, %.3f ms with: +%.3f ms (%.1f%%)\n",
                kBatches[i], kContext, base.decode[i], gated.decode[i], gated.decode[i] - base.decode[i],
                100.0 * (gated.decode[i] - base.decode[i]) / base.decode[i]);
  for (size_t i = 0; i < base.prefill.size(); ++i)
    std::printf("GATE prefill tokens=%d: %.2f ms without gates, %.2f ms with: +%.2f ms (%.1f%%)\n", kPrefills[i],
                base.prefill[i], gated.prefill[i], gated.prefill[i] - base.prefill[i],
                100.0 * (gated.prefill[i] - base.prefill[i]) / base.prefill[i]);
}

}  // namespace
}  // namespace origami::cuda
