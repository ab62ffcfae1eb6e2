// The FP8 GEMV (cuda/fp8_gemv.h) against an fp64 reference over the same E4M3 operands, through
// Fp8Gemm::linear as the backend calls it: rows 1-4 take the GEMV, more rows cuBLASLt.
// Every product of two E4M3 values is exact in fp32, and the GEMV sums them in fp32: each lane
// adds k / 32 products one after another, then a 5-level shuffle tree adds the 32 lanes, so the
// accumulation error is at most (k / 32 + 5) 2^-24 of the sum of |products| (a rounding per
// addition, each at most 2^-24 of a partial sum bounded by that sum); the scales and the bf16
// output add at most 2^-8 of |y| (as in cuda_fp8_test's bound). cuBLASLt's split accumulation is
// allowed 2^-14 of the sum: the GEMV must also be at least as close to the reference as it is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/backend.h"
#include "backend/cuda/fp8_gemv.h"
#include "core/fp8.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;

struct Operands {
  std::vector<uint8_t> xq, wq;
  std::vector<float> xs, ws;
  std::vector<double> ref, mag;  // y in fp64, and the sum of |products| (scaled) per element
};

Operands make_operands(int m, int n, int k, std::mt19937& rng) {
  Operands o;
  const std::vector<float> x = testing::random_bf16_values(static_cast<size_t>(m) * k, rng, 1.0f);
  const std::vector<float> w = testing::random_bf16_values(static_cast<size_t>(n) * k, rng, 0.02f);
  o.xq.resize(x.size());
  o.wq.resize(w.size());
  o.xs.resize(m);
  o.ws.resize(n);
  quantize_rows_fp8(x.data(), m, k, k, o.xq.data(), o.xs.data());
  quantize_rows_fp8(w.data(), n, k, k, o.wq.data(), o.ws.data());
  o.ref.resize(static_cast<size_t>(m) * n);
  o.mag.resize(o.ref.size());
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0, a = 0;
      for (int e = 0; e < k; ++e) {
        const double p = static_cast<double>(fp8_e4m3_to_f32(o.xq[static_cast<size_t>(i) * k + e])) *
                         fp8_e4m3_to_f32(o.wq[static_cast<size_t>(j) * k + e]);
        s += p;
        a += std::fabs(p);
      }
      o.ref[static_cast<size_t>(i) * n + j] = s * o.xs[i] * o.ws[j];
      o.mag[static_cast<size_t>(i) * n + j] = a * o.xs[i] * o.ws[j];
    }
  return o;
}

// y through Fp8Gemm::linear, with the GEMV on or off.
std::vector<float> run(Fp8Gemm& gemm, bool gemv, const Operands& o, int m, int n, int k, cudaStream_t stream) {
  gemm.set_gemv_rows(gemv ? kFp8GemvMaxRows : 0);
  DeviceBuffer<uint8_t> dxq(o.xq), dwq(o.wq);
  DeviceBuffer<float> dxs(o.xs), dws(o.ws), acc(static_cast<size_t>(m) * n);
  DeviceBuffer<__nv_bfloat16> y(static_cast<size_t>(m) * n);
  y.poison();
  gemm.linear(dxq.get(), dxs.get(), m, k, dwq.get(), dws.get(), n, y.get(), acc.get(), stream);
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return testing::from_device_bf16(y.download());
}

TEST(Fp8Gemv, MatchesTheFp64ReferenceWithinFp32Summation) {
  std::mt19937 rng(21);
  Fp8Gemm gemm;
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreate(&stream));
  // Odd n (the last warp's second channel is missing), k of one chunk, of an odd number of
  // 512-code steps, and the Llama-3.1-8B projections' shapes.
  for (auto [n, k] : {std::pair{1001, 16}, std::pair{512, 512}, std::pair{640, 1552}, std::pair{6144, 4096},
                      std::pair{4096, 14336}}) {
    for (int m = 1; m <= kFp8GemvMaxRows; ++m) {
      const Operands o = make_operands(m, n, k, rng);
      const std::vector<float> got = run(gemm, true, o, m, n, k, stream);
      // cuBLASLt's FP8 GEMM needs n % 16 == 0: the odd shape has only the fp64 reference.
      const bool has_lib = n % 16 == 0;
      const std::vector<float> lib = has_lib ? run(gemm, false, o, m, n, k, stream) : std::vector<float>();
      const double acc_bound = (k / 32.0 + 5.0) * std::ldexp(1.0, -24);
      double worst = 0, err_gemv = 0, err_lib = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(got[i] - o.ref[i]);
        const double bound = std::ldexp(std::fabs(o.ref[i]), -8) + acc_bound * o.mag[i];
        ASSERT_LE(err, bound) << "m " << m << " n " << n << " k " << k << " element " << i;
        worst = std::max(worst, err / bound);
        err_gemv += err;
        if (has_lib) err_lib += std::fabs(lib[i] - o.ref[i]);
      }
      std::printf("[fp8 gemv] m %d n %d k %d: worst error %.2f of the bound; mean |error| GEMV %.3e, cuBLASLt %.3e\n", m,
                  n, k, worst, err_gemv / got.size(), err_lib / got.size());
      // Both round to bf16 last; the GEMV's fp32 sums must not make it the less accurate one.
      if (has_lib) EXPECT_LE(err_gemv, err_lib * 1.02 + 1e-30) << "m " << m << " n " << n << " k " << k;
    }
  }
  cudaStreamDestroy(stream);
}

TEST(Fp8Gemv, ServesOnlyWhatItSupportsAndLinearFallsBack) {
  DeviceBuffer<uint8_t> buf(64);
  const uint8_t* aligned = buf.get();
  EXPECT_TRUE(fp8_gemv_supported(1, 16, aligned, aligned));
  EXPECT_TRUE(fp8_gemv_supported(kFp8GemvMaxRows, 4096, aligned, aligned));
  EXPECT_FALSE(fp8_gemv_supported(0, 16, aligned, aligned));
  EXPECT_FALSE(fp8_gemv_supported(kFp8GemvMaxRows + 1, 16, aligned, aligned));
  EXPECT_FALSE(fp8_gemv_supported(1, 24, aligned, aligned));
  EXPECT_FALSE(fp8_gemv_supported(1, 16, aligned + 8, aligned));
  EXPECT_FALSE(fp8_gemv_supported(1, 16, aligned, aligned + 4));
  // The backend's default is the rows the GEMV measured faster at (kFp8GemvFasterRows).
  EXPECT_EQ(BackendOptions{}.fp8_gemv_rows, kFp8GemvFasterRows);
  EXPECT_LE(kFp8GemvFasterRows, kFp8GemvMaxRows);

  // Five rows with the GEMV on: cuBLASLt computes them, within its own bound.
  std::mt19937 rng(3);
  Fp8Gemm gemm;
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreate(&stream));
  const int m = kFp8GemvMaxRows + 1, n = 512, k = 1024;
  const Operands o = make_operands(m, n, k, rng);
  const std::vector<float> got = run(gemm, true, o, m, n, k, stream);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - o.ref[i]), std::ldexp(std::fabs(o.ref[i]), -8) + std::ldexp(o.mag[i], -14)) << i;
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace origami::cuda
