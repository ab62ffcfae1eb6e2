// FP8 vs bf16 GEMM time of the decode step's projections at the Llama-3.1-8B shapes (hidden 4096,
// 32 q / 8 kv heads of 128, intermediate 14336) for m = 1, 64, 256, 1024 tokens, next to the time
// the weight bytes take at the device's copy bandwidth. FP8 = the per-token quantize kernel + the
// cuBLASLt GEMM (outer-vector scales; the epilogue path beside it). ORIGAMI_CUDA_BENCH=1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <random>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/fp8_fused_kernels.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/fp8_small_gemm.h"
#include "backend/cuda/fp8_kernels.h"
#include "backend/cuda/gemm.h"
#include "bench_util.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::graph_ms;
using testing::measure_copy_gbps;

// The Llama-3.1-8B projections of one layer: output channels n, input k.
struct Shape {
  const char* name;
  int n, k;
};
constexpr Shape kShapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};

// A layer's four projections of a model at a tensor-parallel size (each rank's shard at TP = 2:
// q|k|v and gate|up split by output channels, o and down by input channels).
struct Model {
  const char* name;
  Shape shapes[4];
};
constexpr Model kLlama8bTp1 = {"llama8b_tp1", {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}}};
constexpr Model kLlama8bTp2 = {"llama8b_tp2", {{"qkv", 3072, 4096}, {"o", 4096, 2048}, {"gate_up", 14336, 4096}, {"down", 4096, 7168}}};
constexpr Model kQwen3_8bTp1 = {"qwen3_8b_tp1", {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 24576, 4096}, {"down", 4096, 12288}}};
constexpr Model kQwen3_8bTp2 = {"qwen3_8b_tp2", {{"qkv", 3072, 4096}, {"o", 4096, 2048}, {"gate_up", 12288, 4096}, {"down", 4096, 6144}}};

TEST(Fp8GemmBench, Llama31_8BProjections) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  const int ms_list[] = {1, 64, 256, 1024};
  Gemm bf16_gemm;
  bf16_gemm.set_stream(stream);
  Fp8Gemm fp8_gemm;
  std::mt19937 rng(1);
  std::printf("FP8BENCH device copy bandwidth %.0f GB/s; Llama-3.1-8B projections, one layer (x32 layers per step)\n",
              copy_gbps);
  // fp8 ms: the path the backend takes at this m (Fp8Gemm::scaling_for); outer / epilogue: each
  // path with its quantize kernel; gemm only: the outer-vector GEMM without it.
  std::printf("FP8BENCH %-8s %5s | %9s %9s | %9s %9s %9s %9s | %7s %7s\n", "shape", "m", "bf16 ms", "floor", "fp8 ms",
              "outer", "gemm only", "epilogue", "floor", "speedup");
  for (int m : ms_list) {
    double sum_bf16 = 0, sum_fp8 = 0;
    for (const Shape& s : kShapes) {
      const size_t wn = static_cast<size_t>(s.n) * s.k;
      DeviceBuffer<__nv_bfloat16> w(wn), x(static_cast<size_t>(m) * s.k), y(static_cast<size_t>(m) * s.n);
      {
        std::vector<float> xv = testing::random_bf16_values(static_cast<size_t>(m) * s.k, rng, 1.0f);
        x.upload(testing::to_device_bf16(xv));
      }
      ORIGAMI_CUDA_CHECK(cudaMemsetAsync(w.get(), 0x3c, wn * 2, stream));  // ~0.01: any finite values
      DeviceBuffer<uint8_t> wq(wn), xq(static_cast<size_t>(m) * s.k);
      DeviceBuffer<float> ws(s.n), xs(m), acc(static_cast<size_t>(m) * s.n);
      launch_quantize_rows_fp8(w.get(), s.n, s.k, nullptr, wq.get(), ws.get(), stream);
      const float t_bf16 = graph_ms(stream, 50, [&] { bf16_gemm.linear(x.get(), m, s.k, w.get(), s.n, y.get(), false); });
      fp8_gemm.force_scaling(Fp8Gemm::Scaling::kOuterVector);
      const bool outer = fp8_gemm.outer_vector_supported(m, s.n, s.k);
      if (!outer) fp8_gemm.force_scaling(Fp8Gemm::Scaling::kEpilogue);
      fp8_gemm.linear(xq.get(), xs.get(), m, s.k, wq.get(), ws.get(), s.n, y.get(), acc.get(), stream);  // plan
      const float t_outer = graph_ms(stream, 50, [&] {
        launch_quantize_rows_fp8(x.get(), m, s.k, nullptr, xq.get(), xs.get(), stream);
        fp8_gemm.linear(xq.get(), xs.get(), m, s.k, wq.get(), ws.get(), s.n, y.get(), acc.get(), stream);
      });
      const float t_gemm = graph_ms(stream, 50, [&] {
        fp8_gemm.linear(xq.get(), xs.get(), m, s.k, wq.get(), ws.get(), s.n, y.get(), acc.get(), stream);
      });
      fp8_gemm.force_scaling(Fp8Gemm::Scaling::kEpilogue);
      fp8_gemm.linear(xq.get(), xs.get(), m, s.k, wq.get(), ws.get(), s.n, y.get(), acc.get(), stream);
      const float t_epi = graph_ms(stream, 50, [&] {
        launch_quantize_rows_fp8(x.get(), m, s.k, nullptr, xq.get(), xs.get(), stream);
        fp8_gemm.linear(xq.get(), xs.get(), m, s.k, wq.get(), ws.get(), s.n, y.get(), acc.get(), stream);
      });
      fp8_gemm.clear_forced_scaling();
      const float t_fp8 = fp8_gemm.scaling_for(m, s.n, s.k) == Fp8Gemm::Scaling::kEpilogue ? t_epi : t_outer;
      // Bytes each must move at least: weights + activations in + outputs (read once / written once).
      const double act = static_cast<double>(m) * (s.k + s.n) * 2;
      const double floor_bf16 = (2.0 * wn + act) / (copy_gbps / 2) / 1e6;  // copy GB/s counts read + write
      const double floor_fp8 = (1.0 * wn + 4.0 * s.n + act) / (copy_gbps / 2) / 1e6;
      std::printf("FP8BENCH %-8s %5d | %9.4f %9.4f | %9.4f %9.4f %9.4f %9.4f | %7.4f %6.2fx%s\n", s.name, m, t_bf16,
                  floor_bf16, t_fp8, t_outer, t_gemm, t_epi, floor_fp8, t_bf16 / t_fp8,
                  outer ? "" : " (no outer-vector: epilogue)");
      sum_bf16 += t_bf16;
      sum_fp8 += t_fp8;
    }
    std::printf("FP8BENCH layer    %5d | %9.4f           | %9.4f                               |         %6.2fx\n", m,
                sum_bf16, sum_fp8, sum_bf16 / sum_fp8);
  }
  cudaStreamDestroy(stream);
}

std::vector<uint8_t> random_codes(size_t n) {
  std::vector<uint8_t> codes(n);
  uint64_t state = 0x9e3779b97f4a7c15ull ^ n;
  for (size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    // sign, exponent 4..8 of 15 (2^-3 .. 2^1), any mantissa: never NaN, no overflow in the sums.
    const uint32_t r = static_cast<uint32_t>(state >> 33);
    codes[i] = static_cast<uint8_t>((r & 0x80u) | ((4u + (r >> 8) % 5u) << 3) | (r & 0x7u));
  }
  return codes;
}

// An FP8 GEMM's operands on the device for m rows of a projection: random finite E4M3 codes of
// moderate size (a tensor core's power, so its clock, depends on the bits it toggles: constant
// operands would time a cooler GEMM than real ones), scales 0.01, y and the epilogue's scratch.
struct Fp8Operands {
  Fp8Operands(int m, const Shape& s)
      : wq(static_cast<size_t>(s.n) * s.k), xq(static_cast<size_t>(m) * s.k), ws(s.n), xs(m),
        acc(static_cast<size_t>(m) * s.n), y(static_cast<size_t>(m) * s.n) {
    wq.upload(random_codes(static_cast<size_t>(s.n) * s.k));
    xq.upload(random_codes(static_cast<size_t>(m) * s.k));
    ws.upload(std::vector<float>(static_cast<size_t>(s.n), 0.01f));
    xs.upload(std::vector<float>(static_cast<size_t>(m), 0.01f));
  }
  DeviceBuffer<uint8_t> wq, xq;
  DeviceBuffer<float> ws, xs, acc;
  DeviceBuffer<__nv_bfloat16> y;
};

// A projection's FP8 weights, copied over >= 160 MB so that a replay reads them from DRAM, as a
// decode step does, and not from the 50 MB L2 (random codes, scales 0.01).
struct RotatedFp8Weights {
  explicit RotatedFp8Weights(const Shape& s)
      : shape(s), bytes(static_cast<size_t>(s.n) * s.k),
        copies(static_cast<int>(std::min<size_t>(8, (160u << 20) / bytes + 1))), wq(bytes * copies), ws(s.n) {
    wq.upload(random_codes(bytes * copies));
    ws.upload(std::vector<float>(static_cast<size_t>(s.n), 0.01f));
  }
  // ms of one product of m rows through `gemm` (planned by a first run): the median of `iters`
  // graph replays of the product over every copy, divided by the copies.
  float time(Fp8Gemm& gemm, const uint8_t* xq, const float* xs, int m, __nv_bfloat16* y, float* acc, int iters,
             cudaStream_t stream) const {
    auto run = [&] {
      for (int c = 0; c < copies; ++c)
        gemm.linear(xq, xs, m, shape.k, wq.get() + bytes * c, ws.get(), shape.n, y, acc, stream);
    };
    run();
    return graph_ms(stream, iters, run) / copies;
  }
  Shape shape;
  size_t bytes;
  int copies;
  DeviceBuffer<uint8_t> wq;
  DeviceBuffer<float> ws;
};

// `gemm`'s product of `o` (planned by a first call), timed in a CUDA graph: ms, median of `iters`.
float time_fp8_linear(Fp8Gemm& gemm, const Fp8Operands& o, int m, const Shape& s, int iters, cudaStream_t stream) {
  auto run = [&] { gemm.linear(o.xq.get(), o.xs.get(), m, s.k, o.wq.get(), o.ws.get(), s.n, o.y.get(), o.acc.get(), stream); };
  run();
  return graph_ms(stream, iters, run);
}

// The GEMM alone (no quantize kernel) on the path the backend takes, split vs fast accumulation
// (Fp8Gemm::set_fast_accumulation), each with cuBLASLt's first heuristic choice and with the
// fastest of the heuristic's candidates timed here: whether fast accumulation, or timing the
// candidates when a shape is planned, is worth taking into the backend.
TEST(Fp8GemmBench, AccumulationAndAlgorithmChoice) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::printf("FP8ACC %-8s %5s | %9s %9s %8s | %9s %9s %8s | %7s %7s\n", "shape", "m", "split ms", "best", "(cand)",
              "fast ms", "best", "(cand)", "fast/split", "TFLOP/s");
  for (int m : {64, 256, 512, 1024, 2048}) {
    double sum_split = 0, sum_fast = 0, sum_best = 0, flops = 0;
    for (const Shape& s : kShapes) {
      const Fp8Operands o(m, s);
      float t[2] = {0, 0}, best[2] = {0, 0};
      int best_i[2] = {0, 0}, cands[2] = {0, 0};
      for (int fast = 0; fast < 2; ++fast) {
        Fp8Gemm gemm;
        gemm.set_fast_accumulation(fast != 0);
        t[fast] = time_fp8_linear(gemm, o, m, s, 50, stream);
        cands[fast] = gemm.num_candidates(m, s.n, s.k);
        best[fast] = t[fast];
        for (int c = 1; c < cands[fast]; ++c) {
          gemm.use_candidate(m, s.n, s.k, c);
          const float tc = time_fp8_linear(gemm, o, m, s, 50, stream);
          if (tc < best[fast]) { best[fast] = tc; best_i[fast] = c; }
        }
      }
      const double f = 2.0 * m * s.n * s.k;
      std::printf("FP8ACC %-8s %5d | %9.4f %9.4f %3d of %-2d | %9.4f %9.4f %3d of %-2d | %9.3f %7.0f\n", s.name, m, t[0],
                  best[0], best_i[0], cands[0], t[1], best[1], best_i[1], cands[1], t[1] / t[0],
                  f / (std::min(best[0], best[1]) * 1e9));
      sum_split += t[0];
      sum_fast += t[1];
      sum_best += std::min(best[0], best[1]);
      flops += f;
    }
    std::printf("FP8ACC layer    %5d | split %.4f ms (%.0f TFLOP/s), fast %.4f ms (%.0f), best candidate %.4f ms (%.0f)\n",
                m, sum_split, flops / (sum_split * 1e9), sum_fast, flops / (sum_fast * 1e9), sum_best,
                flops / (sum_best * 1e9));
  }
  cudaStreamDestroy(stream);
}

// Decode's few rows: the FP8 GEMV (--fp8-gemv-rows, m <= 4) and the few-row tensor-core GEMM
// (BackendOptions::fp8_small_gemm_rows, m <= 16) against cuBLASLt (split accumulation, the default
// path) at m = 1, 2, 3, 4, 8, 16, each next to the time its weight bytes take at the copy bandwidth
// (the whole read + write rate, as cuda_decode_bench_test's floor: not the half the first bench
// divides by). FP8GEMV lines; "-" where the GEMV does not serve the rows.
TEST(Fp8GemmBench, GemvAgainstCublasLtAtFewRows) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  std::printf("FP8GEMV copy %.0f GB/s\n", copy_gbps);
  std::printf("FP8GEMV %-8s %2s | %9s | %9s %6s | %9s %6s | %7s | %9s %6s | %7s\n", "shape", "m", "floor ms", "cuBLASLt",
              "floor", "GEMV", "floor", "speedup", "small", "floor", "speedup");
  for (int m : {1, 2, 3, 4, 8, 16}) {
    const bool gemv_serves = m <= kFp8GemvMaxRows;
    double sum_lib = 0, sum_gemv = 0, sum_small = 0, sum_floor = 0;
    for (const Shape& s : kShapes) {
      const Fp8Operands o(m, s);
      const size_t wn = static_cast<size_t>(s.n) * s.k;
      float t[3] = {0, 0, 0};  // cuBLASLt, GEMV, small GEMM
      for (int path = 0; path < 3; ++path) {
        if (path == 1 && !gemv_serves) continue;
        Fp8Gemm gemm;
        gemm.set_gemv_rows(path == 1 ? kFp8GemvMaxRows : 0);
        gemm.set_small_gemm_rows(path == 2 ? kFp8SmallGemmMaxRows : 0);
        t[path] = time_fp8_linear(gemm, o, m, s, 100, stream);
      }
      // Issue 26's floor, as the decode roofline takes it: the bytes read at the measured copy
      // bandwidth (read + write traffic: what the memory moves when it only streams).
      const double floor = (static_cast<double>(wn) + 4.0 * s.n) / copy_gbps / 1e6;
      char gemv_cols[64] = "        -      - |       -";
      if (gemv_serves)
        std::snprintf(gemv_cols, sizeof gemv_cols, "%9.4f %5.0f%% | %6.2fx", t[1], 100 * floor / t[1], t[0] / t[1]);
      std::printf("FP8GEMV %-8s %2d | %9.4f | %9.4f %5.0f%% | %s | %9.4f %5.0f%% | %6.2fx\n", s.name, m, floor, t[0],
                  100 * floor / t[0], gemv_cols, t[2], 100 * floor / t[2], t[0] / t[2]);
      sum_lib += t[0];
      sum_gemv += t[1];
      sum_small += t[2];
      sum_floor += floor;
    }
    char gemv_cols[64] = "        -      - |       -";
    if (gemv_serves)
      std::snprintf(gemv_cols, sizeof gemv_cols, "%9.4f %5.0f%% | %6.2fx", sum_gemv, 100 * sum_floor / sum_gemv,
                    sum_lib / sum_gemv);
    std::printf("FP8GEMV layer    %2d | %9.4f | %9.4f %5.0f%% | %s | %9.4f %5.0f%% | %6.2fx\n", m, sum_floor, sum_lib,
                100 * sum_floor / sum_lib, gemv_cols, sum_small, 100 * sum_floor / sum_small, sum_lib / sum_small);
  }
  cudaStreamDestroy(stream);
}

// cuBLASLt's FP8 algorithms beyond its heuristic: for the problem Fp8Gemm plans (outer-vector
// scales into bf16 above Fp8Gemm::kEpilogueMaxRows rows, unit scales into fp32 at or below), every
// algorithm id cuBLASLt lists, each of its tiles, split-K 1/2/4/8 with each reduction scheme it
// supports, checked by cublasLtMatmulAlgoCheck and timed (events, back-to-back launches), against
// the heuristic's first choice. Whether the shapes where the heuristic's GEMM leaves SMs idle (the
// o and down projections at m <= 256: n / 128 = 32 output tiles) have a faster configuration the
// backend could plan. FP8ALGO lines.
TEST(Fp8GemmBench, AlgorithmSearch) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cublasLtHandle_t lt;
  ORIGAMI_CUBLAS_CHECK(cublasLtCreate(&lt));
  const size_t ws_bytes = 32u << 20;
  DeviceBuffer<uint8_t> ws(ws_bytes);
  cudaEvent_t e0, e1;
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&e0));
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&e1));
  for (int m : testing::env_list("ORIGAMI_BENCH_ALGO_ROWS", {16, 64, 128, 256, 512})) {
    double sum_heur = 0, sum_best = 0;
    for (const Shape& s : kShapes) {
      const Fp8Operands o(m, s);
      const bool outer = m > Fp8Gemm::kEpilogueMaxRows;
      const cudaDataType_t d_type = outer ? CUDA_R_16BF : CUDA_R_32F;
      void* d_ptr = outer ? static_cast<void*>(o.y.get()) : static_cast<void*>(o.acc.get());
      cublasLtMatmulDesc_t desc;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
      if (outer) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        const float* wsp = o.ws.get();
        const float* xsp = o.xs.get();
        ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
        ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
        ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &wsp, sizeof wsp));
        ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xsp, sizeof xsp));
      }
      cublasLtMatrixLayout_t a, b, d;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, s.k, s.n, s.k));
      ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, s.k, m, s.k));
      ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, d_type, s.n, m, s.n));
      const float alpha = 1.f, beta = 0.f;
      // ms per product, mean of 20 back-to-back launches after 3; negative when it fails to run.
      auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> float {
        for (int i = 0; i < 23; ++i) {
          if (i == 3) ORIGAMI_CUDA_CHECK(cudaEventRecord(e0, stream));
          if (cublasLtMatmul(lt, desc, &alpha, o.wq.get(), a, o.xq.get(), b, &beta, d_ptr, d, d_ptr, d, &algo, ws.get(),
                             ws_bytes, stream) != CUBLAS_STATUS_SUCCESS)
            return -1.f;
        }
        ORIGAMI_CUDA_CHECK(cudaEventRecord(e1, stream));
        ORIGAMI_CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        ORIGAMI_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        return ms / 20;
      };
      cublasLtMatmulPreference_t pref;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      ORIGAMI_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof ws_bytes));
      cublasLtMatmulHeuristicResult_t heur[1]{};
      int found = 0;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, 1, heur, &found));
      cublasLtMatmulPreferenceDestroy(pref);
      ASSERT_EQ(found, 1);
      const float t_heur = time_algo(heur[0].algo);
      int heur_id = -1;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&heur[0].algo, CUBLASLT_ALGO_CONFIG_ID, &heur_id,
                                                                sizeof heur_id, nullptr));
      int ids[128];
      int num_ids = 0;
      ORIGAMI_CUBLAS_CHECK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3,
                                                    d_type, d_type, 128, ids, &num_ids));
      float best = t_heur;
      char best_desc[160];
      std::snprintf(best_desc, sizeof best_desc, "heuristic (id %d)", heur_id);
      int tried = 0, valid = 0;
      for (int ii = 0; ii < num_ids; ++ii) {
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, CUDA_R_8F_E4M3, CUDA_R_8F_E4M3, d_type, d_type,
                                   ids[ii], &algo) != CUBLAS_STATUS_SUCCESS)
          continue;
        size_t bytes = 0;
        std::vector<int> tiles, stages;
        if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) ==
                CUBLAS_STATUS_SUCCESS && bytes > 0) {
          tiles.resize(bytes / sizeof(int));
          cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes);
        }
        if (tiles.empty()) tiles.push_back(CUBLASLT_MATMUL_TILE_UNDEFINED);
        if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &bytes) ==
                CUBLAS_STATUS_SUCCESS && bytes > 0) {
          stages.resize(bytes / sizeof(int));
          cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), bytes, &bytes);
        }
        stages.insert(stages.begin(), CUBLASLT_MATMUL_STAGES_UNDEFINED);
        int32_t splitk_ok = 0;
        uint32_t red_mask = 0;
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof splitk_ok, nullptr);
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK, &red_mask, sizeof red_mask,
                                          nullptr);
        for (int tile : tiles) {
          for (int splitk : {1, 2, 4, 8}) {
            if (splitk > 1 && splitk_ok == 0) break;
            for (uint32_t red : {static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE),
                                 static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                                 static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                                 static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
              if ((splitk == 1) != (red == CUBLASLT_REDUCTION_SCHEME_NONE)) continue;
              if (red != CUBLASLT_REDUCTION_SCHEME_NONE && (red_mask & red) == 0) continue;
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk);
              cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
              // The first stage count the library accepts for this configuration.
              for (int stage : stages) {
                cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof stage);
                cublasLtMatmulHeuristicResult_t check{};
                ++tried;
                if (cublasLtMatmulAlgoCheck(lt, desc, a, b, d, d, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
                    check.workspaceSize > ws_bytes)
                  continue;
                const float t = time_algo(algo);
                if (t > 0) {
                  ++valid;
                  if (t < best) {
                    best = t;
                    std::snprintf(best_desc, sizeof best_desc, "id %d tile %d stages %d split-k %d reduction %u", ids[ii],
                                  tile, stage, splitk, red);
                  }
                }
                break;
              }
            }
          }
        }
      }
      ORIGAMI_CUDA_CHECK(cudaGetLastError());
      std::printf("FP8ALGO %-8s m %4d | heuristic %.4f ms | best %.4f ms (%.2fx) %s | %d ids, %d configurations, %d ran\n",
                  s.name, m, t_heur, best, t_heur / best, best_desc, num_ids, tried, valid);
      std::fflush(stdout);
      sum_heur += t_heur;
      sum_best += best;
      cublasLtMatrixLayoutDestroy(a);
      cublasLtMatrixLayoutDestroy(b);
      cublasLtMatrixLayoutDestroy(d);
      cublasLtMatmulDescDestroy(desc);
    }
    std::printf("FP8ALGO layer    m %4d | heuristic %.4f ms | best %.4f ms (%.2fx)\n", m, sum_heur, sum_best,
                sum_heur / sum_best);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtDestroy(lt);
  cudaStreamDestroy(stream);
}

// The element-wise producers of the FP8 GEMMs' inputs at decode's row counts, against the bytes
// they move at the copy bandwidth: the SiLU-and-multiply + quantize and the residual add + RMSNorm
// + quantize. Ten launches a replay, the time per launch (the norm's 24-48 MB of rows can stay in
// the 50 MB L2 between launches, so it may read above the floor). FUSEDQ lines.
TEST(Fp8GemmBench, FusedQuantizeProducers) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  constexpr int kLaunches = 10;
  std::printf("FUSEDQ copy %.0f GB/s\n", copy_gbps);
  std::printf("FUSEDQ %-14s %5s %6s | %9s | %9s %6s\n", "kernel", "rows", "cols", "floor ms", "ms", "floor");
  for (int inter : {14336, 12288})
    for (int m : {64, 256, 1024}) {
      const size_t n = static_cast<size_t>(m) * inter;
      DeviceBuffer<bf16> gate_up(2 * n);
      launch_fill_random_bf16(gate_up.get(), 2 * n, 1.0f, 0.0f, 7, stream);
      DeviceBuffer<uint8_t> codes(n);
      DeviceBuffer<float> scales(m);
      const Fp8RowsOut q{codes.get(), scales.get(), nullptr};
      const float ms = graph_ms(stream, 50, [&] {
        for (int i = 0; i < kLaunches; ++i) launch_silu_and_mul_quantize_fp8(gate_up.get(), m, inter, q, stream);
      }) / kLaunches;
      const double floor = (4.0 * n + n + 4.0 * m) / copy_gbps / 1e6;  // bf16 gate|up in, codes + scales out
      std::printf("FUSEDQ %-14s %5d %6d | %9.4f | %9.4f %5.0f%%\n", "silu_quantize", m, inter, floor, ms, 100 * floor / ms);
    }
  for (int m : {64, 256, 1024}) {
    const int hidden = 4096;
    const size_t n = static_cast<size_t>(m) * hidden;
    DeviceBuffer<float> residual(n);
    ORIGAMI_CUDA_CHECK(cudaMemsetAsync(residual.get(), 0, n * sizeof(float), stream));
    DeviceBuffer<bf16> delta(n), weight(hidden);
    launch_fill_random_bf16(delta.get(), n, 1.0f, 0.0f, 8, stream);
    launch_fill_random_bf16(weight.get(), hidden, 0.1f, 1.0f, 9, stream);
    DeviceBuffer<uint8_t> codes(n);
    DeviceBuffer<float> scales(m);
    const float ms = graph_ms(stream, 50, [&] {
      for (int i = 0; i < kLaunches; ++i)
        launch_add_rmsnorm_quantize_fp8(residual.get(), delta.get(), weight.get(), 1e-6f, m, hidden,
                                        Fp8RowsOut{codes.get(), scales.get(), nullptr}, nullptr, stream);
    }) / kLaunches;
    const double floor = (4.0 * n + 2.0 * n + 4.0 * n + n + 4.0 * m) / copy_gbps / 1e6;  // fp32 residual in and out
    std::printf("FUSEDQ %-14s %5d %6d | %9.4f | %9.4f %5.0f%%\n", "add_rmsnorm_q", m, hidden, floor, ms, 100 * floor / ms);
  }
  cudaStreamDestroy(stream);
}

// Split-K (Fp8Gemm::force_splits) at decode's row counts: every projection of a layer of the
// Llama-3.1-8B and Qwen3-8B shapes, at TP = 1 and each rank's shard at TP = 2, split 1-4 ways
// where the split divides k into multiples of 16, both accumulation modes. Each replay runs the
// product over enough copies of the weights (>= 160 MB) that they come from DRAM, as in a decode
// step, not from the 50 MB L2; the time is per product, partial-sum kernel included. FP8SPLIT
// lines: per shape and m the time of each split count, the fastest, and what split_k_rule() picks;
// then per layer (the four projections) unsplit, rule and best.
TEST(Fp8GemmBench, SplitKAtDecodeRows) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  int device = 0, num_sms = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  const Model models[] = {kLlama8bTp1, kLlama8bTp2, kQwen3_8bTp1, kQwen3_8bTp2};
  constexpr int kRows[] = {8, 16, 32, 64, 80, 96, 128, 160, 192, 224, 256, 288, 320, 384, 448, 512};
  constexpr int kNumRows = sizeof kRows / sizeof kRows[0];
  constexpr int kMaxM = 512;
  // Variants: K split 1-4.
  struct Variant {
    int splits;
    const char* name;
  };
  constexpr Variant kVariants[] = {{1, "s=1"}, {2, "s=2"}, {3, "s=3"}, {4, "s=4"}};
  constexpr int kNumVariants = sizeof kVariants / sizeof kVariants[0];
  std::printf("FP8SPLIT copy %.0f GB/s, %d SMs; ms a product\n", copy_gbps, num_sms);
  std::printf("FP8SPLIT %-12s %-4s %-8s %5s |", "model", "acc", "shape", "m");
  for (const Variant& v : kVariants) std::printf(" %8s", v.name);
  std::printf(" | %-8s %-8s | %6s\n", "best", "rule", "floor%");
  // Operands shared by every row count: x of the most rows, the partials' scratch and y.
  DeviceBuffer<uint8_t> xq(static_cast<size_t>(kMaxM) * 14336);
  xq.upload(random_codes(static_cast<size_t>(kMaxM) * 14336));
  DeviceBuffer<float> xs(kMaxM), acc(static_cast<size_t>(Fp8Gemm::kMaxSplits) * kMaxM * 28672);
  xs.upload(std::vector<float>(kMaxM, 0.01f));
  DeviceBuffer<__nv_bfloat16> y(static_cast<size_t>(kMaxM) * 28672);
  for (const Model& model : models) {
    // t[fast][shape][row][variant]: ms a product (0: not run).
    std::vector<float> t(2 * 4 * kNumRows * kNumVariants, 0.0f);
    auto at = [&](int fast, int shape, int row, int variant) -> float& {
      return t[((fast * 4 + shape) * kNumRows + row) * kNumVariants + variant];
    };
    for (int si = 0; si < 4; ++si) {
      const Shape& s = model.shapes[si];
      const RotatedFp8Weights w(s);
      for (int fast = 0; fast < 2; ++fast)
        for (int ri = 0; ri < kNumRows; ++ri) {
          const int m = kRows[ri];
          for (int vi = 0; vi < kNumVariants; ++vi) {
            const Variant& v = kVariants[vi];
            if (!Fp8Gemm::split_divides(s.k, v.splits)) continue;
            Fp8Gemm gemm;
            gemm.set_fast_accumulation(fast != 0);
            gemm.force_splits(v.splits);
            if (gemm.splits_for(m, s.n, s.k) != v.splits) continue;  // no batched plan for it
            at(fast, si, ri, vi) = w.time(gemm, xq.get(), xs.get(), m, y.get(), acc.get(), 30, stream);
          }
        }
    }
    for (int fast = 0; fast < 2; ++fast)
      for (int ri = 0; ri < kNumRows; ++ri) {
        const int m = kRows[ri];
        double layer_unsplit = 0, layer_rule = 0, layer_best = 0, layer_floor = 0;
        for (int si = 0; si < 4; ++si) {
          const Shape& s = model.shapes[si];
          int best = 0;
          std::printf("FP8SPLIT %-12s %-4s %-8s %5d |", model.name, fast ? "fast" : "spl", s.name, m);
          for (int vi = 0; vi < kNumVariants; ++vi) {
            const float ms = at(fast, si, ri, vi);
            if (ms > 0 && ms < at(fast, si, ri, best)) best = vi;
            if (ms > 0)
              std::printf(" %8.4f", ms);
            else
              std::printf(" %8s", "-");
          }
          const int rule_splits = Fp8Gemm::split_k_rule(m, s.n, s.k, num_sms, fast != 0);
          const int rule = at(fast, si, ri, rule_splits - 1) > 0 ? rule_splits - 1 : 0;
          const double floor = (static_cast<double>(s.n) * s.k + 4.0 * s.n) / copy_gbps / 1e6;
          std::printf(" | %-8s %-8s | %5.0f%%\n", kVariants[best].name, kVariants[rule].name,
                      100 * floor / at(fast, si, ri, best));
          layer_unsplit += at(fast, si, ri, 0);
          layer_rule += at(fast, si, ri, rule);
          layer_best += at(fast, si, ri, best);
          layer_floor += floor;
        }
        std::printf("FP8SPLIT %-12s %-4s layer    %5d | unsplit %.4f rule %.4f (%.3fx) best %.4f (%.3fx) | floor %.4f: "
                    "%.0f%% -> %.0f%% (best %.0f%%)\n",
                    model.name, fast ? "fast" : "spl", m, layer_unsplit, layer_rule, layer_unsplit / layer_rule, layer_best,
                    layer_unsplit / layer_best, layer_floor, 100 * layer_floor / layer_unsplit,
                    100 * layer_floor / layer_rule, 100 * layer_floor / layer_best);
      }
  }
  cudaStreamDestroy(stream);
}

// The same question for the bf16 projections (Gemm, cublasGemmEx) of tensor parallelism's
// shards, where each rank's products are half as wide: K split 2 or 4 through
// cublasGemmStridedBatchedEx into fp32 partials, added by launch_sum_scale_fp8_partials with unit
// scales, against the unsplit call, at decode's rows. BF16SPLIT lines (ms a product; weights
// rotated past L2 as above).
TEST(Fp8GemmBench, Bf16SplitKAtDecodeRows) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbps = measure_copy_gbps(stream);
  const Model models[] = {kQwen3_8bTp1, kQwen3_8bTp2};
  constexpr int kRows[] = {64, 128, 192, 256, 320, 384, 512};
  constexpr int kMaxM = 512;
  Gemm gemm;
  gemm.set_stream(stream);
  cublasHandle_t handle;
  ORIGAMI_CUBLAS_CHECK(cublasCreate(&handle));
  DeviceBuffer<uint8_t> cublas_ws(32u << 20);
  ORIGAMI_CUBLAS_CHECK(cublasSetStream(handle, stream));
  ORIGAMI_CUBLAS_CHECK(cublasSetWorkspace(handle, cublas_ws.get(), 32u << 20));
  DeviceBuffer<__nv_bfloat16> x(static_cast<size_t>(kMaxM) * 12288), y(static_cast<size_t>(kMaxM) * 24576);
  launch_fill_random_bf16(x.get(), static_cast<size_t>(kMaxM) * 12288, 1.0f, 0.0f, 3, stream);
  DeviceBuffer<float> acc(static_cast<size_t>(4) * kMaxM * 24576), ones(24576);
  ones.upload(std::vector<float>(24576, 1.0f));
  std::printf("BF16SPLIT copy %.0f GB/s\n", copy_gbps);
  std::printf("BF16SPLIT %-12s %-8s %5s | %8s %8s %8s | %6s\n", "model", "shape", "m", "s=1 ms", "s=2", "s=4", "floor%");
  for (const Model& model : models) {
    std::vector<double> layer(3 * std::size(kRows), 0.0), floor_sum(std::size(kRows), 0.0);
    for (const Shape& s : model.shapes) {
      const size_t welems = static_cast<size_t>(s.n) * s.k;
      const int copies = static_cast<int>(std::min<size_t>(8, (160u << 20) / (2 * welems) + 1));
      DeviceBuffer<__nv_bfloat16> w(welems * copies);
      launch_fill_random_bf16(w.get(), welems * copies, 0.02f, 0.0f, 11, stream);
      for (size_t ri = 0; ri < std::size(kRows); ++ri) {
        const int m = kRows[ri];
        float t[3] = {0, 0, 0};
        for (int v = 0; v < 3; ++v) {
          const int splits = v == 0 ? 1 : 2 * v;
          auto run = [&] {
            for (int c = 0; c < copies; ++c) {
              const __nv_bfloat16* wc = w.get() + welems * c;
              if (splits == 1) {
                gemm.linear(x.get(), m, s.k, wc, s.n, y.get(), false);
                continue;
              }
              const float alpha = 1.0f, beta = 0.0f;
              const int kk = s.k / splits;
              ORIGAMI_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
                  handle, CUBLAS_OP_T, CUBLAS_OP_N, s.n, m, kk, &alpha, wc, CUDA_R_16BF, s.k, kk, x.get(), CUDA_R_16BF,
                  s.k, kk, &beta, acc.get(), CUDA_R_32F, s.n, static_cast<long long>(m) * s.n, splits, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT));
              launch_sum_scale_fp8_partials(acc.get(), splits, m, s.n, ones.get(), ones.get(), y.get(), stream);
            }
          };
          run();
          t[v] = graph_ms(stream, 30, run) / copies;
          layer[ri * 3 + v] += t[v];
        }
        const double floor = 2.0 * welems / copy_gbps / 1e6;
        floor_sum[ri] += floor;
        std::printf("BF16SPLIT %-12s %-8s %5d | %8.4f %8.4f %8.4f | %5.0f%%\n", model.name, s.name, m, t[0], t[1], t[2],
                    100 * floor / std::min({t[0], t[1], t[2]}));
      }
    }
    for (size_t ri = 0; ri < std::size(kRows); ++ri)
      std::printf("BF16SPLIT %-12s layer    %5d | %8.4f %8.4f %8.4f | floor %.4f: %.0f%%\n", model.name, kRows[ri],
                  layer[ri * 3], layer[ri * 3 + 1], layer[ri * 3 + 2], floor_sum[ri],
                  100 * floor_sum[ri] / layer[ri * 3]);
  }
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
}

// A decode step's FP8 projections at each CUDA-graph bucket's rows (cuda_graph_runner.cu): a
// batch is padded up to its bucket, so a bucket whose GEMMs take longer than the next larger
// bucket's only costs time. One layer's four projections (Fp8Gemm as the backend runs it, split-K
// rule included), weights rotated past L2, both accumulations. FP8BUCKET lines; "slower than a
// larger bucket" marks the buckets that lose to one above them.
TEST(Fp8GemmBench, LayerAtGraphBuckets) {
  if (!testing::bench_enabled()) GTEST_SKIP() << "set ORIGAMI_CUDA_BENCH=1";
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Model models[] = {kLlama8bTp1, kQwen3_8bTp1, kQwen3_8bTp2};
  constexpr int kBuckets[] = {192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048};
  constexpr int kMaxM = 2048;
  DeviceBuffer<uint8_t> xq(static_cast<size_t>(kMaxM) * 14336);
  xq.upload(random_codes(static_cast<size_t>(kMaxM) * 14336));
  // The split-K partials' scratch as the backend sizes it (the outer-vector path above 64 rows).
  int device = 0, num_sms = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device));
  size_t acc_floats = 0;
  for (const Model& model : models)
    for (const Shape& s : model.shapes)
      acc_floats = std::max(acc_floats, Fp8Gemm::max_scratch_floats(kMaxM, s.n, s.k, num_sms, false));
  DeviceBuffer<float> xs(kMaxM), acc(acc_floats);
  xs.upload(std::vector<float>(kMaxM, 0.01f));
  DeviceBuffer<__nv_bfloat16> y(static_cast<size_t>(kMaxM) * 28672);
  for (const Model& model : models)
    for (int fast = 0; fast < 2; ++fast) {
      std::vector<double> layer(std::size(kBuckets), 0.0);
      for (const Shape& s : model.shapes) {
        const RotatedFp8Weights w(s);
        Fp8Gemm gemm;
        gemm.set_fast_accumulation(fast != 0);
        for (size_t bi = 0; bi < std::size(kBuckets); ++bi)
          layer[bi] += w.time(gemm, xq.get(), xs.get(), kBuckets[bi], y.get(), acc.get(), 20, stream);
      }
      for (size_t bi = 0; bi < std::size(kBuckets); ++bi) {
        double best_above = 1e30;
        int best_bucket = 0;
        for (size_t bj = bi + 1; bj < std::size(kBuckets); ++bj)
          if (layer[bj] < best_above) best_above = layer[bj], best_bucket = kBuckets[bj];
        char note[96] = "";
        if (best_above < layer[bi]) std::snprintf(note, sizeof note, "  slower than bucket %d (%.4f)", best_bucket, best_above);
        std::printf("FP8BUCKET %-12s %-4s m %5d | layer %.4f ms%s\n", model.name, fast ? "fast" : "spl", kBuckets[bi],
                    layer[bi], note);
      }
    }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace origami::cuda
