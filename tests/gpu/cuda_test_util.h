#pragma once
// Helpers of the CUDA tests: device buffers, bf16 rounding, relative errors, the shared dir.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/cuda_check.h"
#include "model/config.h"
#include "model/weights.h"
#include "core/dtype.h"

namespace origami::cuda::testing {

// The shared models/goldens folder: $ORIGAMI_SHARED_DIR (the device machine gets a copy inside
// the repository), else the path fixed at configure time.
inline std::string shared_dir() {
  if (const char* env = std::getenv("ORIGAMI_SHARED_DIR"); env != nullptr && env[0] != '\0') return env;
  return ORIGAMI_SHARED_DIR;
}

// A model's config and weights, loaded from `dir` (a failure fails the test).
struct Model {
  ModelConfig config;
  ModelWeights weights;
};
inline Model load_model(const std::string& dir) {
  Model m;
  auto config = load_model_config(dir);
  EXPECT_TRUE(config.has_value()) << config.status().to_string();
  if (config.has_value()) m.config = *config;
  auto weights = load_model_weights(dir, m.config);
  EXPECT_TRUE(weights.has_value()) << weights.status().to_string();
  if (weights.has_value()) m.weights = std::move(weights).value();
  return m;
}

// A CUDA backend made with `opt`, the model loaded and `layout`'s KV cache allocated; a failure
// fails the test (null when the backend cannot be made).
inline std::unique_ptr<Backend> make_cuda_backend(const Model& m, const BackendOptions& opt, const KVLayout& layout) {
  auto r = create_cuda_backend(opt);
  EXPECT_TRUE(r.has_value()) << r.status().to_string();
  if (!r.has_value()) return nullptr;
  std::unique_ptr<Backend> b = std::move(r).value();
  Status st = b->load(m.config, m.weights);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  st = b->allocate_kv_cache(layout);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return b;
}

// Adds one sequence to a step's `batch`: `in`, with its query start and new-token count set here,
// and its `count` new tokens at positions in.start_position on.
inline void append_sequence(ForwardBatch& batch, SequenceInput in, const int32_t* tokens, int count) {
  in.query_start = static_cast<int>(batch.token_ids.size());
  in.num_query_tokens = count;
  for (int j = 0; j < count; ++j) {
    batch.token_ids.push_back(tokens[j]);
    batch.positions.push_back(in.start_position + j);
  }
  batch.sequences.push_back(in);
}

// Sizes a test sweeps: `full` normally, `small` when ORIGAMI_GPU_TEST_SIZES=small. The
// compute-sanitizer tools (racecheck above all) run kernels 100-1000x slower; the small set keeps
// every code path (one block and several, one tile and several) at sizes they finish.
inline bool small_test_sizes() {
  const char* env = std::getenv("ORIGAMI_GPU_TEST_SIZES");
  return env != nullptr && std::string(env) == "small";
}
inline std::vector<int> test_sizes(std::initializer_list<int> full, std::initializer_list<int> small) {
  return small_test_sizes() ? std::vector<int>(small) : std::vector<int>(full);
}

// Median over `iters` runs of `body`, timed with events on `stream` (ms).
template <typename F>
float median_ms(cudaStream_t stream, int iters, F&& body) {
  cudaEvent_t a, b;
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&a));
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    ORIGAMI_CUDA_CHECK(cudaEventRecord(a, stream));
    body(i);
    ORIGAMI_CUDA_CHECK(cudaEventRecord(b, stream));
    ORIGAMI_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    ORIGAMI_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Captures `record` (work on `stream`) once and returns the median replay time (ms).
template <typename F>
float graph_ms(cudaStream_t stream, int iters, F&& record) {
  cudaGraph_t graph;
  ORIGAMI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  record();
  ORIGAMI_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  ORIGAMI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) ORIGAMI_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  const float ms = median_ms(stream, iters, [&](int) { ORIGAMI_CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return ms;
}

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t n) : n_(n) { ORIGAMI_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& host) {
    ORIGAMI_CUDA_CHECK(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
    ORIGAMI_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fills with a NaN pattern so that unwritten outputs fail the comparison.
  void poison() { ORIGAMI_CUDA_CHECK(cudaMemset(p_, 0xff, std::max<size_t>(n_, 1) * sizeof(T))); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Random values already rounded to bf16 (so the CPU twin sees exactly the GPU's inputs).
inline std::vector<float> random_bf16_values(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(dist(rng)));
  return v;
}

inline std::vector<__nv_bfloat16> to_device_bf16(const std::vector<float>& v) {
  std::vector<__nv_bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t bits = f32_to_bf16(v[i]);
    std::memcpy(static_cast<void*>(&out[i]), &bits, 2);
  }
  return out;
}

inline std::vector<float> from_device_bf16(const std::vector<__nv_bfloat16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, &v[i], 2);
    out[i] = bf16_to_f32(bits);
  }
  return out;
}

// ||a - b|| / ||b||; NaN anywhere gives +inf.
inline double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

// Every position's logits from one prefill (LogitsMode::kAll) of `ids` on a backend whose KV cache
// is allocated with pages of `block_size` (page p of the sequence in block p + 1): the reference
// the CUDA tests compare backends by.
inline std::vector<float> teacher_forced_logits(Backend& backend, const std::vector<int32_t>& ids, int block_size) {
  std::vector<BlockId> blocks;
  for (int i = 0; i < (static_cast<int>(ids.size()) + block_size - 1) / block_size; ++i) blocks.push_back(1 + i);
  ForwardBatch batch;
  batch.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) batch.positions.push_back(static_cast<int32_t>(i));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SequenceInput in;
  in.num_query_tokens = static_cast<int>(ids.size());
  in.block_table = &blocks;
  in.logits_mode = LogitsMode::kAll;
  in.sampling = &greedy;
  batch.sequences.push_back(in);
  StepOutput out;
  const Status st = backend.execute(batch, &out);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out.all_logits.empty() ? std::vector<float>{} : out.all_logits[0];
}

// One of the CUDA backend's step counters (e.g. &CudaBackend::num_mixed_attention_steps) of `b`;
// -1, failing the test, when `b` is another backend.
inline int64_t cuda_step_count(Backend& b, int64_t (CudaBackend::*count)() const) {
  auto* cuda = dynamic_cast<CudaBackend*>(&b);
  EXPECT_NE(cuda, nullptr) << "not the CUDA backend";
  return cuda != nullptr ? (cuda->*count)() : -1;
}

}  // namespace origami::cuda::testing
