// PagedEviction's pieces on the CPU backend: the `vknorm` scorer (backend/cpu/scorers/
// vknorm_scorer.cpp) against a double-precision brute force, the block choice
// (backend/cpu/block_eviction.h: mean over entries, layers and KV heads, never the first or the
// last block, NaN lowest, ties to the lower index), a kEvictBlock job through the compressor
// (names the brute-force block, writes nothing) and the validation of such jobs.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "backend/cpu/block_eviction.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

double naive_ratio(const float* k, const float* v, int d) {
  double kk = 0, vv = 0;
  for (int x = 0; x < d; ++x) {
    kk += static_cast<double>(k[x]) * k[x];
    vv += static_cast<double>(v[x]) * v[x];
  }
  return std::sqrt(vv) / std::max(std::sqrt(kk), 1e-6);
}

TEST(VkNormScorer, MatchesBruteForce) {
  for (int n : {1, 7, 97, 1000})
    for (int d : {16, 64, 128}) {
      auto keys = random_vec(static_cast<size_t>(n) * d, static_cast<uint32_t>(n * 13 + d), 3.0f);
      auto values = random_vec(static_cast<size_t>(n) * d, static_cast<uint32_t>(n * 17 + d), 2.0f);
      cpu::ScorerInput in;
      in.keys = keys.data();
      in.values = values.data();
      in.n = n;
      in.d = d;
      std::vector<float> got(n, -1.0f);
      cpu::score_base(Scorer::kValueKeyNorm, in, got.data());
      for (int e = 0; e < n; ++e) {
        const double want = naive_ratio(keys.data() + static_cast<size_t>(e) * d, values.data() + static_cast<size_t>(e) * d, d);
        ASSERT_NEAR(got[e], want, 1e-5 * want + 1e-7) << "n=" << n << " d=" << d << " e=" << e;
      }
    }
}

TEST(VkNormScorer, ZeroKeyScoresFinite) {
  std::vector<float> keys = {0, 0, 3, 4}, values = {1, 0, 0, 5};
  cpu::ScorerInput in;
  in.keys = keys.data();
  in.values = values.data();
  in.n = 2;
  in.d = 2;
  std::vector<float> got(2);
  cpu::score_base(Scorer::kValueKeyNorm, in, got.data());
  EXPECT_FLOAT_EQ(got[0], 1.0f / kVkNormMinKeyNorm);
  EXPECT_FLOAT_EQ(got[1], 1.0f);
}

TEST(BlockEviction, PickNeverFirstOrLastNanLowestTiesLower) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(cpu::pick_evicted_block({0.0, 5.0, 0.0}), 1);          // the only candidate
  EXPECT_EQ(cpu::pick_evicted_block({0.0, 3.0, 2.0, 1.0, 0.0}), 3);  // first and last are lower, never chosen
  EXPECT_EQ(cpu::pick_evicted_block({1.0, 2.0, 2.0, 2.0, 1.0}), 1);  // ties: the lower index
  EXPECT_EQ(cpu::pick_evicted_block({1.0, 0.5, nan, 0.1, 1.0}), 2);  // NaN is lowest
  EXPECT_EQ(cpu::pick_evicted_block({1.0, nan, nan, 0.1, 1.0}), 1);
}

TEST(BlockEviction, JobNamesTheBruteForceBlockAndWritesNothing) {
  const int bs = 16, nb = 7;
  Rig rig = make_rig(bs, 20, 2, 4, 2);
  std::vector<BlockId> table = {3, 9, 4, 12, 7, 15, 1};
  fill_entries(rig, table, 0, nb * bs, 11);
  // A clearly weak block (small values) at index 4, and a weaker first block, never chosen.
  for (int p : {0, 4})
    for (int l = 0; l < rig.num_layers; ++l)
      for (int h = 0; h < rig.num_kv_heads; ++h)
        for (int o = 0; o < bs; ++o) {
          float* v = rig.kv().value_at(l, table[p], h, o);
          for (int x = 0; x < rig.head_dim; ++x) v[x] *= p == 0 ? 0.01f : 0.1f;
        }
  // The brute force over every layer, head and entry.
  std::vector<double> means(nb, 0.0);
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h)
      for (int e = 0; e < nb * bs; ++e)
        means[e / bs] += naive_ratio(rig.kv().key_at(l, table[e / bs], h, e % bs),
                                     rig.kv().value_at(l, table[e / bs], h, e % bs), rig.head_dim) /
                         (rig.num_layers * rig.num_kv_heads * bs);
  const int want = static_cast<int>(std::min_element(means.begin() + 1, means.end() - 1) - means.begin());
  EXPECT_EQ(want, 4);

  ScoreRecipe recipe;
  recipe.scorer = Scorer::kValueKeyNorm;
  CompressionJob job;
  job.kind = CompressionKind::kEvictBlock;
  job.request_id = 1;
  job.src_blocks = &table;
  job.num_entries = nb * bs;
  job.num_keep = (nb - 1) * bs;
  job.recipe = &recipe;
  const std::vector<double> got_means = cpu::block_mean_scores(rig.kv(), job, rig.scale());
  for (int p = 0; p < nb; ++p) EXPECT_NEAR(got_means[p], means[p], 1e-5 * means[p]) << "block " << p;

  const Snapshot before = snapshot(rig, table, nb * bs);
  KVCompressor* compressor = rig.backend->compressor();
  ASSERT_NE(compressor, nullptr);
  const Status st = compressor->begin({job});
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(compressor->wait().is_ok());
  ASSERT_EQ(compressor->evicted_blocks().size(), 1u);
  EXPECT_EQ(compressor->evicted_blocks()[0], want);
  const Snapshot after = snapshot(rig, table, nb * bs);
  EXPECT_TRUE(before.k == after.k && before.v == after.v) << "a block eviction wrote the cache";
}

TEST(BlockEviction, ValidationNamesTheProblem) {
  const int bs = 16;
  Rig rig = make_rig(bs, 20, 2, 4, 2);
  std::vector<BlockId> table = {3, 9, 4, 12};
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kValueKeyNorm;
  CompressionJob job;
  job.kind = CompressionKind::kEvictBlock;
  job.src_blocks = &table;
  job.recipe = &recipe;
  auto expect_error = [&](const CompressionJob& j, const std::string& what) {
    const Status st = rig.backend->compressor()->begin({j});
    EXPECT_FALSE(st.is_ok()) << what;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  job.num_entries = 2 * bs;
  expect_error(job, "at least 3");
  job.num_entries = 3 * bs + 1;
  expect_error(job, "whole blocks");
  job.num_entries = 5 * bs;
  expect_error(job, "src_blocks has 4 pages");
  std::vector<BlockId> outside = {3, 9, 40};
  job.src_blocks = &outside;
  job.num_entries = 3 * bs;
  expect_error(job, "src_blocks[2]");
  job.src_blocks = &table;
  ScoreRecipe attention;  // reads queries: not for block eviction
  job.recipe = &attention;
  expect_error(job, "reads no queries");
}

}  // namespace
}  // namespace origami::test
