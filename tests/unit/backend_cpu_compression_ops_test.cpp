// The compression ops (backend/cpu/compression_ops.h) against naive brute force written here in
// double precision, straight from the documented definitions, on random inputs of odd sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/compression_ops.h"
#include "backend_cpu_compression_naive.h"

namespace origami::cpu {
namespace {

using namespace origami::test;  // the naive brute force

constexpr int kSizes[] = {1, 7, 97, 1000};
constexpr float kInf = std::numeric_limits<float>::infinity();

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::max(1.0, std::abs(want[i])) + 1e-7) << what << " at " << i;
}

TEST(CompressionOps, WindowAttentionMatchesBruteForce) {
  const int d = 64;
  for (int n : kSizes)
    for (int g : {1, 2, 4})
      for (int w : {1, 16}) {
        if (w > n) continue;
        const uint32_t seed = n * 31 + g * 7 + w;
        auto q = random_vec(static_cast<size_t>(w) * g * d, seed);
        auto keys = random_vec(static_cast<size_t>(n) * d, seed + 100);
        const float scale = 1.0f / std::sqrt(static_cast<float>(d));
        std::vector<float> got(n, -1.0f);
        window_attention_scores(q.data(), keys.data(), n, w, d, g, scale, got.data());
        auto want = naive_window_attention(q, keys, n, w, d, g, scale);
        SCOPED_TRACE("n=" + std::to_string(n) + " g=" + std::to_string(g) + " w=" + std::to_string(w));
        expect_close(got, want, 1e-5, "window attention");
        if (g == 1) {  // every query's softmax sums to 1, so the mean over the window does too
          double total = 0;
          for (float x : got) total += x;
          EXPECT_NEAR(total, 1.0, 1e-4);
        }
      }
}

TEST(CompressionOps, WindowAttentionIsCausalInsideTheWindow) {
  // The first window query must not see the entries after it: changing those keys changes
  // nothing of its contribution, so with w = 2 the last entry's score comes from query 1 only.
  const int n = 9, d = 8, w = 2;
  auto q = random_vec(w * d, 5);
  auto keys = random_vec(n * d, 6);
  std::vector<float> out(n);
  window_attention_scores(q.data(), keys.data(), n, w, d, 1, 0.5f, out.data());
  auto want = naive_window_attention(q, keys, n, w, d, 1, 0.5);
  expect_close(out, want, 1e-6, "causal");
  // Query 0 sits at entry n - 2 and sees entries 0..n-2 only.
  std::vector<float> q1(q.begin() + d, q.end());
  std::vector<float> only1(n);
  window_attention_scores(q1.data(), keys.data(), n, 1, d, 1, 0.5f, only1.data());
  EXPECT_NEAR(out[n - 1], only1[n - 1] / 2, 1e-7);
}

TEST(CompressionOps, PoolMatchesBruteForce) {
  for (int n : kSizes)
    for (int kernel : {1, 3, 5, 7})
      for (PoolType type : {PoolType::kMax, PoolType::kAvg}) {
        auto in = random_vec(n, n + kernel);
        std::vector<float> got(n);
        pool_scores(in.data(), n, kernel, type, got.data());
        SCOPED_TRACE("n=" + std::to_string(n) + " kernel=" + std::to_string(kernel));
        const auto want = naive_pool(in, kernel, type);
        expect_close(got, want, 1e-6, "pool");
        if (type == PoolType::kMax) {  // a max is exact
          for (int e = 0; e < n; ++e) ASSERT_EQ(got[e], static_cast<float>(want[e])) << e;
        }
      }
}

TEST(CompressionOps, RedundancyMatchesBruteForce) {
  const int d = 64;
  for (int n : kSizes)
    for (RedundancyMode mode : {RedundancyMode::kFlash, RedundancyMode::kLightning})
      for (int bs : {1, 16, 256}) {
        if (mode == RedundancyMode::kFlash && bs != 16) continue;  // block size only matters for lightning
        auto keys = clustered_keys(n, d, std::max(1, n / 8), n + bs);
        std::vector<float> got(n);
        redundancy_scores(keys.data(), n, d, bs, mode, 0.4f, 0.5f, got.data());
        auto want = naive_redundancy(keys, n, d, bs, mode, 0.4, 0.5);
        SCOPED_TRACE("n=" + std::to_string(n) + " bs=" + std::to_string(bs) +
                     (mode == RedundancyMode::kFlash ? " flash" : " lightning"));
        expect_close(got, want, 1e-4, "redundancy");
        double total = 0;
        for (float x : got) total += x;
        EXPECT_NEAR(total, 1.0, 1e-4);
      }
}

TEST(CompressionOps, RedundancyKeepsTheNewestDuplicate) {
  // Three identical keys and one orthogonal to them. Per column the newest row above the
  // threshold is zeroed: column 0 -> rows 1, 2 exceed, row 2 zeroed; column 1 -> rows 0, 2, row 2
  // zeroed; column 2 -> rows 0, 1, row 1 zeroed. Row sums: 2, 1, 0, 0: the newest copy is the
  // least redundant, so it is the one kept.
  const int d = 4;
  std::vector<float> keys = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, -4, 3, -2, 1};
  std::vector<float> r(4);
  redundancy_scores(keys.data(), 4, d, 16, RedundancyMode::kFlash, 1.0f, 0.5f, r.data());
  EXPECT_GT(r[0], r[1]);
  EXPECT_GT(r[1], r[2]);
  // rowsum / n: 0.5, 0.25, 0, and entry 3: cosines with the others are 0 (orthogonal).
  const double z = std::exp(0.5) + std::exp(0.25) + 2.0;
  EXPECT_NEAR(r[0], std::exp(0.5) / z, 1e-6);
  EXPECT_NEAR(r[1], std::exp(0.25) / z, 1e-6);
  EXPECT_NEAR(r[2], 1.0 / z, 1e-6);
}

TEST(CompressionOps, GlobalScoresAndProtection) {
  for (int n : kSizes) {
    auto s = random_vec(n, n);
    auto f = random_vec(n, n + 1);
    for (float& x : f) x = std::abs(x);
    const int scored = n / 2;
    std::vector<float> s2 = s, f2 = f;
    update_global_scores(s2.data(), f2.data(), n, scored, 0.8f);
    for (int e = 0; e < n; ++e) {
      const float want = e < scored ? std::max(0.8f * f[e], s[e]) : s[e];
      ASSERT_EQ(s2[e], want) << e;
      ASSERT_EQ(f2[e], want) << e;
    }
    auto r = random_vec(n, n + 2);
    std::vector<float> s3 = s;
    protect_scores(s3.data(), r.data(), n, 0.2f, 5, 2);
    for (int e = 0; e < n; ++e) {
      if (e >= n - 5 || e < 2) {
        ASSERT_EQ(s3[e], kInf) << e;
      } else {
        ASSERT_NEAR(s3[e], 0.2 * s[e] - 0.8 * r[e], 1e-6) << e;
      }
    }
  }
}

TEST(CompressionOps, SelectKeepMatchesBruteForceWithTiesInfAndNan) {
  for (int n : kSizes) {
    std::mt19937 rng(n);
    std::vector<float> s(n);
    for (float& x : s) x = static_cast<float>(rng() % 5);  // many exact ties
    for (int e = 0; e < n; e += 11) s[e] = kInf;
    for (int e = 3; e < n; e += 13) s[e] = std::numeric_limits<float>::quiet_NaN();
    for (int e = 5; e < n; e += 17) s[e] = -kInf;
    for (int k : {0, 1, n / 3, n - 1, n}) {
      if (k < 0) continue;
      std::vector<int32_t> got(k);
      select_keep(s.data(), n, k, got.data());
      EXPECT_EQ(got, naive_top_k(s, k)) << "n=" << n << " k=" << k;
    }
  }
  // Ties prefer the newer entry.
  std::vector<float> flat = {1, 1, 1, 1};
  std::vector<int32_t> two(2);
  select_keep(flat.data(), 4, 2, two.data());
  EXPECT_EQ(two, (std::vector<int32_t>{2, 3}));
}

TEST(CompressionOps, ScoreHeadRunsThePipelineInOrder) {
  // attention -> global -> pool -> redundancy -> protection, against the naive pieces.
  const int n = 97, d = 16, g = 2, bs = 16;
  ScoreRecipe recipe;
  recipe.window = 8;
  recipe.num_sinks = 1;
  recipe.pool_kernel = 5;
  recipe.global_decay = 0.8f;
  recipe.redundancy = RedundancyMode::kLightning;
  auto keys = clustered_keys(n, d, 12, 3);
  auto q = random_vec(static_cast<size_t>(recipe.window) * g * d, 4);
  auto f_prev = random_vec(n, 5, 0.01f);
  for (float& x : f_prev) x = std::abs(x);
  const int scored = 60;
  const float scale = 0.25f;
  for (bool first : {true, false}) {
    std::vector<float> f = f_prev, got(n);
    score_head(recipe, keys.data(), n, d, q.data(), g, scale, bs, f.data(), scored, first, got.data());
    auto att = naive_window_attention(q, keys, n, recipe.window, d, g, scale);
    std::vector<float> glob(n);
    for (int e = 0; e < n; ++e)
      glob[e] = static_cast<float>(e < scored ? std::max(0.8 * f_prev[e], att[e]) : att[e]);
    expect_close(f, std::vector<double>(glob.begin(), glob.end()), 1e-5, "F");
    // pool_first_only: pooled at the first compression only.
    std::vector<double> pooled = first ? naive_pool(glob, 5, PoolType::kMax) : std::vector<double>(glob.begin(), glob.end());
    auto r = naive_redundancy(keys, n, d, bs, RedundancyMode::kLightning, recipe.redundancy_tau,
                              recipe.redundancy_threshold);
    std::vector<double> want(n);
    for (int e = 0; e < n; ++e) want[e] = 0.2 * pooled[e] - 0.8 * r[e];
    for (int e = n - recipe.window; e < n; ++e) want[e] = kInf;
    want[0] = kInf;
    for (int e = 0; e < n; ++e) {
      if (std::isinf(want[e])) ASSERT_EQ(got[e], kInf) << e;
      else ASSERT_NEAR(got[e], want[e], 1e-5) << "first=" << first << " e=" << e;
    }
  }
}

TEST(CompressionOps, RecencyKeepsTheNewest) {
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kRecency;
  recipe.window = 4;
  recipe.num_sinks = 2;
  const int n = 50, k = 10;
  std::vector<float> keys(n * 4, 1.0f), s(n);
  score_head(recipe, keys.data(), n, 4, nullptr, 1, 1.0f, 16, nullptr, 0, true, s.data());
  std::vector<int32_t> kept(k);
  select_keep(s.data(), n, k, kept.data());
  EXPECT_EQ(kept, (std::vector<int32_t>{0, 1, 42, 43, 44, 45, 46, 47, 48, 49}));
}

TEST(CompressionOps, CompactEntriesMovesKeptRowsInPlaceAndToFreshPages) {
  // A toy paged array: 12 blocks of [heads=3, bs, row=5]; a sequence on blocks 2, 5, 7, 9, 11.
  for (int bs : {1, 4, 16}) {
    const int heads = 3, row = 5, num_blocks = 12;
    const size_t block_stride = static_cast<size_t>(heads) * bs * row;
    std::vector<BlockId> src = {2, 5, 7, 9, 11};
    const int n = static_cast<int>(src.size()) * bs - (bs > 1 ? 1 : 0);
    auto base = random_vec(block_stride * num_blocks, bs);
    const auto before = base;
    std::mt19937 rng(bs);
    for (int head = 0; head < heads; ++head) {
      std::vector<int32_t> keep;
      for (int e = 0; e < n; ++e)
        if (rng() % 2 || e == n - 1) keep.push_back(e);
      const int k = static_cast<int>(keep.size());
      // Page 0 is replaced by a fresh page (a shared prefix), the rest compacts in place.
      std::vector<BlockId> dst = {3, 5, 7, 9, 11};
      compact_entries(base.data(), block_stride, head, bs, row, src.data(), dst.data(), keep.data(), k);
      auto at = [&](const std::vector<float>& v, BlockId b, int off) {
        return &v[static_cast<size_t>(b) * block_stride + (static_cast<size_t>(head) * bs + off) * row];
      };
      for (int i = 0; i < k; ++i)
        for (int x = 0; x < row; ++x)
          ASSERT_EQ(at(base, dst[i / bs], i % bs)[x], at(before, src[keep[i] / bs], keep[i] % bs)[x])
              << "bs=" << bs << " head=" << head << " i=" << i;
    }
    // Block 2 (the shared page) and the other heads' rows of nothing else were written.
    for (size_t x = 0; x < block_stride; ++x) ASSERT_EQ(base[2 * block_stride + x], before[2 * block_stride + x]);
  }
}

}  // namespace
}  // namespace origami::cpu
