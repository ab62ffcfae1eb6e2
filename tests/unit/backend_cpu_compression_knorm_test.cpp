// The K-norm scorer (backend/cpu/scorers/knorm_scorer.cpp) and the `knorm` recipe end to end on
// the CPU backend: the scorer against a double-precision brute force, the whole score pipeline
// (protection, combination with the shared stages) against the naive pipeline, and a compaction
// that must keep exactly the brute-force top-k of every (layer, KV head).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(KnormScorer, MatchesBruteForce) {
  for (int n : {1, 7, 97, 1000})
    for (int d : {16, 64, 128}) {
      auto keys = random_vec(static_cast<size_t>(n) * d, static_cast<uint32_t>(n * 13 + d), 3.0f);
      cpu::ScorerInput in;
      in.keys = keys.data();
      in.n = n;
      in.d = d;
      std::vector<float> got(n, 1.0f);
      cpu::score_base(Scorer::kKeyNorm, in, got.data());
      const std::vector<double> want = naive_key_norm_scores(keys, n, d);
      for (int e = 0; e < n; ++e) {
        ASSERT_LE(got[e], 0.0f);
        ASSERT_NEAR(got[e], want[e], 1e-5 * std::abs(want[e]) + 1e-7) << "n=" << n << " d=" << d << " e=" << e;
      }
    }
}

TEST(KnormScorer, SmallestNormWinsAndZeroKeyScoresZero) {
  const int d = 4;
  // Norms 5, 0, 1, 13: the zero key scores highest (-0), then norm 1, 5, 13.
  std::vector<float> keys = {3, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 5, 0, 12, 0};
  cpu::ScorerInput in;
  in.keys = keys.data();
  in.n = 4;
  in.d = d;
  std::vector<float> s(4);
  cpu::score_base(Scorer::kKeyNorm, in, s.data());
  EXPECT_EQ(s, (std::vector<float>{-5.0f, 0.0f, -1.0f, -13.0f}));
  std::vector<int32_t> keep(2);
  cpu::select_keep(s.data(), 4, 2, keep.data());
  EXPECT_EQ(keep, (std::vector<int32_t>{1, 2}));
}

TEST(KnormScorer, PipelineMatchesNaiveScores) {
  const int d = 32;
  for (int n : {1, 7, 97}) {
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kKeyNorm;
    recipe.window = 4;
    recipe.num_sinks = 2;
    for (RedundancyMode mode : {RedundancyMode::kNone, RedundancyMode::kLightning}) {
      recipe.redundancy = mode;
      auto keys = clustered_keys(n, d, 5, static_cast<uint32_t>(n + 1));
      std::vector<float> got(n);
      // No queries: knorm must not read them.
      cpu::score_head(recipe, keys.data(), n, d, nullptr, 2, 0.1f, 16, nullptr, 0, true, got.data());
      auto want = naive_scores(recipe, keys, n, d, {}, 2, 0.1, 16, {}, 0, true, nullptr);
      for (int e = 0; e < n; ++e) {
        if (std::isinf(want[e])) ASSERT_EQ(got[e], kInf) << e;
        else ASSERT_NEAR(got[e], want[e], 1e-5 * std::max(1.0, std::abs(want[e]))) << "n=" << n << " e=" << e;
      }
    }
  }
}

// The `knorm` policy's recipe on the CPU backend's paged cache: no query slot, and every
// (layer, KV head) keeps exactly the brute-force top-k (sinks and recent window included), in
// order, K and V moved together.
TEST(KnormScorer, CompactionKeepsExactlyTheBruteForceTopK) {
  for (int bs : {16, 7}) {
    const int n = 97, num_keep = 40;
    const int src_pages = (n + bs - 1) / bs;
    Rig rig = make_rig(bs, src_pages + 2, 2, 4, 2);
    std::vector<BlockId> src(src_pages);
    std::iota(src.begin(), src.end(), 1);
    fill_entries(rig, src, 0, n, 41 + bs);
    // What `knorm` with window=8, sinks=1 builds (policy_registry_test checks the mapping).
    ScoreRecipe recipe;
    recipe.scorer = Scorer::kKeyNorm;
    recipe.window = 8;
    recipe.num_sinks = 1;
    const Snapshot before = snapshot(rig, src, n);

    CompressionJob job;
    job.request_id = 3;
    job.src_blocks = &src;
    job.dst_blocks = &src;
    job.num_entries = n;
    job.num_keep = num_keep;  // query_slot stays -1: knorm needs no queries
    job.recipe = &recipe;
    ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
    ASSERT_TRUE(rig.backend->compressor()->wait().is_ok());
    const Snapshot after = snapshot(rig, src, num_keep);

    for (int l = 0; l < rig.num_layers; ++l)
      for (int h = 0; h < rig.num_kv_heads; ++h) {
        const std::string where = "bs=" + std::to_string(bs) + " layer " + std::to_string(l) + " head " + std::to_string(h);
        const int i = l * rig.num_kv_heads + h;
        const std::vector<double> scores =
            naive_scores(recipe, before.k[i], n, rig.head_dim, {}, rig.group_size(), rig.scale(), bs, {}, 0, true, nullptr);
        // The brute-force top-k, by a stable sort of the scores (ties to the newer entry).
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a > b; });
        // The cut must not fall on a near-tie, or float rounding could legitimately pick the other.
        ASSERT_GT(scores[order[num_keep - 1]] - scores[order[num_keep]], 1e-4) << where;
        std::vector<int> want(order.begin(), order.begin() + num_keep);
        std::sort(want.begin(), want.end());
        EXPECT_EQ(recover_keep(rig, before, after, l, h, num_keep), want) << where;
        EXPECT_EQ(want.front(), 0) << where;  // the sink
        for (int w = 0; w < 8; ++w) EXPECT_EQ(want[num_keep - 8 + w], n - 8 + w) << where;  // the window
      }
  }
}

}  // namespace
}  // namespace origami::test
