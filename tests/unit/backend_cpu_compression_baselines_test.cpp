// The stages the baseline policies added to the CPU score pipeline (backend/cpu/compression_ops.h):
// the KeyDiff scorer against a double-precision brute force, the accumulating global score
// (GlobalMode::kSum, H2O) and the ratio-based recent window (ScoreRecipe::recent_ratio).
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "backend_cpu_compression_naive.h"

namespace origami::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(KeyDiffScorer, MatchesBruteForce) {
  for (int n : {1, 2, 7, 97, 1000})
    for (int d : {16, 64, 128}) {
      auto keys = random_vec(static_cast<size_t>(n) * d, static_cast<uint32_t>(n * 31 + d), 2.0f);
      cpu::ScorerInput in;
      in.keys = keys.data();
      in.n = n;
      in.d = d;
      std::vector<float> got(n, 7.0f);
      cpu::score_base(Scorer::kKeyDiff, in, got.data());
      const std::vector<double> want = naive_keydiff(keys, n, d);
      for (int e = 0; e < n; ++e) {
        ASSERT_GE(got[e], -1.0f - 1e-5f);
        ASSERT_LE(got[e], 1.0f + 1e-5f);
        ASSERT_NEAR(got[e], want[e], 1e-5) << "n=" << n << " d=" << d << " e=" << e;
      }
    }
}

TEST(KeyDiffScorer, TheOddKeyOutWinsWhateverItsNorm) {
  const int d = 2;
  // Three keys along x (norms 1, 2, 3) and one along y: the anchor is (3, 1) / 4, so the y key is
  // the least similar (-cos = -1/sqrt(10)) and the x keys tie at -3/sqrt(10) (norms do not matter).
  std::vector<float> keys = {1, 0, 2, 0, 0, 0.5f, 3, 0};
  cpu::ScorerInput in;
  in.keys = keys.data();
  in.n = 4;
  in.d = d;
  std::vector<float> s(4);
  cpu::score_base(Scorer::kKeyDiff, in, s.data());
  EXPECT_NEAR(s[2], -1.0 / std::sqrt(10.0), 1e-6);
  for (int e : {0, 1, 3}) EXPECT_NEAR(s[e], -3.0 / std::sqrt(10.0), 1e-6) << e;
  std::vector<int32_t> keep(2);
  cpu::select_keep(s.data(), 4, 2, keep.data());
  EXPECT_EQ(keep[0], 2);  // the odd key out, then one of the tied x keys
}

TEST(GlobalScore, SumModeAccumulatesAndNewEntriesStartFromS) {
  std::vector<float> s = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
  std::vector<float> f = {10.0f, 20.0f, 30.0f, -1.0f, -1.0f};  // only the first 3 were scored
  cpu::update_global_scores(s.data(), f.data(), 5, 3, 1.0f, GlobalMode::kSum);
  EXPECT_EQ(s, (std::vector<float>{11.0f, 22.0f, 33.0f, 4.0f, 5.0f}));
  EXPECT_EQ(f, s);
  // With a decay the previous score is scaled first: 0.5 * 11 + 1 = 6.5.
  std::vector<float> s2 = {1.0f, 1.0f};
  cpu::update_global_scores(s2.data(), f.data(), 2, 2, 0.5f, GlobalMode::kSum);
  EXPECT_EQ(s2, (std::vector<float>{6.5f, 12.0f}));
  // The max mode is unchanged: max(0.5 * 6.5, 4) = 4.
  std::vector<float> s3 = {4.0f};
  cpu::update_global_scores(s3.data(), f.data(), 1, 1, 0.5f);
  EXPECT_EQ(s3[0], 4.0f);
}

TEST(RecentRatio, ProtectsTheShareOfTheKeptEntries) {
  ScoreRecipe r;
  r.scorer = Scorer::kZero;
  r.window = 4;
  r.recent_ratio = 0.5f;
  EXPECT_EQ(r.protected_tail(), 4);     // no num_keep: the window alone
  EXPECT_EQ(r.protected_tail(6), 4);    // floor(3) < window
  EXPECT_EQ(r.protected_tail(64), 32);  // half of the kept entries
  EXPECT_EQ(r.protected_tail(65), 32);
  const int n = 80, d = 8;
  auto keys = random_vec(static_cast<size_t>(n) * d, 5);
  std::vector<float> s(n);
  cpu::score_head(r, keys.data(), n, d, nullptr, 1, 1.0f, 16, nullptr, 0, true, s.data(), 64);
  for (int e = 0; e < n; ++e) EXPECT_EQ(s[e], e >= n - 32 ? kInf : 0.0f) << e;
}

// The accumulated score through score_head: F = F_prev + S on scored entries, protection on top.
TEST(GlobalScore, SumModeThroughTheWholePipeline) {
  const int n = 9, d = 4, w = 2;
  ScoreRecipe r;
  r.window = w;
  r.global_decay = 1.0f;
  r.global_mode = GlobalMode::kSum;
  auto keys = random_vec(static_cast<size_t>(n) * d, 11);
  auto q = random_vec(static_cast<size_t>(w) * d, 12);
  std::vector<float> f(n, 0.0f);
  for (int e = 0; e < 5; ++e) f[e] = 0.25f * e;
  std::vector<float> got(n);
  cpu::score_head(r, keys.data(), n, d, q.data(), 1, 0.5f, 4, f.data(), 5, false, got.data(), 6);
  const std::vector<double> attn = naive_window_attention(q, keys, n, w, d, 1, 0.5f);
  for (int e = 0; e < n; ++e) {
    const double want_f = attn[e] + (e < 5 ? 0.25 * e : 0.0);
    EXPECT_NEAR(f[e], want_f, 1e-6) << e;
    if (e >= n - w)
      EXPECT_EQ(got[e], kInf) << e;
    else
      EXPECT_NEAR(got[e], want_f, 1e-6) << e;
  }
}

}  // namespace
}  // namespace origami::test
