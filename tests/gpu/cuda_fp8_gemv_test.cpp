// The FP8 products of few rows against an fp64 reference over the same E4M3 operands, through
// Fp8Gemm::linear as the backend calls it: the GEMV (cuda/fp8_gemv.h; rows 1-4, more rows
// cuBLASLt) and the few-row tensor-core GEMM (cuda/fp8_small_gemm.h; rows 1-16).
// Every product of two E4M3 values is exact in fp32, and the GEMV sums them in fp32: each lane
// adds k / 32 products one after another, then a 5-level shuffle tree adds the 32 lanes, so the
// accumulation error is at most (k / 32 + 5) 2^-24 of the sum of |products| (a rounding per
// addition, each at most 2^-24 of a partial sum bounded by that sum); the scales and the bf16
// output add at most 2^-8 of |y| (as in cuda_fp8_test's bound). cuBLASLt's split accumulation is
// allowed 2^-14 of the sum: the GEMV must also be at least as close to the reference as it is.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_gemm.h"
#include "backend/backend.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/fp8_small_gemm.h"
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

// Which path Fp8Gemm::linear gives the rows: cuBLASLt, the GEMV (up to 4 rows) or the small GEMM
// (up to 16).
enum class Path { kCublasLt, kGemv, kSmallGemm };

// y through Fp8Gemm::linear on `path`.
std::vector<float> run(Fp8Gemm& gemm, Path path, const Operands& o, int m, int n, int k, cudaStream_t stream) {
  gemm.set_gemv_rows(path == Path::kGemv ? kFp8GemvMaxRows : 0);
  gemm.set_small_gemm_rows(path == Path::kSmallGemm ? kFp8SmallGemmMaxRows : 0);
  DeviceBuffer<uint8_t> dxq(o.xq), dwq(o.wq);
  DeviceBuffer<float> dxs(o.xs), dws(o.ws), acc(static_cast<size_t>(m) * n);
  DeviceBuffer<__nv_bfloat16> y(static_cast<size_t>(m) * n);
  y.poison();
  gemm.linear(dxq.get(), dxs.get(), m, k, dwq.get(), dws.get(), n, y.get(), acc.get(), stream);
  ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
  return testing::from_device_bf16(y.download());
}

// `path` over every (n, k) of `shapes` and m of `rows`: each element within bf16 rounding (2^-8 of
// |y|) + acc_bound(k) of its sum of |products|, and, where cuBLASLt has the shape (its FP8 GEMM
// needs n % 16 == 0), a mean error no larger than cuBLASLt's: both round to bf16 last, and the
// path's sums must not make it the less accurate one.
void expect_within_reference(Path path, const char* tag, std::initializer_list<std::pair<int, int>> shapes,
                             std::initializer_list<int> rows, double (*acc_bound)(int k), uint32_t seed) {
  std::mt19937 rng(seed);
  Fp8Gemm gemm;
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreate(&stream));
  for (auto [n, k] : shapes) {
    for (int m : rows) {
      const Operands o = make_operands(m, n, k, rng);
      const std::vector<float> got = run(gemm, path, o, m, n, k, stream);
      const bool has_lib = n % 16 == 0;
      const std::vector<float> lib = has_lib ? run(gemm, Path::kCublasLt, o, m, n, k, stream) : std::vector<float>();
      double worst = 0, err_path = 0, err_lib = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(got[i] - o.ref[i]);
        const double bound = std::ldexp(std::fabs(o.ref[i]), -8) + acc_bound(k) * o.mag[i];
        ASSERT_LE(err, bound) << tag << " m " << m << " n " << n << " k " << k << " element " << i;
        worst = std::max(worst, err / bound);
        err_path += err;
        if (has_lib) err_lib += std::fabs(lib[i] - o.ref[i]);
      }
      std::printf("[%s] m %d n %d k %d: worst error %.2f of the bound; mean |error| %.3e, cuBLASLt %.3e\n", tag, m, n,
                  k, worst, err_path / got.size(), err_lib / got.size());
      if (has_lib) {
        EXPECT_LE(err_path, err_lib * 1.02 + 1e-30) << tag << " m " << m << " n " << n << " k " << k;
      }
    }
  }
  cudaStreamDestroy(stream);
}

// Odd n (the last warp's second channel is missing), k of one chunk, of an odd number of 512-code
// steps, and the Llama-3.1-8B projections' shapes.
TEST(Fp8Gemv, MatchesTheFp64ReferenceWithinFp32Summation) {
  expect_within_reference(
      Path::kGemv, "fp8 gemv",
      {std::pair{1001, 16}, std::pair{512, 512}, std::pair{640, 1552}, std::pair{6144, 4096}, std::pair{4096, 14336}},
      {1, 2, 3, 4}, [](int k) { return (k / 32.0 + 5.0) * std::ldexp(1.0, -24); }, 21);
}

// A few-row kernel's support rules (rows 1..max_rows, k a multiple of k_unit, both operands
// 16-byte aligned), then max_rows + 1 rows through Fp8Gemm::linear on `path`: cuBLASLt computes
// them, within its own bound (2^-14 of the sum of |products|).
void expect_rules_and_fallback(bool (*supported)(int, int, const void*, const void*), int max_rows, int k_unit,
                               Path path, uint32_t seed) {
  DeviceBuffer<uint8_t> buf(static_cast<size_t>(2 * k_unit));
  const uint8_t* aligned = buf.get();
  EXPECT_TRUE(supported(1, k_unit, aligned, aligned));
  EXPECT_TRUE(supported(max_rows, 14336, aligned, aligned));
  EXPECT_FALSE(supported(0, k_unit, aligned, aligned));
  EXPECT_FALSE(supported(max_rows + 1, k_unit, aligned, aligned));
  EXPECT_FALSE(supported(1, k_unit + 8, aligned, aligned));
  EXPECT_FALSE(supported(1, k_unit, aligned + 8, aligned));
  EXPECT_FALSE(supported(1, k_unit, aligned, aligned + 4));
  std::mt19937 rng(seed);
  Fp8Gemm gemm;
  cudaStream_t stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreate(&stream));
  const int m = max_rows + 1, n = 512, k = 1024;
  const Operands o = make_operands(m, n, k, rng);
  const std::vector<float> got = run(gemm, path, o, m, n, k, stream);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_LE(std::fabs(got[i] - o.ref[i]), std::ldexp(std::fabs(o.ref[i]), -8) + std::ldexp(o.mag[i], -14)) << i;
  cudaStreamDestroy(stream);
}

TEST(Fp8Gemv, ServesOnlyWhatItSupportsAndLinearFallsBack) {
  expect_rules_and_fallback(fp8_gemv_supported, kFp8GemvMaxRows, 16, Path::kGemv, 3);
  // The backend's default is the rows the GEMV measured faster at (kFp8GemvFasterRows).
  EXPECT_EQ(BackendOptions{}.fp8_gemv_rows, kFp8GemvFasterRows);
  EXPECT_LE(kFp8GemvFasterRows, kFp8GemvMaxRows);
}

// The few-row tensor-core GEMM: each m16n8k32 MMA sums 32 products in the tensor core, whose
// accumulator keeps fewer bits than fp32 (about 14 of mantissa on Hopper, as cuBLASLt's FP8 notes
// and fast accumulation's measurements here have it), and its result is added to fp32 sums: at most
// 2^-13 of the sum of |products| from the MMAs (each within 2^-13 of its own 32 products' |sum|,
// a margin over 14 bits), plus (k / 32 + 4) 2^-24 from the fp32 additions (k / 64 chunks of two
// MMAs a warp, then four slices), plus bf16 output rounding, 2^-8 of |y|. The mean error must also
// be no larger than cuBLASLt's default (promoted) accumulation's where cuBLASLt has the shape.
// Shapes: odd n (a CTA's last channels missing), k of one chunk, rows in both halves of the MMA's 16
// (m 9-16 use rows g + 8), and the Llama-3.1-8B projections.
TEST(Fp8SmallGemm, MatchesTheFp64ReferenceWithinItsAccumulation) {
  expect_within_reference(
      Path::kSmallGemm, "fp8 small gemm",
      {std::pair{1001, 64}, std::pair{512, 512}, std::pair{648, 1536}, std::pair{6144, 4096}, std::pair{4096, 14336}},
      {1, 2, 3, 5, 8, 9, 16}, [](int k) { return std::ldexp(1.0, -13) + (k / 32.0 + 4.0) * std::ldexp(1.0, -24); }, 29);
}

TEST(Fp8SmallGemm, ServesOnlyWhatItSupportsAndLinearFallsBack) {
  expect_rules_and_fallback(fp8_small_gemm_supported, kFp8SmallGemmMaxRows, 64, Path::kSmallGemm, 5);
  EXPECT_EQ(BackendOptions{}.fp8_small_gemm_rows, 0);  // off unless asked for: slower than cuBLASLt on the H100
}

}  // namespace
}  // namespace origami::cuda
