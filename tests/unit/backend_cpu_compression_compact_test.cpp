// The CPU backend's compressor on a real paged cache: after compressing, entry i of head h in
// layer l is bit-exactly the i-th kept source entry, the kept set is a top-num_keep of the naive
// brute-force scores (window entries always kept), shared pages are never written, and the result
// does not depend on the layer stride, the threads or on batching jobs together.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

// `count` consecutive page ids starting at `first`.
std::vector<BlockId> pages(int first, int count) {
  std::vector<BlockId> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

ScoreRecipe full_recipe() {
  ScoreRecipe r;
  r.window = 16;
  r.num_sinks = 2;
  r.pool_kernel = 5;
  r.redundancy = RedundancyMode::kLightning;
  return r;
}

struct Case {
  int block_size;
  int kv_heads;
  int q_heads;
  RedundancyMode redundancy;
  int span = 0;    // ScoreRecipe::redundancy_span
  int recent = 0;  // ScoreRecipe::recent
};

// Over fp32 and the emulated bf16 and fp8 caches: the brute force scores the dequantized entries
// the cache holds, and a kept entry must arrive with its own value (and, in fp8, its own scale:
// rows are matched bit for bit).
class CpuCompressionKV : public ::testing::TestWithParam<KVCacheDType> {};

TEST_P(CpuCompressionKV, CompactionEqualsBruteForceTopKPerHead) {
  const KVCacheDType kv_dtype = GetParam();
  const Case cases[] = {{16, 2, 2, RedundancyMode::kLightning},
                        {16, 2, 4, RedundancyMode::kFlash},
                        {1, 2, 8, RedundancyMode::kLightning},
                        {7, 1, 4, RedundancyMode::kNone},
                        {16, 2, 4, RedundancyMode::kLightning, 40, 25}};
  for (const Case& c : cases) {
    const int n = 97, num_keep = 40;
    const int src_pages = (n + c.block_size - 1) / c.block_size;
    Rig rig = make_rig(c.block_size, src_pages + 2, c.kv_heads, c.q_heads, 2, 2, true, kv_dtype);
    const auto src = pages(1, src_pages);
    fill_entries(rig, src, 0, n, 11);
    fill_slot(rig, 0, 12);
    ScoreRecipe recipe = full_recipe();
    recipe.redundancy = c.redundancy;
    recipe.redundancy_span = c.span;
    recipe.recent = c.recent;
    const Snapshot before = snapshot(rig, src, n);
    // The window's queries, as the brute force needs them (compression does not touch the slot).
    std::vector<std::vector<float>> qs;
    for (int l = 0; l < rig.num_layers; ++l)
      for (int h = 0; h < rig.num_kv_heads; ++h) qs.push_back(window_queries(rig, 0, l, h, n, recipe.window));

    CompressionJob job;
    job.request_id = 5;
    job.src_blocks = &src;
    job.dst_blocks = &src;  // in place
    job.num_entries = n;
    job.num_keep = num_keep;
    job.query_slot = 0;
    job.recipe = &recipe;
    ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
    EXPECT_TRUE(rig.backend->compressor()->done());
    ASSERT_TRUE(rig.backend->compressor()->wait().is_ok());

    const Snapshot after = snapshot(rig, src, num_keep);
    for (int l = 0; l < rig.num_layers; ++l)
      for (int h = 0; h < rig.num_kv_heads; ++h) {
        const std::string where = "bs=" + std::to_string(c.block_size) + " g=" + std::to_string(rig.group_size()) +
                                  " layer " + std::to_string(l) + " head " + std::to_string(h);
        const int i = l * rig.num_kv_heads + h;
        auto scores = naive_scores(recipe, before.k[i], n, rig.head_dim, qs[i], rig.group_size(), rig.scale(),
                                   c.block_size, {}, 0, true, nullptr);
        auto keep = recover_keep(rig, before, after, l, h, num_keep);
        expect_valid_top_k(keep, scores, num_keep, where);
        // The window (last 16) and the sinks (first 2) are all there, at the end and the start.
        EXPECT_EQ(keep[0], 0);
        EXPECT_EQ(keep[1], 1);
        const int tail = std::max(recipe.window, recipe.recent);  // the window and the recent entries
        for (int w = 0; w < tail; ++w) EXPECT_EQ(keep[num_keep - tail + w], n - tail + w);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(KVDTypes, CpuCompressionKV,
                         ::testing::Values(KVCacheDType::kAuto, KVCacheDType::kBF16, KVCacheDType::kFP8),
                         [](const auto& info) { return std::string(kv_cache_dtype_name(info.param)); });

TEST(CpuCompression, RecencyKeepsExactlyTheNewestEntries) {
  const int bs = 16, n = 100, num_keep = 33;
  Rig rig = make_rig(bs, 10, 2, 4, 8);
  const auto src = pages(1, 7);
  fill_entries(rig, src, 0, n, 21);
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kRecency;
  recipe.window = 8;
  recipe.num_sinks = 3;
  const Snapshot before = snapshot(rig, src, n);
  CompressionJob job;
  job.src_blocks = &src;
  job.dst_blocks = &src;
  job.num_entries = n;
  job.num_keep = num_keep;  // no query slot: recency needs no queries
  job.recipe = &recipe;
  ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
  const Snapshot after = snapshot(rig, src, num_keep);
  std::vector<int> want = {0, 1, 2};
  for (int e = n - (num_keep - 3); e < n; ++e) want.push_back(e);
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) EXPECT_EQ(recover_keep(rig, before, after, l, h, num_keep), want);
}

TEST(CpuCompression, SharedLeadingPagesAreReplacedAndNeverWritten) {
  // The sequence sits on pages 1..7; pages 1 and 2 are a shared prefix, so the destination table
  // puts fresh pages 8 and 9 in their place and compacts the rest into page 3 in place.
  const int bs = 16, n = 100, num_keep = 40;
  Rig rig = make_rig(bs, 12, 2, 4, 8);
  const std::vector<BlockId> src = pages(1, 7);
  const std::vector<BlockId> dst = {8, 9, 3};
  fill_entries(rig, src, 0, n, 31);
  fill_slot(rig, 1, 32);
  // Give the shared pages global scores too, to check F is not written there either.
  for (int l = 0; l < rig.num_layers; ++l) {
    auto f = random_vec(rig.kv().score_block_stride() * 3, 33 + l);
    std::memcpy(rig.kv().global_scores(l), f.data(), f.size() * 4);
  }
  auto raw_page = [&](BlockId b) {
    std::vector<float> out;
    for (int l = 0; l < rig.num_layers; ++l) {
      const float* k = rig.kv().keys(l) + static_cast<size_t>(b) * rig.kv().block_stride();
      const float* v = rig.kv().values(l) + static_cast<size_t>(b) * rig.kv().block_stride();
      const float* f = rig.kv().global_scores(l) + static_cast<size_t>(b) * rig.kv().score_block_stride();
      out.insert(out.end(), k, k + rig.kv().block_stride());
      out.insert(out.end(), v, v + rig.kv().block_stride());
      out.insert(out.end(), f, f + rig.kv().score_block_stride());
    }
    return out;
  };
  const auto page1 = raw_page(1), page2 = raw_page(2);
  ScoreRecipe recipe = full_recipe();
  recipe.global_decay = 0.8f;
  const Snapshot before = snapshot(rig, src, n);
  CompressionJob job;
  job.src_blocks = &src;
  job.dst_blocks = &dst;
  job.num_entries = n;
  job.num_keep = num_keep;
  job.query_slot = 1;
  job.recipe = &recipe;
  ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
  EXPECT_EQ(raw_page(1), page1);
  EXPECT_EQ(raw_page(2), page2);
  const Snapshot after = snapshot(rig, dst, num_keep);
  for (int l = 0; l < rig.num_layers; ++l)
    for (int h = 0; h < rig.num_kv_heads; ++h) {
      const int i = l * rig.num_kv_heads + h;
      auto q = window_queries(rig, 1, l, h, n, recipe.window);
      auto scores = naive_scores(recipe, before.k[i], n, rig.head_dim, q, rig.group_size(), rig.scale(), bs, {}, 0,
                                 true, nullptr);
      expect_valid_top_k(recover_keep(rig, before, after, l, h, num_keep), scores, num_keep,
                         "layer " + std::to_string(l) + " head " + std::to_string(h));
    }
}

TEST(CpuCompression, KeepingEverythingInPlaceChangesNothing) {
  const int bs = 16, n = 45;
  Rig rig = make_rig(bs, 5, 2, 4, 8);
  const auto src = pages(1, 3);
  fill_entries(rig, src, 0, n, 41);
  fill_slot(rig, 0, 42);
  const Snapshot before = snapshot(rig, src, n);
  ScoreRecipe recipe = full_recipe();
  CompressionJob job;
  job.src_blocks = &src;
  job.dst_blocks = &src;
  job.num_entries = n;
  job.num_keep = n;
  job.query_slot = 0;
  job.recipe = &recipe;
  ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
  const Snapshot after = snapshot(rig, src, n);
  EXPECT_EQ(before.k, after.k);
  EXPECT_EQ(before.v, after.v);
}

// Two requests compressed in one batch with layer stride 1 on 2 threads, versus one at a time
// with stride 8 on 1 thread: the caches must end bit-identical.
TEST(CpuCompression, LayerStrideThreadsAndBatchingDoNotChangeTheResult) {
  const int bs = 16;
  auto run = [&](int stride, int threads, bool together) {
    Rig rig = make_rig(bs, 16, 2, 4, stride, threads);
    const std::vector<BlockId> a = pages(1, 7), b = pages(8, 4);
    fill_entries(rig, a, 0, 100, 51);
    fill_entries(rig, b, 0, 60, 52);
    fill_slot(rig, 0, 53);
    fill_slot(rig, 1, 54);
    ScoreRecipe ra = full_recipe();
    ra.global_decay = 0.8f;
    ScoreRecipe rb = full_recipe();
    rb.redundancy = RedundancyMode::kFlash;
    rb.window = 8;
    CompressionJob ja, jb;
    ja.request_id = 1;
    ja.src_blocks = ja.dst_blocks = &a;
    ja.num_entries = 100;
    ja.num_keep = 48;
    ja.query_slot = 0;
    ja.recipe = &ra;
    jb.request_id = 2;
    jb.src_blocks = jb.dst_blocks = &b;
    jb.num_entries = 60;
    jb.num_keep = 17;
    jb.query_slot = 1;
    jb.recipe = &rb;
    if (together) {
      EXPECT_TRUE(rig.backend->compressor()->begin({ja, jb}).is_ok());
    } else {
      EXPECT_TRUE(rig.backend->compressor()->begin({ja}).is_ok());
      EXPECT_TRUE(rig.backend->compressor()->begin({jb}).is_ok());
    }
    std::vector<float> all;
    for (int l = 0; l < rig.num_layers; ++l) {
      const size_t floats = rig.kv().block_stride() * rig.kv().num_blocks();
      all.insert(all.end(), rig.kv().keys(l), rig.kv().keys(l) + floats);
      all.insert(all.end(), rig.kv().values(l), rig.kv().values(l) + floats);
      const float* f = rig.kv().global_scores(l);
      all.insert(all.end(), f, f + rig.kv().score_block_stride() * rig.kv().num_blocks());
    }
    return all;
  };
  const auto reference = run(8, 1, false);
  EXPECT_TRUE(run(1, 2, true) == reference);
  EXPECT_TRUE(run(2, 2, true) == reference);
}

}  // namespace
}  // namespace origami::test
