#pragma once
// The CPU side of the CUDA compression tests: a paged cache on the host, its device copy and the
// kernels' arguments over it (DeviceGroup), the CPU pipeline of one (job, layer, head) that the
// GPU's scores and kept sets are compared with, and the comparisons (cuda_compression_test.cpp,
// cuda_compression_fp8_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/compression_ops.h"
#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/cuda_compression.h"
#include "cuda_test_util.h"

namespace origami::cuda::testing {

using bf16 = __nv_bfloat16;

inline constexpr double kTol = 1e-2;

inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// A paged cache on the host (bf16-exact floats), laid out as the backend's:
// K, V [L, NB, H, bs, d]; Q [L, M, W, H * G, d]; F [L, NB, H, bs].
struct HostCache {
  int L = 0, NB = 0, H = 0, G = 0, bs = 0, d = 0, M = 0, W = 0;
  std::vector<float> k, v, q, f;
  size_t kv_pitch() const { return static_cast<size_t>(NB) * H * bs * d; }
  size_t q_pitch() const { return static_cast<size_t>(M) * W * H * G * d; }
  size_t f_pitch() const { return static_cast<size_t>(NB) * H * bs; }
  size_t kv_at(int l, int block, int h, int o) const {
    return l * kv_pitch() + ((static_cast<size_t>(block) * H + h) * bs + o) * d;
  }
  size_t f_at(int l, int block, int h, int o) const {
    return l * f_pitch() + (static_cast<size_t>(block) * H + h) * bs + o;
  }
  const float* q_row(int l, int slot, int row) const {
    return q.data() + l * q_pitch() + (static_cast<size_t>(slot) * W + row) * H * G * d;
  }
};

inline HostCache make_cache(int L, int NB, int H, int G, int bs, int d, int M, int W, std::mt19937& rng) {
  HostCache c;
  c.L = L, c.NB = NB, c.H = H, c.G = G, c.bs = bs, c.d = d, c.M = M, c.W = W;
  c.k = random_bf16_values(L * c.kv_pitch(), rng);
  c.v = random_bf16_values(L * c.kv_pitch(), rng);
  c.q = random_bf16_values(L * c.q_pitch(), rng);
  std::uniform_real_distribution<float> u(0.0f, 0.02f);
  c.f.resize(L * c.f_pitch());
  for (float& x : c.f) x = u(rng);
  return c;
}

// Makes about a tenth of a job's keys near-copies of earlier ones (cosine well above 0.5), so
// the redundancy threshold matters.
inline void add_duplicates(HostCache& c, const std::vector<BlockId>& src, int n, std::mt19937& rng) {
  if (n < 2) return;
  std::normal_distribution<float> noise(0.0f, 0.05f);
  for (int l = 0; l < c.L; ++l)
    for (int h = 0; h < c.H; ++h)
      for (int e = 1; e < n; ++e) {
        if (rng() % 10 != 0) continue;
        const int from = static_cast<int>(rng() % e);
        float* dst = c.k.data() + c.kv_at(l, src[e / c.bs], h, e % c.bs);
        const float* s = c.k.data() + c.kv_at(l, src[from / c.bs], h, from % c.bs);
        for (int x = 0; x < c.d; ++x) dst[x] = round_bf16(s[x] + noise(rng));
      }
}

struct DeviceCache {
  std::unique_ptr<DeviceBuffer<bf16>> k, v, q;
  std::unique_ptr<DeviceBuffer<float>> f;
  explicit DeviceCache(const HostCache& c) {
    k = std::make_unique<DeviceBuffer<bf16>>(to_device_bf16(c.k));
    v = std::make_unique<DeviceBuffer<bf16>>(to_device_bf16(c.v));
    q = std::make_unique<DeviceBuffer<bf16>>(to_device_bf16(c.q));
    f = std::make_unique<DeviceBuffer<float>>(c.f);
  }
};

// The kernels' arguments for `jobs` over every layer of `c` (one group), with their scratch.
struct DeviceGroup {
  CompressionPlan plan;
  std::unique_ptr<DeviceBuffer<CompressionJobDesc>> descs;
  std::unique_ptr<DeviceBuffer<int32_t>> chunk_job, span_chunks, pages, keep;
  std::unique_ptr<DeviceBuffer<float>> scores, final_scores, redundancy, norms;
  std::unique_ptr<DeviceBuffer<int2>> z;
  std::unique_ptr<DeviceBuffer<float2>> lse;
  GroupArgs args;

  DeviceGroup(const std::vector<CompressionJob>& jobs, const HostCache& c, DeviceCache& dc) {
    plan = plan_compression(jobs, c.bs, c.L * c.H, c.G);
    descs = std::make_unique<DeviceBuffer<CompressionJobDesc>>(plan.descs);
    chunk_job = std::make_unique<DeviceBuffer<int32_t>>(plan.chunk_job);
    span_chunks = std::make_unique<DeviceBuffer<int32_t>>(plan.span_chunks);
    pages = std::make_unique<DeviceBuffer<int32_t>>(plan.pages);
    keep = std::make_unique<DeviceBuffer<int32_t>>(plan.keep_elems);
    scores = std::make_unique<DeviceBuffer<float>>(plan.score_elems);
    final_scores = std::make_unique<DeviceBuffer<float>>(plan.score_elems);
    redundancy = std::make_unique<DeviceBuffer<float>>(plan.score_elems);
    norms = std::make_unique<DeviceBuffer<float>>(plan.score_elems);
    z = std::make_unique<DeviceBuffer<int2>>(plan.score_elems);
    lse = std::make_unique<DeviceBuffer<float2>>(plan.lse_elems);
    keep->poison();
    final_scores->poison();
    GroupArgs& a = args;
    a.jobs = descs->get();
    a.num_jobs = static_cast<int>(plan.descs.size());
    a.chunk_job = chunk_job->get();
    a.num_chunks = static_cast<int>(plan.chunk_job.size());
    a.span_chunks = span_chunks->get();
    a.num_span_chunks = static_cast<int>(plan.span_chunks.size());
    a.other_redundancy = plan.other_redundancy;
    a.pages = pages->get();
    a.max_window_group = plan.max_window_group;
    a.any_redundancy = plan.any_redundancy;
    a.scorers = plan.scorers;
    a.num_group_layers = c.L;
    a.num_kv_heads = c.H;
    a.group_size = c.G;
    a.head_dim = c.d;
    a.block_size = c.bs;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d));
    a.k = dc.k->get();
    a.v = dc.v->get();
    a.kv_layer_pitch = c.kv_pitch();
    a.q = dc.q->get();
    a.q_layer_pitch = c.q_pitch();
    a.max_window = c.W;
    a.f = dc.f->get();
    a.f_layer_pitch = c.f_pitch();
    a.scores = scores->get();
    a.final_scores = final_scores->get();
    a.redundancy = redundancy->get();
    a.norms = norms->get();
    a.z = z->get();
    a.lse = lse->get();
    a.keep = keep->get();
  }
};

// The CPU pipeline for one (job, layer, head): final scores and the new global scores.
struct CpuRow {
  std::vector<float> final_scores, new_f;
};
inline CpuRow cpu_score_row(const HostCache& c, const CompressionJob& job, int l, int h) {
  const ScoreRecipe& r = *job.recipe;
  const int n = job.num_entries, d = c.d, bs = c.bs;
  const std::vector<BlockId>& src = *job.src_blocks;
  std::vector<float> keys(static_cast<size_t>(n) * d), values(static_cast<size_t>(n) * d);
  for (int e = 0; e < n; ++e) {
    std::copy_n(c.k.data() + c.kv_at(l, src[e / bs], h, e % bs), d, keys.data() + static_cast<size_t>(e) * d);
    std::copy_n(c.v.data() + c.kv_at(l, src[e / bs], h, e % bs), d, values.data() + static_cast<size_t>(e) * d);
  }
  std::vector<float> wq;
  if (r.needs_queries()) {
    const int w = std::min(r.window, n);
    for (int i = 0; i < w; ++i) {
      const float* row = c.q_row(l, job.query_slot, (n - w + i) % c.W) + static_cast<size_t>(h) * c.G * d;
      wq.insert(wq.end(), row, row + static_cast<size_t>(c.G) * d);
    }
  }
  CpuRow out;
  out.new_f.assign(n, 0.0f);
  // Gate scores (fastkvzip) are written with every entry: the CPU compressor counts all as scored.
  const int num_scored = r.gate_scores ? n : job.num_scored_entries;
  for (int e = 0; e < num_scored; ++e) out.new_f[e] = c.f[c.f_at(l, src[e / bs], h, e % bs)];
  out.final_scores.resize(n);
  cpu::score_head(r, keys.data(), n, d, wq.empty() ? nullptr : wq.data(), c.G, 1.0f / std::sqrt(static_cast<float>(d)),
                  bs, r.global_decay > 0.0f ? out.new_f.data() : nullptr, num_scored,
                  job.first_compression, out.final_scores.data(), job.num_keep, values.data());
  return out;
}

// True when the k-th and (k+1)-th best of `s` are apart by more than rounding could move them
// (2e-5 of the row's largest finite magnitude; the GPU's scores differ by a few 1e-6), so any
// correct implementation keeps the same set.
inline bool decided(const std::vector<float>& s, int k) {
  const int n = static_cast<int>(s.size());
  if (k == 0 || k == n) return true;
  std::vector<float> sorted(s);
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  float scale = 0.0f;
  for (float x : s)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(x));
  const float a = sorted[k - 1], b = sorted[k];
  if (std::isinf(a) && !std::isinf(b)) return true;
  return a - b > 2e-5f * scale;
}


// Exact comparison that reports the count and the first difference (not whole arrays).
template <typename T>
inline void expect_same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i]) && !(got[i] != got[i] && want[i] != want[i])) {
      if (bad == 0) first = i;
      ++bad;
    }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ, first at " << first << " ("
                     << (bad ? got[first] : T{}) << " vs " << (bad ? want[first] : T{}) << ")";
}

// Compares one row's final scores: +inf at the same places, finite values within kTol.
inline void expect_scores_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what,
                         double* worst) {
  ASSERT_EQ(got.size(), want.size());
  std::vector<float> g, w;
  for (size_t e = 0; e < got.size(); ++e) {
    ASSERT_EQ(std::isinf(got[e]), std::isinf(want[e])) << what << " entry " << e << ": " << got[e] << " vs " << want[e];
    if (std::isinf(want[e])) continue;
    g.push_back(got[e]);
    w.push_back(want[e]);
  }
  const double err = rel_err(g, w);
  *worst = std::max(*worst, err);
  EXPECT_LT(err, kTol) << what;
}

}  // namespace origami::cuda::testing
