// The CUDA joint selection of runtime allocations (src/backend/cuda/joint_selection.h) against
// cpu::joint_head_counts (the brute-force-tested reference, tests/unit/
// backend_cpu_joint_selection_test.cpp):
//   - the kernels on crafted selection scores (ties everywhere, NaN, -0 / +0, +inf protected
//     entries, -inf, heads with fewer entries than the guarantee), kLayer and kGlobal, several
//     requests in one group, as one group (a job per request, rows = layers x heads) and as
//     per-head pages (a job per (layer, KV head)): every head's count equals the CPU's exactly,
//     each job keeps its heads' largest, and the selection keeps cpu::select_keep of that count;
//   - the driver (CudaCompressor::begin) on a paged cache, a uniform and two joint requests in one
//     batch: the kept counts come back with the batch (kept_entries()) equal to the CPU's, and the
//     compaction moves exactly the entries the CPU pipeline keeps (K, V, F bit-exact);
//   - the same, page-aligned (ScoreRecipe::page_aligned: the page objective's threshold);
//   - a timing at the Qwen3-8B shape: a batch of AdaKV's recipe, uniform against kLayer and
//     kGlobal (every layer scored first, then the joint counts) through the driver.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/joint_selection.h"
#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/cuda_compression.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/joint_selection.h"
#include "compressor_test_util.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::from_device_bf16;
using testing::random_bf16_values;
using testing::to_device_bf16;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Selection scores of one head of `n` entries in one of several styles.
std::vector<float> crafted_scores(int n, int style, std::mt19937& rng) {
  const float pool[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, kNaN, 3.0f, -kInf, 1e-30f};
  std::vector<float> s(static_cast<size_t>(n));
  for (int e = 0; e < n; ++e) {
    switch (style % 5) {
      case 0: s[e] = pool[rng() % (sizeof(pool) / sizeof(pool[0]))]; break;            // ties everywhere
      case 1: s[e] = static_cast<float>(static_cast<int>(rng() % 100000)) * 1e-3f; break;  // mostly distinct
      case 2: s[e] = 0.25f; break;                                                         // all equal
      case 3: s[e] = static_cast<float>(static_cast<int>(rng() % 7)) - 3.0f; break;        // few levels
      default: s[e] = static_cast<float>(static_cast<int>(rng() % 1000)) * 0.01f + 2.0f; break;  // skewed up
    }
  }
  // Protected entries (+inf): a trailing window, sometimes sinks, sometimes the whole head.
  const int window = std::min(n, static_cast<int>(rng() % 6));
  for (int e = n - window; e < n; ++e) s[e] = kInf;
  if (style % 3 == 0 && n > 2) s[0] = s[1] = kInf;
  if (style % 11 == 7) std::fill(s.begin(), s.end(), kInf);
  return s;
}

// One head of a request: its (layer, KV head) and scores.
struct Head {
  int layer, head;
  std::vector<float> scores;
};

// The CPU's counts for one request's heads (any order): cpu::joint_head_counts in (layer, head) order.
// page_size > 0: page-aligned.
std::vector<int> cpu_counts(KeepAllocation allocation, const std::vector<Head>& heads, int mean_keep, float alpha,
                            int page_size = 0) {
  std::vector<size_t> order(heads.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::make_pair(heads[a].layer, heads[a].head) < std::make_pair(heads[b].layer, heads[b].head);
  });
  std::vector<cpu::HeadSelectionScores> in;
  for (size_t i : order) in.push_back({heads[i].layer, heads[i].scores.data(), static_cast<int>(heads[i].scores.size())});
  const std::vector<int> sorted = cpu::joint_head_counts(allocation, in, mean_keep, alpha, page_size);
  std::vector<int> out(heads.size());
  for (size_t x = 0; x < order.size(); ++x) out[order[x]] = sorted[x];
  return out;
}

// The kernels alone: a group of jobs whose final scores are uploaded directly; page_aligned: the
// counts in pages of bs.
void check_kernels(KeepAllocation allocation, bool per_head, int trial, bool page_aligned = false, int bs = 16) {
  SCOPED_TRACE(std::string("allocation ") + keep_allocation_name(allocation) + (per_head ? " per-head" : " one group") +
               " trial " + std::to_string(trial) + (page_aligned ? " page-aligned bs " + std::to_string(bs) : ""));
  std::mt19937 rng(100 + trial * 7 + (per_head ? 1 : 0) + (allocation == KeepAllocation::kLayer ? 50 : 0) +
                   (page_aligned ? 1000 + bs : 0));
  const int L = 3, H = 2;
  const int num_requests = 3;
  std::vector<ScoreRecipe> recipes(num_requests);
  std::vector<int> mean_keep(num_requests);
  std::vector<CompressionJob> jobs;
  std::vector<std::vector<Head>> heads(num_requests);  // per request
  std::vector<std::pair<int, int>> job_head;             // per-head layout: the job's (layer, head)
  std::vector<std::unique_ptr<std::vector<BlockId>>> tables;
  for (int r = 0; r < num_requests; ++r) {
    recipes[r].scorer = Scorer::kZero;
    recipes[r].allocation = allocation;
    recipes[r].alpha_safe = r == 0 ? 0.2f : r == 1 ? 0.0f : 1.0f;
    recipes[r].page_aligned = page_aligned;
    const int base_n = trial == 0 ? 1 + static_cast<int>(rng() % 40) : 1 + static_cast<int>(rng() % 700);
    mean_keep[r] = 1 + static_cast<int>(rng() % static_cast<unsigned>(base_n + 8));  // above n too, sometimes
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        // Per-head pages: heads of one request differ in length (some below the guarantee).
        const int n = per_head ? std::max(1, base_n - static_cast<int>(rng() % static_cast<unsigned>(base_n))) : base_n;
        heads[r].push_back({l, h, crafted_scores(n, static_cast<int>(rng() % 1000), rng)});
      }
    auto add_job = [&](int n, int group) {
      tables.push_back(std::make_unique<std::vector<BlockId>>((n + bs - 1) / bs, 1));
      CompressionJob job;
      job.request_id = 7 + r;
      job.group = group;
      job.src_blocks = tables.back().get();
      job.dst_blocks = tables.back().get();
      job.num_entries = n;
      job.num_keep = n;
      job.mean_keep = mean_keep[r];
      job.num_scored_entries = n;
      job.recipe = &recipes[r];
      jobs.push_back(job);
    };
    if (per_head) {
      for (const Head& hd : heads[r]) {
        add_job(static_cast<int>(hd.scores.size()), hd.layer * H + hd.head);
        job_head.emplace_back(hd.layer, hd.head);
      }
    } else {
      add_job(base_n, 0);
    }
  }
  // A per-head job order that is not (layer, head) order: the scope sorts its heads.
  if (per_head) {
    std::vector<size_t> perm(jobs.size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<CompressionJob> shuffled;
    std::vector<std::pair<int, int>> shuffled_head;
    for (size_t p : perm) {
      shuffled.push_back(jobs[p]);
      shuffled_head.push_back(job_head[p]);
    }
    jobs = shuffled;
    job_head = shuffled_head;
  }
  const int rows_per_job = per_head ? 1 : L * H;
  const CompressionPlan plan = plan_compression(jobs, bs, rows_per_job, 1);
  ASSERT_EQ(plan.descs.size(), jobs.size());
  std::vector<const CompressionJob*> desc_jobs;
  for (const CompressionJob& j : jobs) desc_jobs.push_back(&j);
  const JointPlan jp = plan_joint_selection(desc_jobs, rows_per_job, [&](int d, int lh) {
    return per_head ? job_head[static_cast<size_t>(d)] : std::make_pair(lh / H, lh % H);
  });
  ASSERT_EQ(jp.members.size(), static_cast<size_t>(num_requests * L * H));
  ASSERT_EQ(jp.scopes.size(), static_cast<size_t>(allocation == KeepAllocation::kLayer ? num_requests * L : num_requests));

  // Each row's scores and head (request, index in heads[r]).
  std::vector<float> final_scores(plan.score_elems);
  std::vector<std::pair<int, int>> row_owner(jobs.size() * rows_per_job);
  for (size_t d = 0; d < jobs.size(); ++d)
    for (int lh = 0; lh < rows_per_job; ++lh) {
      const int r = static_cast<int>(jobs[d].request_id) - 7;
      const std::pair<int, int> lhd = per_head ? job_head[d] : std::make_pair(lh / H, lh % H);
      const int idx = lhd.first * H + lhd.second;
      const std::vector<float>& s = heads[r][idx].scores;
      ASSERT_EQ(static_cast<int>(s.size()), plan.descs[d].n);
      std::copy(s.begin(), s.end(), final_scores.begin() + plan.descs[d].score0 + static_cast<size_t>(lh) * s.size());
      row_owner[d * rows_per_job + lh] = {r, idx};
    }
  DeviceBuffer<CompressionJobDesc> descs(plan.descs);
  DeviceBuffer<int32_t> pages(plan.pages), keep(plan.keep_elems), members(jp.members);
  DeviceBuffer<float> dev_scores(final_scores);
  DeviceBuffer<JointScope> scopes(jp.scopes);
  DeviceBuffer<int32_t> guaranteed(jp.members.size()), head_counts(jp.members.size()), kept(jobs.size());
  DeviceBuffer<unsigned long long> cut(jp.members.size());
  keep.poison();
  head_counts.poison();
  kept.poison();
  GroupArgs a;
  a.jobs = descs.get();
  a.num_jobs = static_cast<int>(plan.descs.size());
  a.pages = pages.get();
  a.num_group_layers = per_head ? 1 : L;
  a.num_kv_heads = per_head ? 1 : H;
  a.group_size = 1;
  a.head_dim = 32;
  a.block_size = bs;
  a.final_scores = dev_scores.get();
  a.keep = keep.get();
  a.kept_counts = kept.get();
  JointArgs ja;
  ja.scopes = scopes.get();
  ja.num_scopes = static_cast<int>(jp.scopes.size());
  ja.members = members.get();
  ja.num_members = static_cast<int>(jp.members.size());
  ja.guaranteed = guaranteed.get();
  ja.cut = cut.get();
  ja.head_counts = head_counts.get();
  ja.kept_counts = kept.get();
  ASSERT_EQ(launch_joint_counts(a, ja, nullptr), cudaSuccess);
  ASSERT_EQ(launch_compression_select(a, nullptr), cudaSuccess);
  const std::vector<int32_t> got_heads = head_counts.download();
  const std::vector<int32_t> got_kept = kept.download();
  const std::vector<int32_t> got_keep = keep.download();

  std::vector<std::vector<int>> want(num_requests);
  for (int r = 0; r < num_requests; ++r)
    want[r] = cpu_counts(allocation, heads[r], mean_keep[r], recipes[r].alpha_safe, page_aligned ? bs : 0);
  std::vector<int> want_kept(jobs.size(), 0);
  for (size_t m = 0; m < jp.members.size(); ++m) {
    const std::pair<int, int> owner = row_owner[static_cast<size_t>(jp.members[m])];
    EXPECT_EQ(got_heads[m], want[owner.first][owner.second])
        << "request " << owner.first << " head " << owner.second << " (n " << heads[owner.first][owner.second].scores.size()
        << ", mean_keep " << mean_keep[owner.first] << ")";
    const size_t d = static_cast<size_t>(jp.members[m] / rows_per_job);
    want_kept[d] = std::max(want_kept[d], want[owner.first][owner.second]);
  }
  for (size_t d = 0; d < jobs.size(); ++d) {
    ASSERT_EQ(got_kept[d], want_kept[d]) << "job " << d;
    const CompressionJobDesc& jd = plan.descs[d];
    for (int lh = 0; lh < rows_per_job; ++lh) {
      std::vector<int32_t> w(static_cast<size_t>(want_kept[d]));
      cpu::select_keep(final_scores.data() + jd.score0 + static_cast<size_t>(lh) * jd.n, jd.n, want_kept[d], w.data());
      const auto first = got_keep.begin() + jd.keep0 + static_cast<ptrdiff_t>(lh) * jd.num_keep;
      EXPECT_EQ(std::vector<int32_t>(first, first + want_kept[d]), w) << "job " << d << " row " << lh;
    }
  }
  // The totals: a scope (a layer, or the request) keeps its mean x heads unless its guarantees
  // exceed that or it runs out of entries.
  for (int r = 0; r < num_requests; ++r)
    for (int l = 0; l < L; ++l) {
      if (allocation == KeepAllocation::kGlobal && l > 0) break;
      long long sum = 0, entries = 0, heads_in_scope = 0;
      for (size_t i = 0; i < heads[r].size(); ++i) {
        if (allocation == KeepAllocation::kLayer && heads[r][i].layer != l) continue;
        sum += want[r][i];
        entries += static_cast<long long>(heads[r][i].scores.size());
        ++heads_in_scope;
        if (page_aligned) {  // whole pages, or every entry
          EXPECT_TRUE(want[r][i] % bs == 0 || want[r][i] == static_cast<int>(heads[r][i].scores.size()))
              << "request " << r << " head " << i << " keeps " << want[r][i];
        }
      }
      if (page_aligned) continue;  // floor(T / b) pages may hold less than T
      EXPECT_LE(std::min<long long>(static_cast<long long>(mean_keep[r]) * heads_in_scope, entries), sum)
          << "request " << r << " layer " << l;
    }
}

TEST(CudaJointSelection, CountsAndSelectionMatchCpu) {
  for (KeepAllocation allocation : {KeepAllocation::kLayer, KeepAllocation::kGlobal})
    for (bool per_head : {false, true})
      for (int trial = 0; trial < 4; ++trial) check_kernels(allocation, per_head, trial);
}

// Page-aligned (ScoreRecipe::page_aligned): the page objective's threshold, at pages of 16 and of 5.
TEST(CudaJointSelection, PageAlignedCountsAndSelectionMatchCpu) {
  for (KeepAllocation allocation : {KeepAllocation::kLayer, KeepAllocation::kGlobal})
    for (bool per_head : {false, true})
      for (int bs : {16, 5})
        for (int trial = 0; trial < 4; ++trial) check_kernels(allocation, per_head, trial, true, bs);
}

// The driver: one group layout (K, V [L, NB, H, bs, d], F [L, NB, H, bs]) whose F holds the
// selection scores (scorer kZero, global decay 1, kSum: S = F exactly), a uniform job and two joint
// requests (kLayer, kGlobal) in one batch over 3 layers with layer_stride 1 (the joint batch is
// scored over every layer anyway).
void check_driver(bool page_aligned) {
  SCOPED_TRACE(page_aligned ? "page-aligned" : "entry counts");
  std::mt19937 rng(77);
  const int L = 3, H = 2, G = 2, d = 64, bs = 16, W = 8;
  const int ns[] = {200, 333, 150};
  const KeepAllocation allocs[] = {KeepAllocation::kUniform, KeepAllocation::kLayer, KeepAllocation::kGlobal};
  const int keeps[] = {90, 0, 0};  // uniform num_keep
  const int means[] = {0, 60, 40};
  int pages_total = 0;
  for (int n : ns) pages_total += (n + bs - 1) / bs;
  const int NB = pages_total + 2;
  const size_t kv_pitch = static_cast<size_t>(NB) * H * bs * d, f_pitch = static_cast<size_t>(NB) * H * bs;
  std::vector<float> k = random_bf16_values(L * kv_pitch, rng), v = random_bf16_values(L * kv_pitch, rng);
  std::vector<float> f(L * f_pitch, 0.0f);
  std::vector<ScoreRecipe> recipes(3);
  std::vector<std::vector<BlockId>> src(3), dst(3);
  std::vector<CompressionJob> jobs(3);
  int next = 1;
  for (int j = 0; j < 3; ++j) {
    recipes[j].scorer = Scorer::kZero;
    recipes[j].global_decay = 1.0f;
    recipes[j].global_mode = GlobalMode::kSum;
    recipes[j].window = 4;
    recipes[j].num_sinks = j;  // protected entries beside the window
    recipes[j].allocation = allocs[j];
    recipes[j].page_aligned = page_aligned;
    const int pages = (ns[j] + bs - 1) / bs;
    for (int p = 0; p < pages; ++p) src[j].push_back(next++);
    jobs[j].request_id = 40 + j;
    jobs[j].num_entries = ns[j];
    jobs[j].num_keep = allocs[j] == KeepAllocation::kUniform ? keeps[j] : ns[j];
    jobs[j].mean_keep = means[j];
    jobs[j].num_scored_entries = ns[j];
    jobs[j].first_compression = false;
    jobs[j].recipe = &recipes[j];
    dst[j].assign(src[j].begin(), src[j].begin() + (jobs[j].num_keep + bs - 1) / bs);
    jobs[j].src_blocks = &src[j];
    jobs[j].dst_blocks = &dst[j];
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        int style = static_cast<int>(rng() % 1000) * 5 + 1 + (l + h) % 2 * 3;
        if (style % 11 == 7) ++style;  // not a head of +inf alone: the joint jobs must evict
        const std::vector<float> s = crafted_scores(ns[j], style, rng);
        for (int e = 0; e < ns[j]; ++e)
          f[l * f_pitch + (static_cast<size_t>(src[j][e / bs]) * H + h) * bs + e % bs] = std::isnan(s[e]) ? 0.5f : s[e];
      }
  }
  DeviceBuffer<__nv_bfloat16> dk(to_device_bf16(k)), dv(to_device_bf16(v));
  cudaStream_t main_stream;
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&main_stream, cudaStreamNonBlocking));
  CudaCompressor comp(main_stream);
  const CudaCompressor::Geometry g = testing::one_group_geometry(L, H, G, d, bs, NB, dk.get(),
                                                               dv.get(), kv_pitch);
  const CompressionConfig config = testing::compression_config(1, W, true, 1);
  ASSERT_TRUE(comp.configure(config, g).is_ok());
  ORIGAMI_CUDA_CHECK(cudaMemcpy(comp.global_scores(), f.data(), f.size() * 4, cudaMemcpyHostToDevice));
  const Status st = comp.begin(jobs);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_TRUE(comp.wait().is_ok());
  ORIGAMI_CUDA_CHECK(cudaStreamDestroy(main_stream));

  // The CPU: each row's selection scores (F, protection), the joint counts, select and compact.
  std::vector<int> want_kept(3);
  std::vector<float> want_k = k, want_v = v, want_f = f;
  for (int j = 0; j < 3; ++j) {
    const int n = ns[j];
    std::vector<Head> heads;
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        std::vector<float> s(n);
        for (int e = 0; e < n; ++e) s[e] = f[l * f_pitch + (static_cast<size_t>(src[j][e / bs]) * H + h) * bs + e % bs];
        for (int e = 0; e < n; ++e)
          if (e >= n - recipes[j].protected_tail(means[j]) || e < recipes[j].num_sinks) s[e] = kInf;
        heads.push_back({l, h, s});
      }
    if (allocs[j] == KeepAllocation::kUniform) {
      want_kept[j] = keeps[j];
    } else {
      const std::vector<int> counts = cpu_counts(allocs[j], heads, means[j], recipes[j].alpha_safe, page_aligned ? bs : 0);
      want_kept[j] = *std::max_element(counts.begin(), counts.end());
      EXPECT_LT(want_kept[j], n) << "job " << j << ": the test should leave something to evict";
    }
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h) {
        const std::vector<float>& s = heads[static_cast<size_t>(l * H + h)].scores;
        std::vector<int32_t> keep(static_cast<size_t>(want_kept[j]));
        cpu::select_keep(s.data(), n, want_kept[j], keep.data());
        cpu::compact_entries(want_k.data() + l * kv_pitch, static_cast<size_t>(H) * bs * d, h, bs, d, src[j].data(),
                             dst[j].data(), keep.data(), want_kept[j]);
        cpu::compact_entries(want_v.data() + l * kv_pitch, static_cast<size_t>(H) * bs * d, h, bs, d, src[j].data(),
                             dst[j].data(), keep.data(), want_kept[j]);
        std::vector<float> old_f(n);
        for (int e = 0; e < n; ++e) old_f[e] = f[l * f_pitch + (static_cast<size_t>(src[j][e / bs]) * H + h) * bs + e % bs];
        for (int i = 0; i < want_kept[j]; ++i)
          want_f[l * f_pitch + (static_cast<size_t>(dst[j][i / bs]) * H + h) * bs + i % bs] = old_f[keep[i]];
      }
  }
  ASSERT_EQ(comp.kept_entries().size(), 3u);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(comp.kept_entries()[j], want_kept[j]) << "job " << j;
  std::printf("[joint selection] driver: kept %d (uniform), %d (layer, mean 60), %d (global, mean 40)\n",
              comp.kept_entries()[0], comp.kept_entries()[1], comp.kept_entries()[2]);
  const std::vector<float> got_k = from_device_bf16(dk.download()), got_v = from_device_bf16(dv.download());
  std::vector<float> got_f(f.size());
  ORIGAMI_CUDA_CHECK(cudaMemcpy(got_f.data(), comp.global_scores(), got_f.size() * 4, cudaMemcpyDeviceToHost));
  // Compare what each job keeps (its destination's first kept entries; pages past them are the
  // scheduler's to trim and hold stale entries on both sides alike).
  size_t kv_bad = 0, f_bad = 0;
  for (int j = 0; j < 3; ++j)
    for (int l = 0; l < L; ++l)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < want_kept[j]; ++i) {
          const size_t at = l * kv_pitch + ((static_cast<size_t>(dst[j][i / bs]) * H + h) * bs + i % bs) * d;
          for (int x = 0; x < d; ++x) kv_bad += got_k[at + x] != want_k[at + x] || got_v[at + x] != want_v[at + x];
          const size_t fa = l * f_pitch + (static_cast<size_t>(dst[j][i / bs]) * H + h) * bs + i % bs;
          f_bad += !(got_f[fa] == want_f[fa]);
        }
  EXPECT_EQ(kv_bad, 0u);
  EXPECT_EQ(f_bad, 0u);
}

TEST(CudaJointSelection, DriverKeepsTheCpuCountsAndEntries) {
  check_driver(false);
  check_driver(true);
}


// The cost of a joint batch at the Qwen3-8B shape (36 layers, 8 KV heads, GQA 4, d 128, block
// 256): 16 requests of 4096 entries with SnapKV's recipe (window 32, max pooling 7) keeping an
// average of 1024 per head, uniform (layer_stride 8) against kLayer and kGlobal (one group of all
// 36 layers, the joint counts, then selection and compaction of each job's count), and kGlobal
// page-aligned (the page objective's threshold).
TEST(CudaJointSelection, TimingAtQwen3_8BShape) {
  if (testing::small_test_sizes()) GTEST_SKIP() << "a timing, not a check";
  const int L = 36, H = 8, G = 4, d = 128, bs = 256, W = 32, n = 4096, jobs_n = 16, keep = 1024;
  const int pages = n / bs, NB = jobs_n * pages + 2;
  const size_t kv_pitch = static_cast<size_t>(NB) * H * bs * d;
  DeviceBuffer<__nv_bfloat16> k(kv_pitch * L), v(kv_pitch * L);
  launch_fill_random_bf16(k.get(), kv_pitch * L, 1.0f, 0.0f, 1, nullptr);
  launch_fill_random_bf16(v.get(), kv_pitch * L, 1.0f, 0.0f, 2, nullptr);
  CudaCompressor comp(nullptr);
  const CudaCompressor::Geometry g = testing::one_group_geometry(L, H, G, d, bs, NB, k.get(),
                                                               v.get(), kv_pitch);
  const CompressionConfig config = testing::compression_config(jobs_n, W, false, 8);
  ASSERT_TRUE(comp.configure(config, g).is_ok());
  launch_fill_random_bf16(comp.query_cache(), comp.query_layer_pitch() * L, 1.0f, 0.0f, 3, nullptr);
  std::vector<std::vector<BlockId>> tables(jobs_n);
  for (int j = 0; j < jobs_n; ++j)
    for (int p = 0; p < pages; ++p) tables[j].push_back(1 + j * pages + p);
  for (int variant = 0; variant < 4; ++variant) {
    const KeepAllocation allocation = variant == 0 ? KeepAllocation::kUniform
                                      : variant == 1 ? KeepAllocation::kLayer
                                                     : KeepAllocation::kGlobal;
    ScoreRecipe recipe;
    recipe.window = W;
    recipe.pool_kernel = 7;
    recipe.allocation = allocation;
    recipe.page_aligned = variant == 3;
    std::vector<CompressionJob> jobs(jobs_n);
    for (int j = 0; j < jobs_n; ++j) {
      jobs[j].request_id = j;
      jobs[j].src_blocks = &tables[j];
      jobs[j].dst_blocks = &tables[j];
      jobs[j].num_entries = n;
      jobs[j].num_keep = allocation == KeepAllocation::kUniform ? keep : n;
      jobs[j].mean_keep = allocation == KeepAllocation::kUniform ? 0 : keep;
      jobs[j].query_slot = j;
      jobs[j].recipe = &recipe;
    }
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {  // the first grows the scratch; the best of the others
      ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
      const auto t0 = std::chrono::steady_clock::now();
      const Status st = comp.begin(jobs);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      ASSERT_TRUE(comp.wait().is_ok());
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::min(best, ms);
    }
    int kept_max = 0;
    for (int x : comp.kept_entries()) kept_max = std::max(kept_max, x);
    std::printf("BENCH joint selection %d x n=%d (36 layers x 8 KV heads, d=128, b=256), SnapKV recipe, average "
                "keep %d: allocation %-7s%s %.2f ms (largest job count %d)\n",
                jobs_n, n, keep, keep_allocation_name(allocation), recipe.page_aligned ? " page-aligned" : "", best,
                kept_max);
    EXPECT_GE(kept_max, keep);
  }
}

}  // namespace
}  // namespace origami::cuda
