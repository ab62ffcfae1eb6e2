// Decode-step roofline of the CUDA backend on a real model shape (Qwen3-8B by default) with
// device-generated dummy weights. Runs only with ORIGAMI_CUDA_BENCH=1 (scripts/gpu_run.sh sets it).
//
// For each (batch, context) it times whole decode steps through Backend::execute (CUDA graphs on,
// host overhead included) and sets them next to the floor
//     (weight bytes + KV bytes read) / device-to-device copy bandwidth,
// the bandwidth measured in this run (cudaMemcpy D2D of 1 GiB, bytes read + written). Then it
// splits the step: the GEMMs of one step (all layers + lm_head, through the backend's Gemm, in one
// graph) and the attention of one step (all layers, the graph plan and the plan for the exact
// length). Lines start with ROOFLINE / BREAKDOWN so scripts can pick them up.
// CudaDecodeBench.ProfileOneStep (ORIGAMI_CUDA_PROFILE=1) runs one eager decode step between
// cudaProfilerStart/Stop for `ncu --profile-from-start off` (scripts/gpu_run.sh profile).
// CudaDecodeBench.PrefillStep (ORIGAMI_BENCH_PREFILL=1) times a max-load prefill step (below).
// Environment: ORIGAMI_BENCH_CONFIG (configs/ folder name, default qwen3-8b), ORIGAMI_BENCH_BATCHES
// (default 1,64,256), ORIGAMI_BENCH_CONTEXTS (default 1024,4096), ORIGAMI_BENCH_EAGER=1 to also
// time steps without graphs, ORIGAMI_BENCH_QUANTIZATION=fp8 for FP8 weights,
// ORIGAMI_BENCH_KV_DTYPE=fp8 for the FP8 KV cache (1-byte codes + a 4-byte scale per head row).
// With FP8 weights, each setting is timed with the activation quantization separate and fused
// into its producers (BackendOptions::fuse_fp8_quantize, "fused-q" in the lines);
// ORIGAMI_BENCH_FUSED_QUANTIZE=0 or 1 times only that one; ORIGAMI_BENCH_FUSED_MERGE=0 merges decode
// attention's splits in the merge kernel instead of the last CTA of each unit;
// ORIGAMI_BENCH_BALANCED=0 turns the balanced FP8 decode attention off (BackendOptions::balanced_attention).
// ORIGAMI_BENCH_RANDOM_KV=1 fills the cache with random values (zeros otherwise) and
// ORIGAMI_BENCH_STEPS=N times N steps a shape (20 otherwise): both bear on the clocks a GPU at its
// power cap holds (docs/benchmarks.md, "Full KV on one H200"). ORIGAMI_BENCH_TEMPERATURE=100 samples
// at temperature 1 instead of greedily. ORIGAMI_BENCH_SPREAD=N spreads the
// decode steps' contexts evenly from 2 x context - N down to N (the same mean), as a max-load
// batch's are, ORIGAMI_BENCH_SPREAD_ORDER=descending (default: the scheduler lists the oldest,
// longest requests first), ascending or shuffled.
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_backend_factory.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/paged_attention.h"
#include "cuda_test_util.h"
#include "bench_util.h"
#include "model/config.h"

namespace origami::cuda {
namespace {

using testing::env_int;
using testing::env_is;
using testing::env_list;
using testing::graph_ms;
using testing::measure_copy_gbps;

// Bytes of weights one decode step reads: every linear layer, the norms and lm_head (the
// embedding table is only gathered, batch rows of it). fp8: projections at 1 byte (+ scales).
double decode_weight_bytes(const ModelConfig& c, bool fp8 = false) {
  const double h = c.hidden_size, qkv = c.q_size() + 2.0 * c.kv_size();
  const double proj = qkv * h + h * c.q_size() + 3.0 * c.intermediate_size * h;
  const double proj_rows = qkv + h + 2.0 * c.intermediate_size + h;
  double other = 2.0 * h;
  if (c.qk_norm) other += 2.0 * c.head_dim;
  if (c.qkv_bias) other += qkv;
  const double proj_bytes = fp8 ? proj + 4.0 * proj_rows : 2.0 * proj;
  return c.num_layers * (proj_bytes + 2.0 * other) + 2.0 * (static_cast<double>(c.vocab_size) * h + h);
}

bool bench_kv_fp8() { return env_is("ORIGAMI_BENCH_KV_DTYPE", "fp8"); }

// ORIGAMI_BENCH_FAST_ACCUMULATION=1: FP8 GEMMs with fast accumulation (--fp8-fast-accumulation).
bool bench_fast_accumulation() { return env_is("ORIGAMI_BENCH_FAST_ACCUMULATION", "1"); }

// ORIGAMI_BENCH_FP8_GEMV=N: batches of 1-N through the FP8 GEMV (--fp8-gemv-rows N, 0 = off);
// unset: the backend's default.
int bench_fp8_gemv_rows() { return env_int("ORIGAMI_BENCH_FP8_GEMV", BackendOptions{}.fp8_gemv_rows); }

// ORIGAMI_BENCH_FP8_SMALL_GEMM=N: the rows the GEMV leaves, up to N, through the few-row
// tensor-core GEMM (BackendOptions::fp8_small_gemm_rows); unset: the backend's default (off).
int bench_fp8_small_gemm_rows() {
  return env_int("ORIGAMI_BENCH_FP8_SMALL_GEMM", BackendOptions{}.fp8_small_gemm_rows);
}

// ORIGAMI_BENCH_FP8_BUCKETS=0: every graph bucket, also those the FP8 GEMMs are slower at
// (BackendOptions::fp8_skip_slow_graph_buckets); unset: the default.
bool bench_fp8_skip_buckets() {
  return env_int("ORIGAMI_BENCH_FP8_BUCKETS", BackendOptions{}.fp8_skip_slow_graph_buckets ? 1 : 0) != 0;
}

// ORIGAMI_BENCH_FP8_SPLIT_K=0: FP8 products never split K (--no-fp8-split-k); unset: the default.
bool bench_fp8_split_k() { return env_int("ORIGAMI_BENCH_FP8_SPLIT_K", BackendOptions{}.fp8_split_k ? 1 : 0) != 0; }

// ORIGAMI_BENCH_RANDOM_KV=1: the pool's K and V hold random values instead of zeros (FP8: random
// codes, the two NaN codes excluded, and scales in [2^-8, 2^-7)). What the cache holds changes the
// power a step draws (HBM transfers and tensor-core products of zeros toggle few bits), and a GPU
// at its power cap lowers its clocks: serving reads caches the model wrote.
bool bench_random_kv() { return env_is("ORIGAMI_BENCH_RANDOM_KV", "1"); }

// ORIGAMI_BENCH_STEPS=N: steps timed at each shape (at least 1; `fallback` unset). Long runs reach
// the clocks a GPU holds under its power cap, as max-load serving does.
int bench_steps(int fallback = 20) { return std::max(1, env_int("ORIGAMI_BENCH_STEPS", fallback)); }

// ORIGAMI_BENCH_TEMPERATURE=T (percent, e.g. 100 for 1.0): the steps sample at temperature T / 100
// instead of greedily, as an OpenAI client's default request does (temperature 1): the sampler's
// passes over each logits row are then part of the step. 0 or unset: greedy.
float bench_temperature() { return std::max(0, env_int("ORIGAMI_BENCH_TEMPERATURE", 0)) / 100.0f; }
std::string bench_temperature_tag() {
  return bench_temperature() > 0 ? " T=" + std::to_string(env_int("ORIGAMI_BENCH_TEMPERATURE", 0)) + "%" : "";
}

// ORIGAMI_BENCH_SPREAD_ORDER, "descending" unset (see bench_context_offsets).
std::string bench_spread_order() {
  const char* order = std::getenv("ORIGAMI_BENCH_SPREAD_ORDER");
  return order != nullptr ? order : "descending";
}

// " spread=N,order" for the result lines when ORIGAMI_BENCH_SPREAD is set, else "".
std::string bench_spread_tag() {
  const int shortest = env_int("ORIGAMI_BENCH_SPREAD", 0);
  return shortest > 0 ? " spread=" + std::to_string(shortest) + "," + bench_spread_order() : "";
}

// Each sequence's context less the batch's mean `context` (ORIGAMI_BENCH_SPREAD; all zero unset).
// A max-load batch holds requests at every point of their output, so its contexts run from the
// prompt's length to prompt + output; the decode attention's CTAs then differ in length, and their
// order decides the last wave's tail (longest first: ~0.2% over the work spread over every slot
// where index order over a shuffled batch leaves ~5%, by a list-scheduling model). With
// ORIGAMI_BENCH_SPREAD=N the contexts fall evenly from 2 x context - N to N in the order
// ORIGAMI_BENCH_SPREAD_ORDER names: descending (default, the scheduler's oldest-first order),
// ascending or shuffled (a fixed seed).
std::vector<int> bench_context_offsets(int batch, int context) {
  std::vector<int> offsets(batch, 0);
  const int shortest = env_int("ORIGAMI_BENCH_SPREAD", 0);
  if (shortest <= 0 || batch < 2) return offsets;
  if (shortest >= context) {
    ADD_FAILURE() << "ORIGAMI_BENCH_SPREAD must be below the context (" << context << "), got " << shortest;
    return offsets;
  }
  const int half_range = context - shortest;
  for (int s = 0; s < batch; ++s)  // descending: +half_range for the first, -half_range for the last
    offsets[s] = static_cast<int>(std::lround(half_range * (1.0 - 2.0 * s / (batch - 1))));
  const std::string o = bench_spread_order();
  if (o == "ascending") {
    std::reverse(offsets.begin(), offsets.end());
  } else if (o == "shuffled") {
    std::mt19937 rng(12345);
    std::shuffle(offsets.begin(), offsets.end(), rng);
  } else if (o != "descending") {
    ADD_FAILURE() << "ORIGAMI_BENCH_SPREAD_ORDER must be descending, ascending or shuffled, got '" << o << "'";
  }
  return offsets;
}

// The options of the eager benches (PrefillStep, ProfileOneStep) from the roofline's settings:
// ORIGAMI_BENCH_QUANTIZATION, _FUSED_QUANTIZE (fused unless 0), _FAST_ACCUMULATION, _FP8_GEMV,
// _FP8_SMALL_GEMM, _FP8_SPLIT_K.
BackendOptions eager_bench_options() {
  BackendOptions opt;
  opt.enable_cuda_graphs = false;
  if (env_is("ORIGAMI_BENCH_QUANTIZATION", "fp8")) opt.quantization = WeightQuantization::kFp8;
  opt.fuse_fp8_quantize = !env_is("ORIGAMI_BENCH_FUSED_QUANTIZE", "0");
  opt.fp8_fast_accumulation = bench_fast_accumulation();
  opt.fp8_gemv_rows = bench_fp8_gemv_rows();
  opt.fp8_small_gemm_rows = bench_fp8_small_gemm_rows();
  opt.fp8_split_k = bench_fp8_split_k();
  return opt;
}

// One more `step()` between cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`.
template <typename Step>
void profile_one(const Step& step) {
  ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
  ORIGAMI_CUDA_CHECK(cudaProfilerStart());
  step();
  ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
  ORIGAMI_CUDA_CHECK(cudaProfilerStop());
}

// Fills every layer's K and V of a full (one-group) pool with random values: a host pattern of 64
// MiB uploaded once, then repeated by device copies that double the filled run.
void fill_kv_random(const CudaBackend& backend, const KVLayout& layout) {
  const size_t layer_elems = static_cast<size_t>(layout.groups[0].num_blocks) * layout.num_kv_heads *
                             layout.block_size * layout.head_dim;
  // K then V of each layer, layers in order: one run of 2 L layer_elems elements from layer 0's K
  // (cuda_backend.cu, allocate_kv_cache), and of 2 L layer_elems / head_dim scales.
  const size_t elems = 2 * static_cast<size_t>(layout.num_layers) * layer_elems;
  // The backend exposes its pool read-only, for tests; the bench writes the values a served cache
  // would hold (the backend does not read them between steps other than through attention).
  auto fill = [](void* dst, size_t bytes, auto value_of) {
    using T = decltype(value_of(uint64_t{0}));
    const size_t pattern = std::min(bytes / sizeof(T), (size_t(64) << 20) / sizeof(T));
    std::vector<T> host(pattern);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (T& v : host) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      v = value_of(x);
    }
    auto* d = static_cast<unsigned char*>(dst);
    ORIGAMI_CUDA_CHECK(cudaMemcpy(d, host.data(), pattern * sizeof(T), cudaMemcpyHostToDevice));
    for (size_t done = pattern * sizeof(T); done < bytes; done *= 2)
      ORIGAMI_CUDA_CHECK(cudaMemcpy(d + done, d, std::min(done, bytes - done), cudaMemcpyDeviceToDevice));
  };
  ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
  if (layout.fp8) {
    fill(const_cast<uint8_t*>(backend.k_codes(0)), elems, [](uint64_t x) {
      const auto code = static_cast<uint8_t>(x >> 24);
      return (code & 0x7F) == 0x7F ? static_cast<uint8_t>(code ^ 1) : code;  // E4M3 NaN: S.1111.111
    });
    fill(const_cast<float*>(backend.k_scales(0)), elems / layout.head_dim * sizeof(float),
         [](uint64_t x) { return std::ldexp(1.0f + static_cast<float>(x >> 40) / 16777216.0f, -8); });
  } else {
    fill(const_cast<__nv_bfloat16*>(backend.k_cache(0)), elems * sizeof(__nv_bfloat16),
         [](uint64_t x) { return __float2bfloat16(static_cast<float>(static_cast<int64_t>(x) >> 40) / 8388608.0f); });
  }
  ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
}

// K and V of one token, all layers: bf16, or FP8 codes plus one fp32 scale per head row.
double kv_bytes_per_token(const ModelConfig& c) {
  const double row = bench_kv_fp8() ? c.head_dim + 4.0 : 2.0 * c.head_dim;
  return 2.0 * c.num_layers * c.num_kv_heads * row;
}

// Step time (ms, host clock, CUDA graphs as configured) at `batch` sequences of `context` entries,
// or a negative value when the KV cache does not fit. With `profile`, one more step runs between
// cudaProfilerStart and cudaProfilerStop.
double time_decode_steps(Backend& backend, const ModelConfig& c, int batch, int context, bool profile = false) {
  // ORIGAMI_BENCH_BLOCK: the KV page size (--block-size), 16 unless set.
  const int block_size = env_int("ORIGAMI_BENCH_BLOCK", 16), steps = bench_steps();
  if (block_size < 1) {
    ADD_FAILURE() << "ORIGAMI_BENCH_BLOCK must be a page size of at least 1, got " << block_size;
    return -1.0;
  }
  // Each sequence's pages: its context (ORIGAMI_BENCH_SPREAD) and the steps' 16 + 16 more.
  const std::vector<int> offsets = bench_context_offsets(batch, context);
  std::vector<int> pages_of(batch);
  int num_blocks = 1;
  for (int s = 0; s < batch; ++s) {
    pages_of[s] = (context + offsets[s] + 32) / block_size + 1;
    num_blocks += pages_of[s];
  }
  const size_t need = static_cast<size_t>(num_blocks) * block_size * static_cast<size_t>(kv_bytes_per_token(c));
  if (backend.available_kv_bytes(0) < need) return -1.0;
  KVLayout layout = KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, block_size, num_blocks, DType::kBF16);
  layout.fp8 = bench_kv_fp8();
  const Status alloc = backend.allocate_kv_cache(layout);
  EXPECT_TRUE(alloc.is_ok()) << alloc.to_string();
  if (!alloc.is_ok()) return -1.0;
  if (bench_random_kv()) {
    const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
    EXPECT_NE(cuda, nullptr) << "ORIGAMI_BENCH_RANDOM_KV needs the CUDA backend";
    if (cuda == nullptr) return -1.0;
    fill_kv_random(*cuda, layout);
  }
  std::vector<std::vector<BlockId>> tables(batch);
  BlockId next_block = 1;
  for (int s = 0; s < batch; ++s)
    for (int p = 0; p < pages_of[s]; ++p) tables[s].push_back(next_block++);
  SamplingParams sampling;
  sampling.temperature = bench_temperature();
  auto step = [&](int pos) {
    const ForwardBatch fb = testing::decode_step_batch(tables, pos, c.vocab_size, &sampling, &offsets);
    StepOutput out;
    const Status st = backend.execute(fb, &out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  };
  // The KV entries before `context` are never written by the steps: their contents (zeros, or
  // random values) do not change the bytes moved, and the dummy model's outputs are not checked.
  for (int i = 0; i < 3; ++i) step(context - 3 + i);  // capture + warm up
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step(context + i % 16);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
  if (profile) profile_one([&] { step(context + 16); });
  return ms;
}

// GEMM time of one decode step at `m` rows: all layers' qkv/o/gate_up/down and lm_head (fp32 out),
// weights rotated over two layer copies (each far larger than L2), replayed as one graph.
float step_gemm_ms(const ModelConfig& c, int m, cudaStream_t stream) {
  const size_t h = c.hidden_size, qkv = c.q_size() + 2 * c.kv_size(), inter = c.intermediate_size;
  const size_t layer_elems = qkv * h + h * c.q_size() + 3 * inter * h;
  const size_t lm_elems = static_cast<size_t>(c.vocab_size) * h;
  const size_t act_elems = static_cast<size_t>(m) * std::max<size_t>(2 * inter, qkv);
  testing::DeviceBuffer<bf16> w(2 * layer_elems), lm(lm_elems), x(act_elems), y(act_elems);
  testing::DeviceBuffer<float> logits(static_cast<size_t>(m) * c.vocab_size);
  launch_fill_random_bf16(w.get(), 2 * layer_elems, 0.02f, 0.f, 1, stream);
  launch_fill_random_bf16(lm.get(), lm_elems, 0.02f, 0.f, 2, stream);
  launch_fill_random_bf16(x.get(), act_elems, 1.f, 0.f, 3, stream);
  Gemm gemm;
  gemm.set_stream(stream);
  const float ms = graph_ms(stream, 5, [&] {
    for (int l = 0; l < c.num_layers; ++l) {
      const bf16* base = w.get() + (l % 2) * layer_elems;
      gemm.linear(x.get(), m, h, base, qkv, y.get(), false);
      gemm.linear(x.get(), m, c.q_size(), base + qkv * h, h, y.get(), false);
      gemm.linear(x.get(), m, h, base + qkv * h + h * c.q_size(), 2 * inter, y.get(), false);
      gemm.linear(x.get(), m, inter, base + qkv * h + h * c.q_size() + 2 * inter * h, h, y.get(), false);
    }
    gemm.linear(x.get(), m, h, lm.get(), c.vocab_size, logits.get(), true);
  });
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ms;
}

// Attention time of one decode step (all layers) at `batch` x `context`, under a plan for
// `plan_kv_len`. KV pages are rotated over enough layer copies to stay out of L2.
float step_attention_ms(const ModelConfig& c, int batch, int context, int plan_kv_len, int num_sms,
                        cudaStream_t stream, int* splits) {
  const int block_size = 16, pages_per_seq = (context + block_size - 1) / block_size;
  const size_t layer_bytes = static_cast<size_t>(batch) * pages_per_seq * block_size * c.num_kv_heads * c.head_dim * 2;
  const int copies = static_cast<int>(std::min<size_t>(c.num_layers, std::max<size_t>(2, (size_t(400) << 20) / layer_bytes + 1)));
  const size_t pool_pages = static_cast<size_t>(copies) * batch * pages_per_seq + 1;
  const size_t page_elems = static_cast<size_t>(block_size) * c.num_kv_heads * c.head_dim;
  testing::DeviceBuffer<bf16> k(pool_pages * page_elems), v(pool_pages * page_elems);
  launch_fill_random_bf16(k.get(), pool_pages * page_elems, 1.f, 0.f, 4, stream);
  launch_fill_random_bf16(v.get(), pool_pages * page_elems, 1.f, 0.f, 5, stream);
  std::vector<int32_t> q_indptr(batch + 1), page_indptr(batch + 1), kv_len(batch, context);
  std::vector<int32_t> pages(static_cast<size_t>(copies) * batch * pages_per_seq);
  for (int i = 0; i <= batch; ++i) q_indptr[i] = i, page_indptr[i] = i * pages_per_seq;
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(1 + i);
  testing::DeviceBuffer<int32_t> d_q(q_indptr), d_p(page_indptr), d_kv(kv_len), d_pages(pages);
  const size_t q_elems = static_cast<size_t>(batch) * c.q_size();
  testing::DeviceBuffer<bf16> q(q_elems), out(q_elems);
  launch_fill_random_bf16(q.get(), q_elems, 1.f, 0.f, 6, stream);
  AttentionArgs a;
  a.shape = AttentionShape{batch, batch, c.num_heads, c.num_kv_heads, c.head_dim, block_size};
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  a.q = q.get();
  a.out = out.get();
  a.k_cache = k.get();
  a.v_cache = v.get();
  a.q_indptr = d_q.get();
  a.page_indptr = d_p.get();
  a.kv_len = d_kv.get();
  const AttentionPlan plan = plan_paged_attention(a.shape, plan_kv_len, num_sms);
  *splits = plan.num_splits;
  const size_t ws_bytes = paged_attention_workspace_bytes(plan, a.shape);
  testing::DeviceBuffer<char> ws(std::max<size_t>(ws_bytes, 1));
  const float ms = graph_ms(stream, 5, [&] {
    for (int l = 0; l < c.num_layers; ++l) {
      a.page_indices = d_pages.get() + static_cast<size_t>(l % copies) * batch * pages_per_seq;
      ORIGAMI_CUDA_CHECK(paged_attention(a, plan, ws.get(), ws_bytes, stream));
    }
  });
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return ms;
}

TEST(CudaDecodeBench, RooflineAndBreakdown) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  const std::string cfg_name = testing::bench_config_name();
  auto config = load_model_config(testing::shared_dir() + "/configs/" + cfg_name);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const ModelConfig& c = *config;
  const std::vector<int> batches = env_list("ORIGAMI_BENCH_BATCHES", {1, 64, 256});
  const std::vector<int> contexts = env_list("ORIGAMI_BENCH_CONTEXTS", {1024, 4096});
  const bool eager = env_is("ORIGAMI_BENCH_EAGER", "1");
  // ORIGAMI_BENCH_QUANTIZATION=fp8: FP8 projections (--quantization fp8), dummy weights quantized.
  const bool fp8 = env_is("ORIGAMI_BENCH_QUANTIZATION", "fp8");
  const char* fused_env = std::getenv("ORIGAMI_BENCH_FUSED_QUANTIZE");
  const std::string fused_q = fused_env != nullptr ? fused_env : "";
  const std::vector<bool> fuse_settings = !fp8 ? std::vector<bool>{false}
                                          : fused_q == "0" ? std::vector<bool>{false}
                                          : fused_q == "1" ? std::vector<bool>{true}
                                                           : std::vector<bool>{false, true};
  int device = 0, num_sms = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  const double copy_gbps = measure_copy_gbps(stream);
  const double wbytes = decode_weight_bytes(c, fp8), kv_tok = kv_bytes_per_token(c);
  std::printf("BENCH %s%s%s: device-to-device copy %.0f GB/s (read+write); weights read per step %.2f GB; KV %.0f KB/token\n",
              cfg_name.c_str(), fp8 ? " fp8" : "", bench_kv_fp8() ? " kv-fp8" : "", copy_gbps, wbytes / 1e9, kv_tok / 1e3);

  struct Row {
    int batch, context;
    double ms;
  };
  std::vector<Row> rows;
  for (bool graphs : eager ? std::vector<bool>{true, false} : std::vector<bool>{true})
    for (bool fused : fuse_settings) {
      BackendOptions opt;
      opt.enable_cuda_graphs = graphs;
      if (fp8) opt.quantization = WeightQuantization::kFp8;
      opt.fuse_fp8_quantize = fused;
      opt.fp8_fast_accumulation = bench_fast_accumulation();
      // ORIGAMI_BENCH_FUSED_MERGE=0: decode attention's splits merged by the merge kernel.
      opt.fused_attention_merge = !env_is("ORIGAMI_BENCH_FUSED_MERGE", "0");
      // ORIGAMI_BENCH_BALANCED=0: FP8 decode attention in fixed splits (the streamed kernel).
      opt.balanced_attention = !env_is("ORIGAMI_BENCH_BALANCED", "0");
      opt.fp8_gemv_rows = bench_fp8_gemv_rows();
      opt.fp8_small_gemm_rows = bench_fp8_small_gemm_rows();
      opt.fp8_split_k = bench_fp8_split_k();
      opt.fp8_skip_slow_graph_buckets = bench_fp8_skip_buckets();
      auto backend = std::move(create_cuda_backend(opt)).value();
      ASSERT_TRUE(backend->load_dummy(c, 7).is_ok());
      const int gemv_rows = fp8 ? opt.fp8_gemv_rows : 0, small_rows = fp8 ? opt.fp8_small_gemm_rows : 0;
      const std::string tag = std::string(fp8 ? " fp8" : "") + (fused ? " fused-q" : "") +
                              (fp8 && bench_fast_accumulation() ? " fast-acc" : "") +
                              (gemv_rows > 0 ? " gemv" + std::to_string(gemv_rows) : "") +
                              (small_rows > 0 ? " small" + std::to_string(small_rows) : "") +
                              (fp8 && !opt.fp8_split_k ? " no-split-k" : "") +
                              (fp8 && !opt.fp8_skip_slow_graph_buckets ? " all-buckets" : "") +
                              (bench_kv_fp8() ? " kv-fp8" : "") + (bench_random_kv() ? " random-kv" : "") +
                              bench_spread_tag() + bench_temperature_tag();
      for (int context : contexts)
        for (int batch : batches) {
          const double ms = time_decode_steps(*backend, c, batch, context);
          const double kv_gb = static_cast<double>(batch) * (context + 8) * kv_tok / 1e9;
          if (ms < 0) {
            std::printf("ROOFLINE %s%s graphs=%d batch=%d context=%d: KV %.1f GB does not fit\n", cfg_name.c_str(),
                        tag.c_str(), graphs, batch, context, kv_gb);
            continue;
          }
          const double floor_ms = (wbytes / 1e9 + kv_gb) / copy_gbps * 1e3;
          std::printf("ROOFLINE %s%s graphs=%d batch=%d context=%d: %.3f ms/step, floor %.3f ms (weights %.2f GB + KV "
                      "%.2f GB at %.0f GB/s) -> %.0f%% of floor, %.0f tok/s\n",
                      cfg_name.c_str(), tag.c_str(), graphs, batch, context, ms, floor_ms, wbytes / 1e9, kv_gb,
                      copy_gbps, 100.0 * floor_ms / ms, batch * 1000.0 / ms);
          std::fflush(stdout);
          if (graphs && !fp8 && !bench_kv_fp8()) rows.push_back({batch, context, ms});  // the breakdown times bf16 GEMMs
        }
    }

  // Where a step's time goes (GPU time of each part alone, in a graph).
  std::vector<int> gemm_done;
  std::vector<float> gemm_ms;
  for (const Row& r : rows) {
    auto it = std::find(gemm_done.begin(), gemm_done.end(), r.batch);
    float g;
    if (it == gemm_done.end()) {
      g = step_gemm_ms(c, r.batch, stream);
      gemm_done.push_back(r.batch);
      gemm_ms.push_back(g);
    } else {
      g = gemm_ms[it - gemm_done.begin()];
    }
    int splits_graph = 0, splits_exact = 0;
    // The backend captures its graphs with a plan for min(model context, KV pool entries).
    const int pool_entries = (1 + r.batch * ((r.context + 32) / 16 + 1)) * 16;
    const int graph_len = std::min(c.max_position_embeddings, pool_entries);
    const float att_graph = step_attention_ms(c, r.batch, r.context, graph_len, num_sms, stream, &splits_graph);
    const float att_exact = step_attention_ms(c, r.batch, r.context, r.context + 64, num_sms, stream, &splits_exact);
    const double kv_gb = static_cast<double>(r.batch) * r.context * kv_tok / 1e9;
    std::printf("BREAKDOWN batch=%d context=%d: step %.3f ms = GEMMs %.3f ms (%.0f GB/s) + attention %.3f ms "
                "(graph plan, %d splits; %.0f GB/s) + rest %.3f ms; attention with the exact plan %.3f ms (%d splits)\n",
                r.batch, r.context, r.ms, g, wbytes / g / 1e6, att_graph, splits_graph, kv_gb / att_graph * 1e3,
                r.ms - g - att_graph, att_exact, splits_exact);
  }
  cudaStreamDestroy(stream);
}

// Tensor parallelism's decode step (2 GPUs; ORIGAMI_CUDA_BENCH=1): TP = 1 against TP = 2 with
// NCCL's all-reduce, with the fused peer all-reduce (peer_all_reduce.h; pushing at these row
// counts, and always pulling for comparison), and with no reduction at
// all (the rest of the step: its outputs are wrong, only its time counts), CUDA graphs on. The
// reductions' share of a step is (step - step without them) / step. Lines start with TPSTEP.
// ORIGAMI_BENCH_QUANTIZATION=fp8 / ORIGAMI_BENCH_KV_DTYPE=fp8: FP8 weights / KV cache (the
// backend's other FP8 defaults).
TEST(CudaDecodeBench, TensorParallelStep) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) GTEST_SKIP() << "needs 2 GPUs";
  const std::string cfg_name = testing::bench_config_name();
  auto config = load_model_config(testing::shared_dir() + "/configs/" + cfg_name);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const ModelConfig& c = *config;
  const std::vector<int> batches = env_list("ORIGAMI_BENCH_BATCHES", {1, 64, 256});
  const int context = env_list("ORIGAMI_BENCH_CONTEXTS", {1024})[0];
  using R = BackendOptions::TensorParallelReduce;
  struct Variant {
    const char* name;
    int tp;
    R reduce;
  };
  const Variant variants[] = {{"TP=1", 1, R::kPeer}, {"TP=2 NCCL", 2, R::kNccl}, {"TP=2 peer", 2, R::kPeer},
                              {"TP=2 no reduction", 2, R::kSkipForTiming}, {"TP=2 peer pull", 2, R::kPeerPull}};
  std::vector<std::vector<double>> ms(std::size(variants), std::vector<double>(batches.size(), -1));
  for (size_t v = 0; v < std::size(variants); ++v) {
    BackendOptions opt;
    opt.device = "cuda";
    opt.tensor_parallel_size = variants[v].tp;
    opt.tensor_parallel_reduce = variants[v].reduce;
    if (env_is("ORIGAMI_BENCH_QUANTIZATION", "fp8")) opt.quantization = WeightQuantization::kFp8;
    auto backend = std::move(create_cuda_backend(opt)).value();
    ASSERT_TRUE(backend->load_dummy(c, 7).is_ok());
    for (size_t b = 0; b < batches.size(); ++b) {
      ms[v][b] = time_decode_steps(*backend, c, batches[b], context);
      std::printf("TPSTEP-ROW %s batch=%d: %.3f ms\n", variants[v].name, batches[b], ms[v][b]);
      std::fflush(stdout);
    }
  }
  for (size_t b = 0; b < batches.size(); ++b) {
    const double one = ms[0][b], nccl = ms[1][b], peer = ms[2][b], none = ms[3][b], pull = ms[4][b];
    std::printf("TPSTEP %s%s%s batch=%d context=%d: TP=1 %.3f ms; TP=2 NCCL %.3f ms (%.2fx, reductions %.0f%% of the "
                "step); TP=2 peer %.3f ms (%.2fx, reductions %.0f%%); TP=2 without reductions %.3f ms (%.2fx); "
                "TP=2 peer pulling %.3f ms (%.2fx, reductions %.0f%%)\n",
                cfg_name.c_str(), env_is("ORIGAMI_BENCH_QUANTIZATION", "fp8") ? " fp8" : "",
                bench_kv_fp8() ? " kv-fp8" : "", batches[b], context, one, nccl, one / nccl, 100 * (nccl - none) / nccl, peer,
                one / peer, 100 * (peer - none) / peer, none, one / none, pull, one / pull, 100 * (pull - none) / pull);
  }
}

// A step with prompt tokens as max-load serving runs them when requests are admitted
// (ORIGAMI_BENCH_PREFILL=1): ORIGAMI_BENCH_PREFILL_TOKENS new prompt tokens (default 8192, the
// --max-num-batched-tokens default) as prompts of ORIGAMI_BENCH_PREFILL_PROMPT tokens from position
// 0 (default 1000; the last prompt takes what is left), beside ORIGAMI_BENCH_PREFILL_DECODES decode
// rows at ORIGAMI_BENCH_CONTEXTS' first context (default 0 rows), listed first as the scheduler
// lists them; ORIGAMI_BENCH_MIXED=0 runs their attention with the prompts' in one 64-row launch
// (--no-mixed-decode-attention). Eager, as the engine runs steps with prompt tokens, under
// eager_bench_options; ORIGAMI_BENCH_STEPS steps timed (default 10).
// Prints PREFILL lines: ms a step and the step's FLOPs (projections of every
// new token, causal attention inside each prompt, the LM head of the rows that sample) against
// it. With ORIGAMI_CUDA_PROFILE=1 one more step runs between cudaProfilerStart / Stop for
// `ncu --profile-from-start off`.
TEST(CudaDecodeBench, PrefillStep) {
  if (!env_is("ORIGAMI_BENCH_PREFILL", "1")) GTEST_SKIP() << "set ORIGAMI_BENCH_PREFILL=1";
  auto config = load_model_config(testing::shared_dir() + "/configs/" + testing::bench_config_name());
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const ModelConfig& c = *config;
  const int tokens = env_int("ORIGAMI_BENCH_PREFILL_TOKENS", 8192);
  const int prompt = env_int("ORIGAMI_BENCH_PREFILL_PROMPT", 1000);
  const int decodes = env_int("ORIGAMI_BENCH_PREFILL_DECODES", 0);
  const int context = env_list("ORIGAMI_BENCH_CONTEXTS", {1024})[0];
  const int block_size = env_int("ORIGAMI_BENCH_BLOCK", 16);
  ASSERT_GT(tokens, 0);
  ASSERT_GT(prompt, 0);
  ASSERT_GE(decodes, 0);
  ASSERT_GT(block_size, 0);
  BackendOptions opt = eager_bench_options();
  const bool fp8 = opt.quantization == WeightQuantization::kFp8;
  // ORIGAMI_BENCH_MIXED=0: the whole step in one 64-row attention launch (--no-mixed-decode-attention).
  opt.mixed_decode_attention = !env_is("ORIGAMI_BENCH_MIXED", "0");
  auto backend = std::move(create_cuda_backend(opt)).value();
  ASSERT_TRUE(backend->load_dummy(c, 7).is_ok());

  // The prompts' lengths, then each sequence's pages: prompts from page 1 on, decode rows after.
  std::vector<int> lengths;
  for (int left = tokens; left > 0; left -= prompt) lengths.push_back(std::min(prompt, left));
  std::vector<std::vector<BlockId>> tables;
  BlockId next = 1;
  auto table_of = [&](int entries) {
    std::vector<BlockId> t;
    for (int p = 0; p < (entries + block_size - 1) / block_size; ++p) t.push_back(next++);
    return t;
  };
  for (int n : lengths) tables.push_back(table_of(n));
  for (int d = 0; d < decodes; ++d) tables.push_back(table_of(context + 1));
  KVLayout layout = KVLayout::full(c.num_layers, c.num_kv_heads, c.head_dim, block_size, static_cast<int>(next),
                                   DType::kBF16);
  layout.fp8 = bench_kv_fp8();
  ASSERT_TRUE(backend->allocate_kv_cache(layout).is_ok());

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<int32_t> ids(static_cast<size_t>(std::max(prompt, 1)));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919 + 11) % c.vocab_size);
  // The decode rows first, as the scheduler lists running requests before those it admits.
  ForwardBatch fb;
  for (int d = 0; d < decodes; ++d) {
    SequenceInput in;
    in.start_position = context;
    in.num_cached_entries = context;
    in.block_table = &tables[lengths.size() + static_cast<size_t>(d)];
    in.sampling = &greedy;
    testing::append_sequence(fb, in, ids.data(), 1);
  }
  for (size_t s = 0; s < lengths.size(); ++s) {
    SequenceInput in;
    in.start_position = 0;
    in.num_cached_entries = 0;
    in.block_table = &tables[s];
    in.sampling = &greedy;  // each prompt ends in this step: its last row samples
    testing::append_sequence(fb, in, ids.data(), lengths[s]);
  }
  auto step = [&] {
    StepOutput out;
    const Status st = backend->execute(fb, &out);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  };
  for (int i = 0; i < 2; ++i) step();  // warm up
  const int steps = bench_steps(10);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) step();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;

  const double h = c.hidden_size, rows = tokens + decodes;
  const double proj = (c.q_size() + 2.0 * c.kv_size()) * h + h * c.q_size() + 3.0 * c.intermediate_size * h;
  double attention = 0;  // QK^T and PV: 4 head_dim FLOPs a (query head, key) pair, causal
  for (int n : lengths) attention += 4.0 * c.num_heads * c.head_dim * (static_cast<double>(n) * (n + 1) / 2);
  attention += 4.0 * c.num_heads * c.head_dim * static_cast<double>(decodes) * (context + 1);
  const double sampled = static_cast<double>(lengths.size()) + decodes;
  const double flops = c.num_layers * (2.0 * proj * rows + attention) + 2.0 * c.vocab_size * h * sampled;
  std::printf("PREFILL %s%s%s%s%s tokens=%d prompt=%d prompts=%zu decodes=%d context=%d: %.3f ms/step, %.1f TFLOP "
              "-> %.0f TFLOP/s (projections %.1f TFLOP, attention %.2f TFLOP)\n",
              testing::bench_config_name().c_str(), fp8 ? " fp8" : "", bench_fast_accumulation() ? " fast-acc" : "",
              bench_kv_fp8() ? " kv-fp8" : "", opt.mixed_decode_attention ? "" : " one-launch", tokens, prompt, lengths.size(), decodes, context, ms, flops / 1e12,
              flops / ms / 1e9, c.num_layers * 2.0 * proj * rows / 1e12, c.num_layers * attention / 1e12);
  if (env_is("ORIGAMI_CUDA_PROFILE", "1")) profile_one(step);
}

// One eager decode step (batch/context from ORIGAMI_BENCH_BATCHES/CONTEXTS, first entries) for ncu,
// with the roofline's settings: ORIGAMI_BENCH_QUANTIZATION=fp8, ORIGAMI_BENCH_KV_DTYPE=fp8,
// ORIGAMI_BENCH_FUSED_QUANTIZE=0 (fused is the default), ORIGAMI_BENCH_FAST_ACCUMULATION=1,
// ORIGAMI_BENCH_FP8_GEMV=N and ORIGAMI_BENCH_FP8_SMALL_GEMM=N (rows), so the max-load step's kernels (e.g. Llama-3.1-8B, FP8, batch 1024 x
// 640) can be timed one by one.
TEST(CudaDecodeBench, ProfileOneStep) {
  if (!env_is("ORIGAMI_CUDA_PROFILE", "1")) GTEST_SKIP() << "set ORIGAMI_CUDA_PROFILE=1 (and run under ncu)";
  auto config = load_model_config(testing::shared_dir() + "/configs/" + testing::bench_config_name());
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
  const int batch = env_list("ORIGAMI_BENCH_BATCHES", {64})[0];
  const int context = env_list("ORIGAMI_BENCH_CONTEXTS", {1024})[0];
  const BackendOptions opt = eager_bench_options();
  auto backend = std::move(create_cuda_backend(opt)).value();
  ASSERT_TRUE(backend->load_dummy(*config, 7).is_ok());
  const double ms = time_decode_steps(*backend, *config, batch, context, /*profile=*/true);
  std::printf("PROFILE %s batch=%d context=%d%s%s eager step %.3f ms\n", testing::bench_config_name().c_str(), batch,
              context, opt.quantization == WeightQuantization::kFp8 ? " fp8" : "", bench_kv_fp8() ? " kv-fp8" : "", ms);
}

}  // namespace
}  // namespace origami::cuda
