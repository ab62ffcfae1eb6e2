// Where tensor parallelism's outputs part from one GPU's, layer by layer (origami-tiny-qwen3,
// teacher-forced prompt of 200 tokens, 2 GPUs): every rank's partial sums of the attention output
// and MLP down projections against the same GEMM in fp32, the reduced sum each step added to the
// residual stream against the ranks' partials, and the residual stream after every layer against
// the CPU backend's fp32 forward pass (backend/layer_trace.h), for TP = 1, TP = 2 with the fused
// peer all-reduce (peer_all_reduce.h) and TP = 2 with NCCL's bf16 all-reduce.
//
// What is asserted, per element of every sublayer's reduction:
//   - the step added exactly the sum of what the ranks contributed, up to the one rounding the
//     path has: NCCL's bf16 sum rounds it (|err| <= u_bf16 |sum|), the peer kernel sums in fp32;
//     plus the fp32 rounding of the residual add itself (the trace reads the add back as
//     residual_after - residual_before). A wrong buffer, a stale partial or a race breaks it;
//   - every rank added the same values (the ranks stay bit-identical);
// and at the end, the logits of every path against the CPU within the single-GPU bound (2e-2,
// cuda_backend_e2e_test). The per-layer drift against the CPU is printed for each path: the
// table in docs/benchmarks.md ("Tensor parallelism: where TP = 2 parts from TP = 1").
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/tensor_parallel_backend.h"
#include "backend/layer_trace.h"
#include "cuda_test_util.h"
#include "model/config.h"
#include "model/weights.h"

namespace origami {
namespace {

using cuda::testing::rel_err;
using cuda::testing::teacher_forced_logits;

constexpr int kBlockSize = 16, kNumBlocks = 64;
constexpr double kBf16Unit = 1.0 / 256;      // unit roundoff of bf16 (8-bit significand)
constexpr double kF32Unit = 1.0 / 16777216;  // of fp32

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

using cuda::testing::Model;
Model load_tiny() { return cuda::testing::load_model(cuda::testing::shared_dir() + "/models/origami-tiny-qwen3"); }

// One traced path: the logits and one trace per rank.
struct Path {
  const char* name;
  std::vector<float> logits;
  std::vector<LayerTrace> ranks;
};

Path run_cuda(const Model& m, const std::vector<int32_t>& ids, int tp, BackendOptions::TensorParallelReduce reduce,
              const char* name) {
  BackendOptions opt;
  opt.device = "cuda";
  opt.tensor_parallel_size = tp;
  opt.tensor_parallel_reduce = reduce;
  auto created = create_cuda_backend(opt);
  EXPECT_TRUE(created.has_value()) << created.status().to_string();
  Path p{name, {}, std::vector<LayerTrace>(tp)};
  if (!created.has_value()) return p;
  Backend& b = **created;
  EXPECT_TRUE(b.load(m.config, m.weights).is_ok());
  const ModelConfig& c = m.config;
  EXPECT_TRUE(b.allocate_kv_cache(KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, kBlockSize, kNumBlocks,
                                                 DType::kBF16))
                  .is_ok());
  if (tp == 1) {
    dynamic_cast<cuda::CudaBackend&>(b).set_layer_trace(&p.ranks[0]);
  } else {
    auto& group = dynamic_cast<cuda::TensorParallelBackend&>(b);
    for (int r = 0; r < tp; ++r) group.rank(r).set_layer_trace(&p.ranks[r]);
  }
  p.logits = teacher_forced_logits(b, ids, kBlockSize);
  return p;
}

std::vector<double> abs_sum_of(const std::vector<LayerTrace>& ranks, int layer, int sub, bool exact) {
  std::vector<double> out(ranks[0].sublayers[layer][sub].partial.size(), 0.0);
  for (const LayerTrace& t : ranks) {
    const auto& v = exact ? t.sublayers[layer][sub].partial_exact : t.sublayers[layer][sub].partial;
    for (size_t i = 0; i < out.size(); ++i) out[i] += std::fabs(v[i]);
  }
  return out;
}

struct ReductionCheck {
  double worst_ratio = 0.0;  // largest |applied - sum of partials| / bound
  double rounding = 0.0;     // rms(applied - exact sum) / rms(exact sum), over every sublayer
};

// Every element of every sublayer: the applied delta against the sum of the ranks' partials.
ReductionCheck check_reductions(const Path& p, bool bf16_sum) {
  ReductionCheck out;
  double num = 0, den = 0;
  const LayerTrace& t0 = p.ranks[0];
  const int layers = static_cast<int>(t0.sublayers.size());
  for (int l = 0; l < layers; ++l)
    for (int s = 0; s < 2; ++s) {
      const auto& applied = t0.sublayers[l][s].applied;
      const std::vector<double> mag = abs_sum_of(p.ranks, l, s, false);
      // The residual after this sublayer (for the fp32 rounding of the add): the layer's output for
      // the MLP; for attention the residual before plus the applied delta is close enough.
      const std::vector<float>& res_after_layer = t0.residual[l];
      for (size_t i = 0; i < applied.size(); ++i) {
        double sum = 0, exact = 0;
        for (const LayerTrace& t : p.ranks) {
          sum += t.sublayers[l][s].partial[i];
          exact += t.sublayers[l][s].partial_exact[i];
        }
        const double res = std::fabs(res_after_layer[i]) + std::fabs(applied[i]) +
                           (l == 0 ? std::fabs(t0.embedded[i]) : std::fabs(p.ranks[0].residual[l - 1][i]));
        const double bound = (bf16_sum ? kBf16Unit * std::fabs(sum) : 0.0) + 4 * kF32Unit * (res + mag[i]) + 1e-30;
        out.worst_ratio = std::max(out.worst_ratio, std::fabs(applied[i] - sum) / bound);
        num += (applied[i] - exact) * (applied[i] - exact);
        den += exact * exact;
        for (size_t r = 1; r < p.ranks.size(); ++r)
          EXPECT_EQ(p.ranks[r].sublayers[l][s].applied[i], applied[i]) << p.name << " layer " << l << " rank " << r;
      }
    }
  out.rounding = std::sqrt(num / den);
  return out;
}

TEST(TensorParallelTrace, LayerByLayerAgainstFp32) {
  if (gpu_count() < 2) GTEST_SKIP() << "tensor parallelism needs 2 GPUs; " << gpu_count() << " visible";
  const Model m = load_tiny();
  const ModelConfig& c = m.config;
  std::mt19937 rng(17);
  std::vector<int32_t> ids(200);
  for (int32_t& t : ids) t = static_cast<int32_t>(1 + rng() % (c.vocab_size - 1));

  BackendOptions cpu_opt;
  CpuBackend cpu(cpu_opt);
  ASSERT_TRUE(cpu.load(m.config, m.weights).is_ok());
  ASSERT_TRUE(cpu.allocate_kv_cache(KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, kBlockSize, kNumBlocks,
                                                   DType::kF32))
                  .is_ok());
  LayerTrace cpu_trace;
  cpu.set_layer_trace(&cpu_trace);
  const std::vector<float> cpu_logits = teacher_forced_logits(cpu, ids, kBlockSize);

  using R = BackendOptions::TensorParallelReduce;
  std::vector<Path> paths;
  paths.push_back(run_cuda(m, ids, 1, R::kPeer, "TP=1"));
  paths.push_back(run_cuda(m, ids, 2, R::kPeer, "TP=2 peer"));
  paths.push_back(run_cuda(m, ids, 2, R::kNccl, "TP=2 NCCL"));
  paths.push_back(run_cuda(m, ids, 2, R::kPeerPull, "TP=2 pull"));
  for (const Path& p : paths) {
    ASSERT_EQ(p.ranks[0].residual.size(), static_cast<size_t>(c.num_layers)) << p.name;
    ASSERT_EQ(p.ranks[0].sublayers.size(), static_cast<size_t>(c.num_layers)) << p.name;
  }

  std::printf("[tp trace] residual stream after each layer, rel err against the CPU's fp32 forward:\n");
  std::printf("[tp trace] layer");
  for (const Path& p : paths) std::printf(" | %-10s", p.name);
  std::printf(" | partial rounding TP=2 (rank 0 attn / mlp)\n");
  for (int l = 0; l < c.num_layers; ++l) {
    std::printf("[tp trace] %5d", l);
    for (const Path& p : paths) std::printf(" | %.3e ", rel_err(p.ranks[0].residual[l], cpu_trace.residual[l]));
    const auto& sub = paths[1].ranks[0].sublayers[l];
    std::printf(" | %.3e / %.3e\n", rel_err(sub[0].partial, sub[0].partial_exact),
                rel_err(sub[1].partial, sub[1].partial_exact));
  }
  for (size_t k = 0; k < paths.size(); ++k) {
    const Path& p = paths[k];
    const bool bf16_sum = k == 2;  // NCCL's bf16 all-reduce; TP = 1 has nothing to sum
    const ReductionCheck r = check_reductions(p, bf16_sum);
    const double logit_err = rel_err(p.logits, cpu_logits);
    std::printf("[tp trace] %-10s: applied delta vs the ranks' partials: worst |err| / rounding bound %.3f; applied "
                "vs fp32 partials rms rel %.3e; logits rel err vs CPU %.3e\n",
                p.name, r.worst_ratio, r.rounding, logit_err);
    EXPECT_LE(r.worst_ratio, 1.0) << p.name << ": a reduction added something else than the ranks' partial sums";
    EXPECT_LT(logit_err, 2e-2) << p.name;
  }
  // The peer all-reduce's two ways of moving the partials (pushed at this step's rows, pulled) sum
  // the same values in the same order: the same logits bit for bit.
  EXPECT_EQ(paths[1].logits, paths[3].logits) << "push and pull reductions disagree";
}

}  // namespace
}  // namespace origami
