// Kara (`kvllm`'s scorer, backend/cpu/scorers/kara_scorer.cpp): Token2Chunk on hand-made score
// vectors (every step of eqs. 5-8 and App. C.3 visible in the expected sets), against the plain
// reference on random vectors, the bidirectional window score against a double-precision brute
// force, and the scorer's output (the kept set as +inf, entries before the window untouched).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "backend_cpu_compression_naive.h"
#include "gtest/gtest.h"

namespace origami::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<int> run_token2chunk(const std::vector<float>& a, int keep, int alpha, int gamma) {
  std::vector<uint8_t> mark(a.size(), 7);
  cpu::token2chunk(a.data(), static_cast<int>(a.size()), keep, alpha, gamma, mark.data());
  std::vector<int> out;
  for (size_t e = 0; e < mark.size(); ++e) {
    EXPECT_TRUE(mark[e] == 0 || mark[e] == 1);
    if (mark[e]) out.push_back(static_cast<int>(e));
  }
  return out;
}

TEST(Token2Chunk, FillsTheBestShortGap) {
  // Discrete: the 3 best (0, 3, 9). Gaps: (0, 3) has 2 inside and 3 < gamma = 4: R = 17 * 2;
  // (3, 9) is 6 apart: no chunk. One chunk (alpha / (gamma - 2) = 1) adds 1 and 2.
  const std::vector<float> a = {9, 1, 1, 8, 0, 0, 0, 0, 0, 7};
  EXPECT_EQ(run_token2chunk(a, 5, 2, 4), (std::vector<int>{0, 1, 2, 3, 9}));
}

TEST(Token2Chunk, FillsUnusedChunkBudgetWithNextBestTokens) {
  // alpha = 4: two chunks allowed but only (0, 3) is a candidate (2 entries); the other 2 go to
  // the best remaining entries: 4..8 tie at 0, so the newest (8, 7).
  const std::vector<float> a = {9, 1, 1, 8, 0, 0, 0, 0, 0, 7};
  EXPECT_EQ(run_token2chunk(a, 7, 4, 4), (std::vector<int>{0, 1, 2, 3, 7, 8, 9}));
}

TEST(Token2Chunk, RanksChunksByEndpointScoresTimesGap) {
  // Discrete (keep 7 - alpha 3 = 4): 0, 2 (5 each), 5, 8 (4 each). Candidates: (0, 2) R = 10 * 1,
  // (2, 5) R = 9 * 2 = 18, (5, 8) R = 8 * 2 = 16. One chunk (3 / 2): (2, 5) adds 3, 4; one more
  // entry to fill: 1, 6, 7, 9 tie at 0 -> 9.
  const std::vector<float> a = {5, 0, 5, 0, 0, 4, 0, 0, 4, 0};
  EXPECT_EQ(run_token2chunk(a, 7, 3, 4), (std::vector<int>{0, 2, 3, 4, 5, 8, 9}));
  // Two chunks (alpha 4): (2, 5) and (5, 8); exactly the budget, nothing to fill.
  EXPECT_EQ(run_token2chunk(a, 8, 4, 4), (std::vector<int>{0, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(Token2Chunk, GapsAsLongAsGammaAreNoChunks) {
  // Discrete 0 and 4 (4 apart): a chunk only if 4 < gamma. gamma = 4: none, the 3 filled by score.
  const std::vector<float> a = {9, 0, 1, 2, 9, 3, 0, 0};
  // Discrete: keep 5 - alpha 3 = 2 -> 0, 4. Fill 3 by score: 5 (3), 3 (2), 2 (1).
  EXPECT_EQ(run_token2chunk(a, 5, 3, 4), (std::vector<int>{0, 2, 3, 4, 5}));
  // gamma = 5: the gap (0, 4) is a chunk (3 inside, within alpha = 3, one chunk): 1, 2, 3.
  EXPECT_EQ(run_token2chunk(a, 5, 3, 5), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(Token2Chunk, TiesGoToTheLaterChunkAndTheNewerEntry) {
  // Discrete 0, 3, 6 (all 5): (0, 3) and (3, 6) both R = 10 * 2; one chunk -> the later, (3, 6).
  const std::vector<float> a = {5, 0, 0, 5, 0, 0, 5, 0};
  EXPECT_EQ(run_token2chunk(a, 5, 2, 4), (std::vector<int>{0, 3, 4, 5, 6}));
}

TEST(Token2Chunk, EdgeBudgets) {
  const std::vector<float> a = {3, 1, 4, 1, 5, 9, 2, 6};
  // Keep everything (or more): all entries.
  EXPECT_EQ(run_token2chunk(a, 8, 2, 4).size(), 8u);
  EXPECT_EQ(run_token2chunk(a, 20, 2, 4).size(), 8u);
  // A budget below alpha: no discrete candidates, no chunks, the best entries by score.
  EXPECT_EQ(run_token2chunk(a, 2, 4, 4), (std::vector<int>{5, 7}));
  EXPECT_TRUE(run_token2chunk(a, 0, 4, 4).empty());
  // alpha = 0: the plain top-k.
  EXPECT_EQ(run_token2chunk(a, 3, 0, 4), (std::vector<int>{4, 5, 7}));
}

TEST(Token2Chunk, MatchesThePlainReferenceOnRandomScores) {
  for (int trial = 0; trial < 200; ++trial) {
    const int m = 1 + trial % 97;
    std::vector<float> a = random_vec(static_cast<size_t>(m), static_cast<uint32_t>(trial + 1));
    // Some exact ties.
    for (int e = 3; e < m; e += 7) a[e] = a[e - 3];
    const int keep = (trial * 13) % (m + 2), alpha = trial % 9, gamma = 3 + trial % 6;
    const std::vector<double> ad(a.begin(), a.end());
    const std::vector<int> want = naive_token2chunk(ad, keep, alpha, gamma);
    ASSERT_EQ(run_token2chunk(a, keep, alpha, gamma), want) << "m " << m << " keep " << keep << " alpha " << alpha
                                                            << " gamma " << gamma;
    ASSERT_EQ(static_cast<int>(want.size()), std::min(keep, m));
  }
}

TEST(KaraWindowScores, MatchBidirectionalBruteForce) {
  for (int g : {1, 2, 4})
    for (int w : {1, 5, 48}) {
      const int m = std::max(1, w - 3), d = 32;
      auto q = random_vec(static_cast<size_t>(w) * g * d, static_cast<uint32_t>(w * 7 + g), 2.0f);
      auto keys = random_vec(static_cast<size_t>(m) * d, static_cast<uint32_t>(w * 11 + g), 2.0f);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      std::vector<float> got(static_cast<size_t>(m));
      cpu::kara_window_scores(q.data(), keys.data(), m, w, d, g, static_cast<float>(scale), got.data());
      const std::vector<double> want = naive_kara_window_scores(q, keys.data(), m, w, d, g, scale);
      double sum = 0;
      for (int e = 0; e < m; ++e) {
        ASSERT_NEAR(got[e], want[e], 1e-5 * std::max(1.0, want[e])) << "g " << g << " w " << w << " e " << e;
        sum += got[e];
      }
      EXPECT_NEAR(sum, w, 1e-3 * w);  // every (query, head) distributes 1 over the region
    }
}

TEST(KaraScorer, KeepsEverythingBeforeTheWindowAndTheBuffer) {
  const int n = 100, d = 32, g = 2, w = 40, u = 8;
  ScoreRecipe r;
  r.scorer = Scorer::kKara;
  r.window = w;
  r.recent = u;
  r.protect_window = false;
  r.window_keep = 12;
  r.chunk_budget = 4;
  r.chunk_max_len = 4;
  auto keys = random_vec(static_cast<size_t>(n) * d, 5, 2.0f);
  auto q = random_vec(static_cast<size_t>(w) * g * d, 6, 2.0f);
  cpu::ScorerInput in;
  in.keys = keys.data();
  in.n = n;
  in.d = d;
  in.window_q = q.data();
  in.w = w;
  in.group_size = g;
  in.scale = 1.0f / std::sqrt(static_cast<float>(d));
  in.recipe = &r;
  std::vector<float> got(n);
  cpu::score_base(Scorer::kKara, in, got.data());
  const std::vector<double> want = naive_kara_scores(r, keys, n, d, q, g, 1.0 / std::sqrt(static_cast<double>(d)));
  int kept = 0;
  for (int e = 0; e < n; ++e) {
    ASSERT_EQ(std::isinf(got[e]), std::isinf(want[e])) << "entry " << e;
    if (e < n - w || e >= n - u) {
      ASSERT_EQ(got[e], kInf) << "entry " << e;
    }
    kept += std::isinf(got[e]) ? 1 : 0;
  }
  EXPECT_EQ(kept, n - (w - u) + r.window_keep);
  // The whole pipeline: protection keeps only the buffer (not the window) beside the scorer's set.
  std::vector<float> full(n);
  cpu::score_head(r, keys.data(), n, d, q.data(), g, in.scale, 16, nullptr, 0, true, full.data());
  for (int e = 0; e < n; ++e) ASSERT_EQ(std::isinf(full[e]), std::isinf(got[e])) << "entry " << e;
}

}  // namespace
}  // namespace origami::test
