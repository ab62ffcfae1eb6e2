// The CPU kernels against direct double-precision formulas, and the batch invariance the
// backend's bit-exactness rests on (a GEMM row does not depend on the other rows).
#include <atomic>
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_kernels.h"

namespace origami::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(CpuGemm, MatchesNaiveOnOddSizes) {
  ThreadPool pool(2);
  for (int m : {1, 3, 4, 5, 17, 67, 130}) {
    for (int n : {1, 2, 5, 13, 130}) {
      for (int k : {1, 7, 16, 17, 100, 172}) {
        const size_t lda = k + 3, ldw = k + 1, ldc = n + 2;  // strided views
        auto a = random_vector(m * lda, 1 + m * 7 + k);
        auto w = random_vector(n * ldw, 2 + n * 13 + k);
        auto bias = random_vector(n, 3 + n);
        std::vector<float> c(m * ldc, -777.0f);
        gemm_nt(m, n, k, a.data(), lda, w.data(), ldw, bias.data(), c.data(), ldc, &pool);
        for (int i = 0; i < m; ++i)
          for (int j = 0; j < n; ++j) {
            double ref = bias[j], mag = std::fabs(bias[j]);
            for (int p = 0; p < k; ++p) {
              ref += static_cast<double>(a[i * lda + p]) * w[j * ldw + p];
              mag += std::fabs(static_cast<double>(a[i * lda + p]) * w[j * ldw + p]);
            }
            ASSERT_NEAR(c[i * ldc + j], ref, 1e-6 * mag + 1e-7) << "m=" << m << " n=" << n << " k=" << k;
          }
        // Padding columns of the output are left alone.
        for (int i = 0; i < m; ++i) ASSERT_EQ(c[i * ldc + n], -777.0f);
      }
    }
  }
}

TEST(CpuGemm, RowResultIndependentOfBatchRowPositionAndThreads) {
  const int m = 37, n = 301, k = 172;
  auto a = random_vector(m * k, 11);
  auto w = random_vector(n * k, 12);
  std::vector<float> full(m * n);
  ThreadPool pool2(2);
  gemm_nt(m, n, k, a.data(), k, w.data(), k, nullptr, full.data(), n, &pool2);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    // Every row alone, and every window of rows starting at an odd offset, gives the same bits.
    for (int i = 0; i < m; ++i) {
      std::vector<float> row(n);
      gemm_nt(1, n, k, a.data() + i * k, k, w.data(), k, nullptr, row.data(), n, &pool);
      for (int j = 0; j < n; ++j) ASSERT_EQ(row[j], full[i * n + j]) << "row " << i << " col " << j;
    }
    for (int start : {1, 3, 6}) {
      const int rows = m - start;
      std::vector<float> part(rows * n);
      gemm_nt(rows, n, k, a.data() + start * k, k, w.data(), k, nullptr, part.data(), n, &pool);
      for (int i = 0; i < rows * n; ++i) ASSERT_EQ(part[i], full[start * n + i]);
    }
  }
  // A column subset (a different column blocking) gives the same bits too.
  std::vector<float> cols(m * 7);
  gemm_nt(m, 7, k, a.data(), k, w.data() + 100 * k, k, nullptr, cols.data(), 7, nullptr);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < 7; ++j) ASSERT_EQ(cols[i * 7 + j], full[i * n + 100 + j]);
  // dot() is the same arithmetic.
  for (int j = 0; j < n; j += 17) ASSERT_EQ(dot(a.data() + 5 * k, w.data() + j * k, k), full[5 * n + j]);
}

TEST(CpuThreadPool, RunsEveryItemOnceOverManyLoops) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    std::vector<int> hits(1000, 0);
    for (int loop = 0; loop < 2000; ++loop) {
      const int n = 1 + loop % 97;  // short loops back to back, as in a decode step
      std::vector<std::atomic<int>> seen(n);
      pool.parallel_for(n, [&](int i) { seen[i].fetch_add(1); });
      for (int i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << "loop " << loop << " item " << i;
    }
  }
}

TEST(CpuThreadPool, NestedLoopRunsInline) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> seen(8 * 8);
  pool.parallel_for(8, [&](int i) { pool.parallel_for(8, [&](int j) { seen[i * 8 + j].fetch_add(1); }); });
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

TEST(CpuRmsNorm, MatchesFormula) {
  for (int n : {1, 8, 64, 173}) {
    const int rows = 5;
    auto x = random_vector(rows * n, 21 + n, 3.0f);
    auto w = random_vector(n, 22 + n);
    std::vector<float> out(rows * n);
    rms_norm(rows, n, x.data(), n, w.data(), 1e-5f, out.data(), n);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
      const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
      for (int i = 0; i < n; ++i) {
        const double ref = x[r * n + i] * inv * w[i];
        ASSERT_NEAR(out[r * n + i], ref, 2e-6 * std::fabs(ref) + 1e-7);
      }
    }
    // In place gives the same result.
    rms_norm(rows, n, x.data(), n, w.data(), 1e-5f, x.data(), n);
    EXPECT_EQ(x, out);
  }
}

TEST(CpuRope, DefaultInvFreq) {
  RopeConfig rope;
  rope.theta = 100000.0f;
  const int d = 64;
  auto inv = rope_inv_freq(rope, d);
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < d / 2; ++i) EXPECT_NEAR(inv[i], std::pow(100000.0, -2.0 * i / d), 1e-6 * inv[i]);
}

TEST(CpuRope, Llama3ScalingMatchesDirectFormula) {
  RopeConfig rope;  // Llama 3.1 8B values
  rope.theta = 500000.0f;
  rope.type = "llama3";
  rope.factor = 8.0f;
  rope.low_freq_factor = 1.0f;
  rope.high_freq_factor = 4.0f;
  rope.original_max_position_embeddings = 8192;
  const int d = 128;
  auto inv = rope_inv_freq(rope, d);
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < d / 2; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / d);
    const double wavelen = 2 * M_PI / base;
    const double low_wavelen = 8192.0 / 1.0, high_wavelen = 8192.0 / 4.0;
    double ref;
    if (wavelen < high_wavelen) {
      ref = base;
      ++kept;
    } else if (wavelen > low_wavelen) {
      ref = base / 8.0;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      ref = (1 - smooth) * base / 8.0 + smooth * base;
      ++smoothed;
    }
    EXPECT_NEAR(inv[i], ref, 1e-5 * ref) << "i=" << i;
  }
  // The three regimes are all exercised by these parameters.
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(CpuRope, RotatesPairsHalfApart) {
  RopeConfig rope;
  const int d = 16, heads = 3;
  auto inv = rope_inv_freq(rope, d);
  for (int pos : {0, 1, 7, 1000, 4095}) {
    auto x = random_vector(heads * d, 31 + pos);
    auto y = x;
    std::vector<float> cs(d / 2), sn(d / 2);
    rope_cos_sin(pos, inv.data(), d / 2, cs.data(), sn.data());
    apply_rope(y.data(), heads, d, cs.data(), sn.data());
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < d / 2; ++i) {
        const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * i / d);
        const double x1 = x[h * d + i], x2 = x[h * d + i + d / 2];
        // Tolerance: the fp32 angle of a large position carries ~pos * 6e-8 absolute error.
        const double tol = 1e-5 + 2e-7 * pos * (std::fabs(x1) + std::fabs(x2));
        EXPECT_NEAR(y[h * d + i], x1 * std::cos(angle) - x2 * std::sin(angle), tol);
        EXPECT_NEAR(y[h * d + i + d / 2], x2 * std::cos(angle) + x1 * std::sin(angle), tol);
      }
    if (pos == 0) {
      EXPECT_EQ(x, y);
    }
  }
}

TEST(CpuSiluMul, MatchesFormula) {
  const int rows = 3, n = 37;
  auto gu = random_vector(rows * 2 * n, 41, 4.0f);
  gu[0] = -100.0f;  // exp overflow side stays finite (silu -> -0)
  gu[1] = 100.0f;
  std::vector<float> out(rows * n);
  silu_mul(rows, n, gu.data(), gu.data() + n, 2 * n, out.data(), n);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < n; ++i) {
      const double g = gu[r * 2 * n + i], u = gu[r * 2 * n + n + i];
      const double ref = g / (1 + std::exp(-g)) * u;
      ASSERT_TRUE(std::isfinite(out[r * n + i]));
      ASSERT_NEAR(out[r * n + i], ref, 1e-6 * std::fabs(ref) + 1e-6);
    }
}

}  // namespace
}  // namespace origami::cpu
