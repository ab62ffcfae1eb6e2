// The G-KV global score on the CPU backend: F starts from S at a request's first compression,
// moves with its entry on compaction, and at the next compression becomes
// max(decay * F_prev, S) for the entries scored before, while F of entries written since (here
// garbage) is never read. Checked against the naive brute force.
#include <cstring>
#include <numeric>

#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

// Writes `value` into F of entries [from, to) of a table, every layer and head.
void poison_scores(Rig& rig, const std::vector<BlockId>& table, int from, int to, float value) {
  const int bs = rig.block_size;
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h)
      for (int e = from; e < to; ++e)
        rig.kv().global_scores(l)[static_cast<size_t>(table[e / bs]) * rig.kv().score_block_stride() +
                                  static_cast<size_t>(h) * bs + e % bs] = value;
}

TEST(CpuCompressionGlobal, ScoreMovesWithItsEntryAndDecaysAcrossCompressions) {
  const int bs = 16, n = 100, num_keep = 48;
  Rig rig = make_rig(bs, 20, 2, 4, 2);
  ScoreRecipe recipe;
  recipe.window = 16;
  recipe.global_decay = 0.8f;
  recipe.pool_kernel = 5;  // pooled at the first compression only; F keeps the unpooled score

  // First compression: no entry has a valid F yet.
  const std::vector<BlockId> table1 = {1, 2, 3, 4, 5, 6, 7};
  fill_entries(rig, table1, 0, n, 61);
  fill_slot(rig, 0, 62);
  poison_scores(rig, table1, 0, n, 1e9f);
  const Snapshot before1 = snapshot(rig, table1, n);
  std::vector<std::vector<float>> q1;
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) q1.push_back(window_queries(rig, 0, l, h, n, recipe.window));
  CompressionJob job;
  job.src_blocks = job.dst_blocks = &table1;
  job.num_entries = n;
  job.num_keep = num_keep;
  job.query_slot = 0;
  job.num_scored_entries = 0;
  job.first_compression = true;
  job.recipe = &recipe;
  ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
  const Snapshot after1 = snapshot(rig, table1, num_keep);
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) {
      const int i = l * rig.num_kv_heads + h;
      std::vector<double> f_new;
      auto scores = naive_scores(recipe, before1.k[i], n, rig.head_dim, q1[i], rig.group_size(), rig.scale(), bs,
                                 before1.f[i], 0, true, &f_new);
      auto keep = recover_keep(rig, before1, after1, l, h, num_keep);
      expect_valid_top_k(keep, scores, num_keep, "first, layer " + std::to_string(l));
      for (int e = 0; e < num_keep; ++e)
        ASSERT_NEAR(after1.f[i][e], f_new[keep[e]], 1e-6) << "layer " << l << " head " << h << " entry " << e;
    }

  // Decode on: 52 new entries (on the third page's free half and four new pages), with garbage F.
  const std::vector<BlockId> table2 = {1, 2, 3, 8, 9, 10, 11};
  fill_entries(rig, table2, num_keep, n, 63);
  poison_scores(rig, table2, num_keep, n, 1e9f);
  fill_slot(rig, 0, 64);
  const Snapshot before2 = snapshot(rig, table2, n);
  std::vector<std::vector<float>> q2;
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) q2.push_back(window_queries(rig, 0, l, h, n, recipe.window));
  job.src_blocks = job.dst_blocks = &table2;
  job.num_scored_entries = num_keep;
  job.first_compression = false;
  ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
  const Snapshot after2 = snapshot(rig, table2, num_keep);
  int decayed_wins = 0;  // entries whose F came from the decayed history: the test means something
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) {
      const int i = l * rig.num_kv_heads + h;
      std::vector<double> f_new;
      auto scores = naive_scores(recipe, before2.k[i], n, rig.head_dim, q2[i], rig.group_size(), rig.scale(), bs,
                                 before2.f[i], num_keep, false, &f_new);
      auto attention_only = naive_window_attention(q2[i], before2.k[i], n, recipe.window, rig.head_dim,
                                                   rig.group_size(), rig.scale());
      for (int e = 0; e < num_keep; ++e) decayed_wins += 0.8 * before2.f[i][e] > attention_only[e];
      auto keep = recover_keep(rig, before2, after2, l, h, num_keep);
      expect_valid_top_k(keep, scores, num_keep, "second, layer " + std::to_string(l));
      for (int e = 0; e < num_keep; ++e)
        ASSERT_NEAR(after2.f[i][e], f_new[keep[e]], 1e-6) << "layer " << l << " head " << h << " entry " << e;
    }
  EXPECT_GT(decayed_wins, 0);
}

TEST(CpuCompressionGlobal, CopyBlockCarriesGlobalScores) {
  Rig rig = make_rig(16, 6, 2, 4, 8);
  for (int l = 0; l < rig.num_layers; ++l) {
    float* f = rig.kv().global_scores(l) + 2 * rig.kv().score_block_stride();
    for (size_t x = 0; x < rig.kv().score_block_stride(); ++x) f[x] = static_cast<float>(l * 1000 + x);
  }
  rig.backend->copy_block(0, 2, 4);
  for (int l = 0; l < rig.num_layers; ++l) {
    const float* f = rig.kv().global_scores(l) + 4 * rig.kv().score_block_stride();
    for (size_t x = 0; x < rig.kv().score_block_stride(); ++x) ASSERT_EQ(f[x], static_cast<float>(l * 1000 + x));
  }
}

}  // namespace
}  // namespace origami::test
