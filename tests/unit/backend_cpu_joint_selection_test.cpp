// Runtime allocations (ScoreRecipe::allocation kLayer / kGlobal): the joint kept counts
// (backend/cpu/joint_selection.h) against a brute force that hands the scope's remaining total out
// one entry at a time to the head whose next-best entry wins, and a compaction on the CPU backend
// whose kept sets and reported count must be the brute force's.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/joint_selection.h"
#include "backend_cpu_compression_rig.h"

namespace origami::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// a beats b (select_keep's order): higher score, NaN lowest, ties to the larger index.
bool beats(float sa, int a, float sb, int b) {
  if (std::isnan(sa) != std::isnan(sb)) return std::isnan(sb);
  if (!std::isnan(sa) && sa != sb) return sa > sb;
  return a > b;
}

// One head's entries, best first.
std::vector<int> head_order(const std::vector<float>& s) {
  std::vector<int> o(s.size());
  std::iota(o.begin(), o.end(), 0);
  std::stable_sort(o.begin(), o.end(), [&](int a, int b) { return beats(s[a], a, s[b], b); });
  return o;
}

// The brute force: guarantees first, then the remaining total one entry at a time, each to the
// head whose next entry beats every other head's next (ties: the head listed first).
// page_size b > 0: the same walk in that order while the heads' pages, sum of ceil(c_h / b), stay
// within P = max(floor(T / b), the guarantees' pages), stopping at the first entry that would
// exceed it; then every head fills its last page.
std::vector<int> brute_counts(KeepAllocation allocation, const std::vector<int>& layers,
                              const std::vector<std::vector<float>>& scores, int mean_keep, float alpha,
                              int page_size = 0) {
  const size_t heads = scores.size();
  std::vector<int> counts(heads, 0);
  std::vector<int> scope_ids;
  for (size_t i = 0; i < heads; ++i) scope_ids.push_back(allocation == KeepAllocation::kLayer ? layers[i] : 0);
  std::vector<int> distinct = scope_ids;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (int scope : distinct) {
    std::vector<size_t> members;
    for (size_t i = 0; i < heads; ++i)
      if (scope_ids[i] == scope) members.push_back(i);
    long long left = static_cast<long long>(mean_keep) * static_cast<long long>(members.size());
    std::vector<std::vector<int>> order(heads);
    for (size_t i : members) {
      order[i] = head_order(scores[i]);
      const int n = static_cast<int>(scores[i].size());
      int protect = 0;
      for (float x : scores[i]) protect += x == kInf ? 1 : 0;
      counts[i] = std::min(n, std::max(protect, static_cast<int>(std::floor(static_cast<double>(alpha) * mean_keep))));
      left -= counts[i];
    }
    const long long b = page_size;
    auto pages = [&] {
      long long p = 0;
      for (size_t i : members) p += (counts[i] + b - 1) / b;
      return p;
    };
    const long long page_limit =
        b > 0 ? std::max(static_cast<long long>(mean_keep) * static_cast<long long>(members.size()) / b, pages()) : 0;
    for (; b > 0 || left > 0; --left) {
      long best = -1;
      for (size_t i : members) {
        if (counts[i] >= static_cast<int>(scores[i].size())) continue;
        if (best < 0) {
          best = static_cast<long>(i);
          continue;
        }
        const int e = order[i][static_cast<size_t>(counts[i])];
        const int be = order[static_cast<size_t>(best)][static_cast<size_t>(counts[static_cast<size_t>(best)])];
        if (beats(scores[i][static_cast<size_t>(e)], e, scores[static_cast<size_t>(best)][static_cast<size_t>(be)], be))
          best = static_cast<long>(i);
      }
      if (best < 0) break;  // every entry kept
      ++counts[static_cast<size_t>(best)];
      if (b > 0 && pages() > page_limit) {
        --counts[static_cast<size_t>(best)];
        break;
      }
    }
    if (b > 0)
      for (size_t i : members)
        counts[i] = static_cast<int>(std::min<long long>(static_cast<long long>(scores[i].size()), (counts[i] + b - 1) / b * b));
  }
  return counts;
}

// Random heads of 1..60 entries: few distinct values, so that ties across and within heads are
// common; some protected (+inf), some NaN.
void random_heads(std::mt19937& rng, int layers, int kv_heads, std::vector<int>* layer_of,
                  std::vector<std::vector<float>>* scores, std::vector<cpu::HeadSelectionScores>* heads) {
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < kv_heads; ++h) {
      const int n = 1 + static_cast<int>(rng() % 60);
      std::vector<float> s(static_cast<size_t>(n));
      for (float& x : s) x = static_cast<float>(rng() % 7) * 0.25f;
      for (int e = 0; e < n; ++e)
        if (rng() % 9 == 0) s[static_cast<size_t>(e)] = kInf;
      if (rng() % 5 == 0) s[rng() % s.size()] = std::nanf("");
      layer_of->push_back(l);
      scores->push_back(std::move(s));
    }
  for (size_t i = 0; i < scores->size(); ++i)
    heads->push_back({(*layer_of)[i], (*scores)[i].data(), static_cast<int>((*scores)[i].size())});
}

TEST(JointSelection, CountsMatchTheBruteForce) {
  std::mt19937 rng(5);
  int cases = 0;
  for (KeepAllocation allocation : {KeepAllocation::kLayer, KeepAllocation::kGlobal})
    for (int trial = 0; trial < 60; ++trial) {
      const int layers = 1 + trial % 3, kv_heads = 1 + trial % 4;
      std::vector<int> layer_of;
      std::vector<std::vector<float>> scores;
      std::vector<cpu::HeadSelectionScores> heads;
      random_heads(rng, layers, kv_heads, &layer_of, &scores, &heads);
      const int mean_keep = 1 + static_cast<int>(rng() % 40);
      const float alpha = (trial % 4) * 0.25f;
      const std::vector<int> got = cpu::joint_head_counts(allocation, heads, mean_keep, alpha);
      const std::vector<int> want = brute_counts(allocation, layer_of, scores, mean_keep, alpha);
      ASSERT_EQ(got, want) << keep_allocation_name(allocation) << " trial " << trial;
      ++cases;
    }
  EXPECT_EQ(cases, 120);
}

// Page-aligned counts (page sizes 1..8) against the brute force's page walk; every head keeps a
// whole number of pages or all its entries, and the heads' pages never exceed P.
TEST(JointSelection, PageAlignedCountsMatchTheBruteForce) {
  std::mt19937 rng(11);
  int cases = 0, partial_heads = 0;
  for (KeepAllocation allocation : {KeepAllocation::kLayer, KeepAllocation::kGlobal})
    for (int trial = 0; trial < 120; ++trial) {
      const int layers = 1 + trial % 3, kv_heads = 1 + trial % 4, b = 1 + static_cast<int>(rng() % 8);
      std::vector<int> layer_of;
      std::vector<std::vector<float>> scores;
      std::vector<cpu::HeadSelectionScores> heads;
      random_heads(rng, layers, kv_heads, &layer_of, &scores, &heads);
      const int mean_keep = 1 + static_cast<int>(rng() % 40);
      const float alpha = (trial % 4) * 0.25f;
      const std::vector<int> got = cpu::joint_head_counts(allocation, heads, mean_keep, alpha, b);
      const std::vector<int> want = brute_counts(allocation, layer_of, scores, mean_keep, alpha, b);
      ASSERT_EQ(got, want) << keep_allocation_name(allocation) << " trial " << trial << " b " << b;
      for (size_t i = 0; i < got.size(); ++i) {
        const int n = static_cast<int>(scores[i].size());
        ASSERT_TRUE(got[i] % b == 0 || got[i] == n) << "head " << i << " keeps " << got[i] << " of " << n;
        partial_heads += got[i] % b != 0 ? 1 : 0;
      }
      ++cases;
    }
  EXPECT_EQ(cases, 240);
  EXPECT_GT(partial_heads, 0);  // heads kept whole with a partial last page occur
}

// A worked case: two heads of one layer, pages of 2, mean keep 3 (T = 6, P = 3 pages), alpha 0.
// Entry counts: head 0 keeps its 9, 8, 7, 6 and head 1 its 5, 4 (4 and 2). Pages: head 0's 9, 8
// open and fill its first page, 7 opens its second, 6 fills it; head 1's 5 opens the third; then
// head 1's 4 fills it; head 1's 3 would open a fourth: stop: 4 and 2, as the counts. With head
// 0's 6 below head 1's 3 the counts are 3 and 3 (9, 8, 7, 5, 4, 3), the pages still 4 and 2.
TEST(JointSelection, PageAlignedWorkedCase) {
  std::vector<float> a = {9, 8, 7, 6, 1, 0}, b = {5, 4, 3, 2};
  std::vector<cpu::HeadSelectionScores> heads = {{0, a.data(), 6}, {0, b.data(), 4}};
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 3, 0.0f), (std::vector<int>{4, 2}));
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 3, 0.0f, 2), (std::vector<int>{4, 2}));
  a = {9, 8, 7, 2.5f, 1, 0};
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 3, 0.0f), (std::vector<int>{3, 3}));
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 3, 0.0f, 2), (std::vector<int>{4, 2}));
  // Pages of 4: P = floor(6 / 4) = 1: head 0's best page only.
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 3, 0.0f, 4), (std::vector<int>{4, 0}));
}

TEST(JointSelection, SafeguardAndProtectionComeFirst) {
  // Two heads of one layer, mean keep 4: head 0 has every high score, head 1 only low ones and 2
  // protected entries. alpha 0.5 guarantees each head floor(0.5 x 4) = 2 (head 1: its 2 +inf).
  std::vector<float> a = {9, 8, 7, 6, 5, 4}, b = {kInf, 0, kInf, 1, 0};
  std::vector<cpu::HeadSelectionScores> heads = {{0, a.data(), 6}, {0, b.data(), 5}};
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 4, 0.5f), (std::vector<int>{6, 2}));
  // alpha 1: uniform.
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 4, 1.0f), (std::vector<int>{4, 4}));
  // alpha 0: head 1 still keeps its protected entries; the rest goes to head 0's scores.
  EXPECT_EQ(cpu::joint_head_counts(KeepAllocation::kLayer, heads, 4, 0.0f), (std::vector<int>{6, 2}));
}

// A jointly selected job on the CPU backend's paged cache (the one-group layout: the group keeps
// its heads' largest count): the reported count is the brute force's largest, and every
// (layer, KV head) keeps exactly its best that many entries, in order, K and V moved together.
TEST(JointSelection, CompactionKeepsEveryHeadsBestUpToTheGroupsCount) {
  for (KeepAllocation allocation : {KeepAllocation::kLayer, KeepAllocation::kGlobal})
    for (int bs : {16, 7})
      for (bool page_aligned : {false, true}) {
        const int n = 97, mean_keep = 30;
        const int src_pages = (n + bs - 1) / bs;
        Rig rig = make_rig(bs, src_pages + 2, 2, 4, 1);
        std::vector<BlockId> src(src_pages);
        std::iota(src.begin(), src.end(), 1);
        fill_entries(rig, src, 0, n, 77 + bs);
        ScoreRecipe recipe;
        recipe.scorer = Scorer::kKeyNorm;
        recipe.window = 8;
        recipe.num_sinks = 1;
        recipe.allocation = allocation;
        recipe.alpha_safe = 0.2f;
        recipe.page_aligned = page_aligned;  // pages of the cache's block size
        const Snapshot before = snapshot(rig, src, n);
        // The selection scores exactly as the compressor computes them (the same function).
        std::vector<std::vector<float>> scores;
        std::vector<int> layer_of;
        for (int l = 0; l < rig.num_layers; ++l)
          for (int h = 0; h < rig.num_kv_heads; ++h) {
            std::vector<float> s(static_cast<size_t>(n));
            cpu::score_head(recipe, before.k[static_cast<size_t>(l * rig.num_kv_heads + h)].data(), n, rig.head_dim,
                            nullptr, rig.group_size(), rig.scale(), bs, nullptr, 0, true, s.data(), mean_keep,
                            before.v[static_cast<size_t>(l * rig.num_kv_heads + h)].data());
            scores.push_back(std::move(s));
            layer_of.push_back(l);
          }
        const std::vector<int> counts =
            brute_counts(allocation, layer_of, scores, mean_keep, recipe.alpha_safe, page_aligned ? bs : 0);
        const int group_keep = *std::max_element(counts.begin(), counts.end());
        ASSERT_GT(group_keep, mean_keep);  // the counts are not uniform here
        ASSERT_LT(group_keep, n);
        if (page_aligned) {
          ASSERT_EQ(group_keep % bs, 0);  // whole pages (no head keeps all its entries)
        }

        CompressionJob job;
        job.request_id = 3;
        job.src_blocks = &src;
        job.dst_blocks = &src;
        job.num_entries = n;
        job.num_keep = n;  // the destination holds everything; the backend chooses
        job.mean_keep = mean_keep;
        job.recipe = &recipe;
        ASSERT_TRUE(rig.backend->compressor()->begin({job}).is_ok());
        ASSERT_TRUE(rig.backend->compressor()->wait().is_ok());
        ASSERT_EQ(rig.backend->compressor()->kept_entries(), (std::vector<int>{group_keep}));
        const Snapshot after = snapshot(rig, src, group_keep);
        for (int l = 0; l < rig.num_layers; ++l)
          for (int h = 0; h < rig.num_kv_heads; ++h) {
            const size_t i = static_cast<size_t>(l * rig.num_kv_heads + h);
            std::vector<int> want = head_order(scores[i]);
            want.resize(static_cast<size_t>(group_keep));
            std::sort(want.begin(), want.end());
            EXPECT_EQ(recover_keep(rig, before, after, l, h, group_keep), want)
                << keep_allocation_name(allocation) << " bs=" << bs << (page_aligned ? " page-aligned" : "") << " layer "
                << l << " head " << h;
          }
      }
}

TEST(JointSelection, IncompleteJointBatchesAreRefused) {
  Rig rig = make_rig(16, 8, 2, 4, 1);
  std::vector<BlockId> src = {1, 2, 3};
  fill_entries(rig, src, 0, 40, 3);
  ScoreRecipe recipe;
  recipe.scorer = Scorer::kKeyNorm;
  recipe.window = 4;
  recipe.allocation = KeepAllocation::kGlobal;
  CompressionJob job;
  job.request_id = 1;
  job.src_blocks = &src;
  job.dst_blocks = &src;
  job.num_entries = 40;
  job.num_keep = 40;
  job.recipe = &recipe;
  // No average to keep.
  Status st = rig.backend->compressor()->begin({job});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("mean_keep"), std::string::npos) << st.message();
  // The one group listed twice.
  job.mean_keep = 10;
  st = rig.backend->compressor()->begin({job, job});
  EXPECT_FALSE(st.is_ok());
  // A uniform job that names an average.
  recipe.allocation = KeepAllocation::kUniform;
  job.num_keep = 10;
  st = rig.backend->compressor()->begin({job});
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("uniform"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace origami::test
