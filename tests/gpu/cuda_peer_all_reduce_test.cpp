// The fused peer all-reduce (backend/cuda/peer_all_reduce.h) on every visible GPU (skipped below
// two): both ways of moving the partials, pushed into the other ranks' memory and pulled from it,
// against the sums computed on the host in the kernel's order (residuals exact, normed rows within
// one bf16 rounding), every rank bit-identical, push and pull bit-identical, negative zeros among
// the partials (the push protocol's "not arrived" value), eager launches of changing row counts and
// CUDA graphs replayed between them (the push receive buffers' turns are counted on the device).
// ORIGAMI_CUDA_BENCH=1 adds the time of one reduction each way (PEERREDUCE lines).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/peer_all_reduce.h"
#include "bench_util.h"
#include "model/config.h"

namespace origami::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kEps = 1e-6f;

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::min(n, kPeerReduceMaxRanks);
}

// One rank: its reduction, residual stream, norm weight and output, on its own device.
struct Rank {
  int device = 0;
  PeerAllReduce reduce;
  float* residual = nullptr;
  bf16* weight = nullptr;
  bf16* out = nullptr;
  bf16* staged = nullptr;  // partials copied into reduce.partial() inside graphs
  cudaStream_t stream = nullptr;
};

class Ranks {
 public:
  // Every rank's buffers, then peer access, as TensorParallelBackend sets them up.
  Ranks(int n, int hidden, bool push, const std::vector<float>& weight) : hidden_(hidden) {
    group_.size = n;
    ranks_.resize(n);
    const size_t elems = static_cast<size_t>(PeerAllReduce::kMaxTokens) * hidden;
    std::vector<bf16> w(weight.begin(), weight.end());
    for (int r = 0; r < n; ++r) {
      ranks_[r] = std::make_unique<Rank>();
      Rank& k = *ranks_[r];
      k.device = r;
      ORIGAMI_CUDA_CHECK(cudaSetDevice(r));
      const Status st = k.reduce.init(&group_, r, hidden, push);
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      ORIGAMI_CUDA_CHECK(cudaMalloc(&k.residual, elems * sizeof(float)));
      ORIGAMI_CUDA_CHECK(cudaMalloc(&k.weight, hidden * sizeof(bf16)));
      ORIGAMI_CUDA_CHECK(cudaMalloc(&k.out, elems * sizeof(bf16)));
      ORIGAMI_CUDA_CHECK(cudaMalloc(&k.staged, 4 * elems * sizeof(bf16)));
      ORIGAMI_CUDA_CHECK(cudaMemcpy(k.weight, w.data(), hidden * sizeof(bf16), cudaMemcpyHostToDevice));
      ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&k.stream, cudaStreamNonBlocking));
    }
    for (int r = 0; r < n; ++r) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(r));
      const Status st = ranks_[r]->reduce.connect();
      EXPECT_TRUE(st.is_ok()) << st.to_string();
    }
  }
  ~Ranks() {
    for (auto& k : ranks_) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(k->device));
      ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(k->stream));
      for (void* p : {static_cast<void*>(k->residual), static_cast<void*>(k->weight), static_cast<void*>(k->out),
                      static_cast<void*>(k->staged)})
        cudaFree(p);
      cudaStreamDestroy(k->stream);
      k.reset();  // the reduction's buffers freed on their device
    }
  }
  int size() const { return static_cast<int>(ranks_.size()); }
  Rank& operator[](int r) { return *ranks_[r]; }
  int hidden() const { return hidden_; }

  void set_residual(const std::vector<float>& residual) {
    for (auto& k : ranks_) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(k->device));
      ORIGAMI_CUDA_CHECK(cudaMemcpy(k->residual, residual.data(), residual.size() * sizeof(float), cudaMemcpyHostToDevice));
    }
  }
  // One reduction on every rank (launched from this thread: a rank's kernel waits on the others',
  // which are queued right after it).
  void reduce(int rows) {
    for (auto& k : ranks_) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(k->device));
      k->reduce.reduce_add_rmsnorm(k->residual, k->weight, kEps, rows, k->out, k->stream);
    }
  }
  void synchronize() {
    for (auto& k : ranks_) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice(k->device));
      ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(k->stream));
    }
  }
  std::vector<float> residual(int r, int rows) {
    std::vector<float> v(static_cast<size_t>(rows) * hidden_);
    ORIGAMI_CUDA_CHECK(cudaSetDevice(ranks_[r]->device));
    ORIGAMI_CUDA_CHECK(cudaMemcpy(v.data(), ranks_[r]->residual, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<uint16_t> out(int r, int rows) {
    std::vector<uint16_t> v(static_cast<size_t>(rows) * hidden_);
    ORIGAMI_CUDA_CHECK(cudaSetDevice(ranks_[r]->device));
    ORIGAMI_CUDA_CHECK(cudaMemcpy(v.data(), ranks_[r]->out, v.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  int hidden_;
  PeerReduceGroup group_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

float bf16_value(uint16_t bits) {
  const uint32_t w = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &w, sizeof f);
  return f;
}
uint16_t bf16_bits(float f) {
  const bf16 b = __float2bfloat16(f);
  uint16_t bits;
  std::memcpy(&bits, &b, sizeof bits);
  return bits;
}

// Partials of `size` ranks for `rows` rows: bf16 values, one in 16 a negative zero.
std::vector<std::vector<uint16_t>> random_partials(int size, int rows, int hidden, std::mt19937& rng) {
  std::normal_distribution<float> value(0.0f, 0.5f);
  std::vector<std::vector<uint16_t>> p(size, std::vector<uint16_t>(static_cast<size_t>(rows) * hidden));
  for (auto& rank : p)
    for (uint16_t& v : rank) v = rng() % 16 == 0 ? uint16_t{0x8000} : bf16_bits(value(rng));
  return p;
}

// The kernel's arithmetic on the host: residual += (sum over ranks in rank order); the normed
// rows returned in fp32 (compared within one bf16 rounding: the device's rsqrtf is approximate).
std::vector<float> host_reduce(std::vector<float>* residual, const std::vector<std::vector<uint16_t>>& partials,
                               const std::vector<float>& weight, int rows, int hidden) {
  std::vector<float> normed(static_cast<size_t>(rows) * hidden);
  for (int t = 0; t < rows; ++t) {
    double sum_sq = 0.0;
    for (int i = 0; i < hidden; ++i) {
      const size_t at = static_cast<size_t>(t) * hidden + i;
      float s = 0.0f;
      for (const auto& p : partials) s += bf16_value(p[at]);
      (*residual)[at] += s;
      sum_sq += static_cast<double>((*residual)[at]) * (*residual)[at];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / hidden + kEps);
    for (int i = 0; i < hidden; ++i) {
      const size_t at = static_cast<size_t>(t) * hidden + i;
      normed[at] = static_cast<float>((*residual)[at] * inv_rms * weight[i]);
    }
  }
  return normed;
}

void upload_partials(Ranks& ranks, const std::vector<std::vector<uint16_t>>& partials, bf16* const* dst) {
  for (int r = 0; r < ranks.size(); ++r) {
    ORIGAMI_CUDA_CHECK(cudaSetDevice(ranks[r].device));
    ORIGAMI_CUDA_CHECK(cudaMemcpy(dst[r], partials[r].data(), partials[r].size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  }
}

// Every rank's residual equals the host's bit for bit, its normed rows within one bf16 rounding
// of the host's, and every rank's output equals rank 0's. Returns rank 0's output.
std::vector<uint16_t> expect_reduced(Ranks& ranks, const std::vector<float>& residual, const std::vector<float>& normed,
                                     int rows, const char* what) {
  const std::vector<uint16_t> out0 = ranks.out(0, rows);
  for (int r = 0; r < ranks.size(); ++r) {
    const std::vector<float> res = ranks.residual(r, rows);
    size_t residual_diff = 0;
    for (size_t i = 0; i < res.size(); ++i) residual_diff += res[i] != residual[i];
    EXPECT_EQ(residual_diff, 0u) << what << ": rank " << r << ", " << rows << " rows: residual entries off the host's sums";
    if (r > 0) {
      EXPECT_EQ(ranks.out(r, rows), out0) << what << ": rank " << r << " differs from rank 0";
    }
  }
  size_t off = 0;
  for (size_t i = 0; i < out0.size(); ++i) {
    const float got = bf16_value(out0[i]), want = normed[i];
    // One bf16 rounding (2^-8 relative) plus the approximate rsqrt.
    if (std::fabs(got - want) > std::fabs(want) * (1.0f / 128) + 1e-6f) ++off;
  }
  EXPECT_EQ(off, 0u) << what << ": " << rows << " rows: normed values beyond one bf16 rounding of the host's";
  return out0;
}

// One graph per rank of what `record(rank)` enqueues on the rank's stream.
template <typename Record>
std::vector<cudaGraphExec_t> capture_per_rank(Ranks& ranks, Record record) {
  std::vector<cudaGraphExec_t> graphs(ranks.size());
  for (int r = 0; r < ranks.size(); ++r) {
    Rank& k = ranks[r];
    ORIGAMI_CUDA_CHECK(cudaSetDevice(k.device));
    cudaGraph_t graph;
    ORIGAMI_CUDA_CHECK(cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal));
    record(k);
    ORIGAMI_CUDA_CHECK(cudaStreamEndCapture(k.stream, &graph));
    ORIGAMI_CUDA_CHECK(cudaGraphInstantiate(&graphs[r], graph, 0));
    ORIGAMI_CUDA_CHECK(cudaGraphDestroy(graph));
  }
  return graphs;
}

void launch_per_rank(Ranks& ranks, const std::vector<cudaGraphExec_t>& graphs) {
  for (int r = 0; r < ranks.size(); ++r) {
    ORIGAMI_CUDA_CHECK(cudaSetDevice(ranks[r].device));
    ORIGAMI_CUDA_CHECK(cudaGraphLaunch(graphs[r], ranks[r].stream));
  }
}

void destroy_per_rank(Ranks& ranks, const std::vector<cudaGraphExec_t>& graphs) {
  for (int r = 0; r < ranks.size(); ++r) {
    ORIGAMI_CUDA_CHECK(cudaSetDevice(ranks[r].device));
    ORIGAMI_CUDA_CHECK(cudaGraphExecDestroy(graphs[r]));
  }
}

std::vector<float> random_weight(int hidden, std::mt19937& rng) {
  std::uniform_real_distribution<float> w(0.5f, 1.5f);
  std::vector<float> weight(hidden);
  for (float& v : weight) v = __bfloat162float(__float2bfloat16(w(rng)));
  return weight;
}

// Row counts on both sides of kPushMaxTokens, in an order that changes the grid between launches.
const int kRowSteps[] = {1, 3, 64, 256, 512, 7, 700, 2048, 5, 512, 130};

TEST(PeerAllReduce, PushAndPullMatchTheHostSums) {
  const int n = visible_gpus();
  if (n < 2 || !PeerAllReduce::peers_reachable(n)) GTEST_SKIP() << "needs 2 GPUs with peer access";
  constexpr int kHidden = 1024;
  std::mt19937 rng(11);
  const std::vector<float> weight = random_weight(kHidden, rng);
  const size_t elems = static_cast<size_t>(PeerAllReduce::kMaxTokens) * kHidden;
  std::vector<float> start(elems);
  std::normal_distribution<float> value(0.0f, 1.0f);
  for (float& v : start) v = value(rng);
  Ranks push(n, kHidden, true, weight), pull(n, kHidden, false, weight);
  std::vector<float> host = start;
  push.set_residual(start);
  pull.set_residual(start);
  for (int rows : kRowSteps) {
    const auto partials = random_partials(n, rows, kHidden, rng);
    std::vector<bf16*> push_dst(n), pull_dst(n);
    for (int r = 0; r < n; ++r) push_dst[r] = push[r].reduce.partial(), pull_dst[r] = pull[r].reduce.partial();
    upload_partials(push, partials, push_dst.data());
    upload_partials(pull, partials, pull_dst.data());
    EXPECT_EQ(push[0].reduce.pushes(rows), rows <= PeerAllReduce::kPushMaxTokens);
    EXPECT_FALSE(pull[0].reduce.pushes(rows));
    push.reduce(rows);
    pull.reduce(rows);
    push.synchronize();
    pull.synchronize();
    const std::vector<float> normed = host_reduce(&host, partials, weight, rows, kHidden);
    const auto pushed = expect_reduced(push, host, normed, rows, "push");
    const auto pulled = expect_reduced(pull, host, normed, rows, "pull");
    EXPECT_EQ(pushed, pulled) << rows << " rows: push and pull differ";
  }
}

// A graph of four reductions (the partials copied in from a staging area, as the GEMM writes them
// in a decode step's graph) replayed three times with eager reductions between the replays.
TEST(PeerAllReduce, GraphReplaysBetweenEagerReductions) {
  const int n = visible_gpus();
  if (n < 2 || !PeerAllReduce::peers_reachable(n)) GTEST_SKIP() << "needs 2 GPUs with peer access";
  constexpr int kHidden = 2048;
  const int graph_rows[] = {64, 7, 512, 256};
  std::mt19937 rng(5);
  const std::vector<float> weight = random_weight(kHidden, rng);
  std::vector<float> host(static_cast<size_t>(PeerAllReduce::kMaxTokens) * kHidden, 0.25f);
  Ranks ranks(n, kHidden, true, weight);
  ranks.set_residual(host);
  const std::vector<cudaGraphExec_t> graphs = capture_per_rank(ranks, [&](Rank& k) {
    for (int i = 0; i < 4; ++i) {
      const size_t bytes = static_cast<size_t>(graph_rows[i]) * kHidden * sizeof(bf16);
      ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(k.reduce.partial(), k.staged + i * PeerAllReduce::kPushMaxTokens * kHidden,
                                         bytes, cudaMemcpyDeviceToDevice, k.stream));
      k.reduce.reduce_add_rmsnorm(k.residual, k.weight, kEps, graph_rows[i], k.out, k.stream);
    }
  });
  for (int replay = 0; replay < 3; ++replay) {
    // One eager reduction (an odd count shifts the turns the graph's launches find).
    const int eager_rows = 33 + replay;
    const auto eager = random_partials(n, eager_rows, kHidden, rng);
    std::vector<bf16*> dst(n);
    for (int r = 0; r < n; ++r) dst[r] = ranks[r].reduce.partial();
    upload_partials(ranks, eager, dst.data());
    ranks.reduce(eager_rows);
    ranks.synchronize();
    std::vector<float> normed = host_reduce(&host, eager, weight, eager_rows, kHidden);
    expect_reduced(ranks, host, normed, eager_rows, "eager");

    std::vector<std::vector<std::vector<uint16_t>>> staged(4);
    for (int i = 0; i < 4; ++i) {
      staged[i] = random_partials(n, graph_rows[i], kHidden, rng);
      for (int r = 0; r < n; ++r) dst[r] = ranks[r].staged + i * PeerAllReduce::kPushMaxTokens * kHidden;
      upload_partials(ranks, staged[i], dst.data());
    }
    launch_per_rank(ranks, graphs);
    ranks.synchronize();
    for (int i = 0; i < 4; ++i) normed = host_reduce(&host, staged[i], weight, graph_rows[i], kHidden);
    // The last reduction's output, and every row's residual after all four.
    expect_reduced(ranks, host, normed, graph_rows[3], "graph");
    for (int r = 0; r < n; ++r) {
      const std::vector<float> res = ranks.residual(r, 512);
      EXPECT_TRUE(std::equal(res.begin(), res.end(), host.begin())) << "graph replay " << replay << ", rank " << r;
    }
  }
  destroy_per_rank(ranks, graphs);
}

// ORIGAMI_CUDA_BENCH=1: one reduction's time each way at decode's row counts, in graphs of 72
// (a Qwen3-8B step's count), on the bench config's hidden size; beside it the local residual add
// + norm alone (what the step without reductions runs) and the link's floor (the bytes each rank
// receives at the measured peer copy bandwidth).
TEST(PeerAllReduce, Bench) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  const int n = visible_gpus();
  if (n < 2 || !PeerAllReduce::peers_reachable(n)) GTEST_SKIP() << "needs 2 GPUs with peer access";
  auto config = load_model_config(testing::shared_dir() + "/configs/" + testing::bench_config_name());
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const int hidden = config->hidden_size;
  std::mt19937 rng(3);
  const std::vector<float> weight = random_weight(hidden, rng);
  Ranks push(n, hidden, true, weight), pull(n, hidden, false, weight);
  const std::vector<float> residual(static_cast<size_t>(PeerAllReduce::kMaxTokens) * hidden, 0.5f);
  push.set_residual(residual);
  pull.set_residual(residual);
  for (Ranks* rk : {&push, &pull})
    for (int r = 0; r < n; ++r) {
      ORIGAMI_CUDA_CHECK(cudaSetDevice((*rk)[r].device));
      ORIGAMI_CUDA_CHECK(cudaMemset((*rk)[r].reduce.partial(), 0, static_cast<size_t>(PeerAllReduce::kMaxTokens) * hidden * 2));
    }
  // Peer copy bandwidth: rank 1 -> rank 0, 64 MiB.
  double link_gbps = 0.0;
  {
    const size_t bytes = 64u << 20;
    void *src, *dst;
    ORIGAMI_CUDA_CHECK(cudaSetDevice(1));
    ORIGAMI_CUDA_CHECK(cudaMalloc(&src, bytes));
    ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
    ORIGAMI_CUDA_CHECK(cudaMalloc(&dst, bytes));
    cudaEvent_t a, b;
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&a));
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&b));
    ORIGAMI_CUDA_CHECK(cudaMemcpyPeer(dst, 0, src, 1, bytes));
    ORIGAMI_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < 10; ++i) ORIGAMI_CUDA_CHECK(cudaMemcpyPeerAsync(dst, 0, src, 1, bytes));
    ORIGAMI_CUDA_CHECK(cudaEventRecord(b));
    ORIGAMI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ORIGAMI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    link_gbps = 10.0 * bytes / (ms * 1e6);
    cudaFree(dst);
    ORIGAMI_CUDA_CHECK(cudaSetDevice(1));
    cudaFree(src);
    ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
  }
  std::printf("PEERREDUCE %d GPUs, hidden %d, peer copy %.0f GB/s; us per reduction in graphs of 72\n", n, hidden,
              link_gbps);
  constexpr int kLaunches = 72, kReplays = 20;
  auto time_graph = [&](Ranks& ranks, int rows, bool local_norm_only) {
    const std::vector<cudaGraphExec_t> graphs = capture_per_rank(ranks, [&](Rank& k) {
      for (int i = 0; i < kLaunches; ++i) {
        if (local_norm_only) {
          launch_add_rmsnorm(k.residual, k.reduce.partial(), k.weight, kEps, rows, hidden, k.out, k.stream);
        } else {
          k.reduce.reduce_add_rmsnorm(k.residual, k.weight, kEps, rows, k.out, k.stream);
        }
      }
    });
    cudaEvent_t a, b;
    ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&a));
    ORIGAMI_CUDA_CHECK(cudaEventCreate(&b));
    float best = 1e30f;
    for (int rep = 0; rep < kReplays; ++rep) {
      ranks.synchronize();
      ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
      ORIGAMI_CUDA_CHECK(cudaEventRecord(a, ranks[0].stream));
      launch_per_rank(ranks, graphs);
      ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
      ORIGAMI_CUDA_CHECK(cudaEventRecord(b, ranks[0].stream));
      ranks.synchronize();
      float ms = 0;
      ORIGAMI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
      if (rep > 0) best = std::min(best, ms);
    }
    destroy_per_rank(ranks, graphs);
    ORIGAMI_CUDA_CHECK(cudaSetDevice(0));
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1e3 * best / kLaunches;
  };
  for (int rows : {1, 16, 64, 128, 256, 384, 512}) {
    const double us_push = time_graph(push, rows, false);
    const double us_pull = time_graph(pull, rows, false);
    const double us_local = time_graph(push, rows, true);
    const double floor_us = static_cast<double>(rows) * hidden * 2 * (n - 1) / (link_gbps * 1e3);
    std::printf("PEERREDUCE rows=%d: push %.2f us, pull %.2f us (push %.2fx faster), local add+norm alone %.2f us; "
                "reduction's extra: push %.2f, pull %.2f us; link floor %.2f us\n",
                rows, us_push, us_pull, us_pull / us_push, us_local, us_push - us_local, us_pull - us_local, floor_us);
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace origami::cuda
