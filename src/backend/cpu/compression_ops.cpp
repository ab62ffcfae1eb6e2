#include "backend/cpu/compression_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {
namespace {

// In-place max-subtracted softmax of x[0, n).
void softmax_inplace(float* x, int n) {
  if (n <= 0) return;
  float m = x[0];
  for (int i = 1; i < n; ++i) m = std::max(m, x[i]);
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace

void window_attention_scores(const float* q, const float* keys, int n, int w, int d, int group_size, float scale,
                             float* out) {
  ORIGAMI_CHECK(w >= 1 && w <= n && group_size >= 1 && d >= 1);
  std::vector<float> p(n), best(n);
  std::fill(out, out + n, 0.0f);
  for (int i = 0; i < w; ++i) {
    const int visible = n - w + i + 1;  // causal: entries 0 .. n - w + i
    std::fill(best.begin(), best.begin() + visible, 0.0f);
    for (int j = 0; j < group_size; ++j) {
      const float* qi = q + (static_cast<size_t>(i) * group_size + j) * d;
      for (int e = 0; e < visible; ++e) p[e] = dot(qi, keys + static_cast<size_t>(e) * d, d) * scale;
      softmax_inplace(p.data(), visible);
      for (int e = 0; e < visible; ++e) best[e] = std::max(best[e], p[e]);
    }
    for (int e = 0; e < visible; ++e) out[e] += best[e];
  }
  for (int e = 0; e < n; ++e) out[e] /= static_cast<float>(w);
}

void kara_window_scores(const float* q, const float* keys, int m, int w, int d, int group_size, float scale,
                        float* out) {
  ORIGAMI_CHECK(w >= 1 && m >= 1 && group_size >= 1 && d >= 1);
  std::vector<float> p(m);
  std::fill(out, out + m, 0.0f);
  const float inv_group = 1.0f / static_cast<float>(group_size);
  for (int i = 0; i < w; ++i) {
    for (int j = 0; j < group_size; ++j) {
      const float* qi = q + (static_cast<size_t>(i) * group_size + j) * d;
      for (int e = 0; e < m; ++e) p[e] = dot(qi, keys + static_cast<size_t>(e) * d, d) * scale;
      softmax_inplace(p.data(), m);
      for (int e = 0; e < m; ++e) out[e] += p[e] * inv_group;
    }
  }
}

bool beats(float sa, int a, float sb, int b) {
  const bool na = std::isnan(sa), nb = std::isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return a > b;
}

namespace {

// Marks the `count` best unmarked entries of a [m] in keep.
void mark_best_unmarked(const float* a, int m, int count, uint8_t* keep) {
  std::vector<int> free_idx;
  for (int e = 0; e < m; ++e)
    if (keep[e] == 0) free_idx.push_back(e);
  count = std::min<int>(count, static_cast<int>(free_idx.size()));
  std::partial_sort(free_idx.begin(), free_idx.begin() + count, free_idx.end(),
                    [&](int x, int y) { return beats(a[x], x, a[y], y); });
  for (int i = 0; i < count; ++i) keep[free_idx[static_cast<size_t>(i)]] = 1;
}

}  // namespace

void token2chunk(const float* a, int m, int num_keep, int chunk_budget, int chunk_max_len, uint8_t* keep) {
  ORIGAMI_CHECK(m >= 0 && num_keep >= 0 && chunk_budget >= 0 && chunk_max_len >= 3);
  std::fill(keep, keep + m, uint8_t{0});
  const int total = std::min(num_keep, m);
  // 1. The discrete candidates.
  mark_best_unmarked(a, m, std::max(total - chunk_budget, 0), keep);
  // 2. Candidate chunks between consecutive candidates.
  struct Chunk {
    float r;
    int k, lo, hi;  // interior entries lo .. hi - 1
  };
  std::vector<Chunk> chunks;
  int prev = -1, k = 0;
  for (int e = 0; e < m; ++e) {
    if (keep[e] == 0) continue;
    if (prev >= 0) {
      const int span = e - prev;
      if (span < chunk_max_len && span >= 2)
        chunks.push_back({(a[prev] + a[e]) * static_cast<float>(span - 1), k, prev + 1, e});
      ++k;
    }
    prev = e;
  }
  const int num_chunks = std::min<int>(chunk_budget / (chunk_max_len - 2), static_cast<int>(chunks.size()));
  std::partial_sort(chunks.begin(), chunks.begin() + num_chunks, chunks.end(),
                    [](const Chunk& x, const Chunk& y) { return beats(x.r, x.k, y.r, y.k); });
  int marked = std::max(total - chunk_budget, 0);
  for (int c = 0; c < num_chunks; ++c)
    for (int e = chunks[static_cast<size_t>(c)].lo; e < chunks[static_cast<size_t>(c)].hi; ++e) {
      keep[e] = 1;
      ++marked;
    }
  // 3. Fill the unused chunk budget with the next-best entries.
  mark_best_unmarked(a, m, total - marked, keep);
}

void recency_scores(int n, float* out) {
  for (int e = 0; e < n; ++e) out[e] = static_cast<float>(e);
}

void pool_scores(const float* in, int n, int kernel, PoolType type, float* out) {
  ORIGAMI_CHECK(kernel >= 1 && kernel % 2 == 1);
  const int half = kernel / 2;
  for (int e = 0; e < n; ++e) {
    const int lo = std::max(0, e - half), hi = std::min(n - 1, e + half);
    if (type == PoolType::kMax) {
      float m = in[lo];
      for (int x = lo + 1; x <= hi; ++x) m = std::max(m, in[x]);
      out[e] = m;
    } else {
      float sum = 0.0f;
      for (int x = lo; x <= hi; ++x) sum += in[x];
      out[e] = sum / static_cast<float>(hi - lo + 1);
    }
  }
}

void update_global_scores(float* s, float* f, int n, int num_scored, float decay, GlobalMode mode) {
  const int scored = std::clamp(num_scored, 0, n);
  if (mode == GlobalMode::kSum) {
    for (int e = 0; e < scored; ++e) {
      const float decayed = decay * f[e];
      s[e] = decayed + s[e];
    }
  } else {
    for (int e = 0; e < scored; ++e) s[e] = std::max(decay * f[e], s[e]);
  }
  std::copy(s, s + n, f);
}

void keydiff_scores(const float* keys, int n, int d, float* out) {
  if (n <= 0) return;
  std::vector<float> inv_norm(n), anchor(d, 0.0f);
  for (int e = 0; e < n; ++e) {
    const float* k = keys + static_cast<size_t>(e) * d;
    inv_norm[e] = 1.0f / std::max(std::sqrt(dot(k, k, d)), 1e-8f);
  }
  for (int e = 0; e < n; ++e) {
    const float* k = keys + static_cast<size_t>(e) * d;
    for (int x = 0; x < d; ++x) anchor[x] += k[x] * inv_norm[e];
  }
  for (int x = 0; x < d; ++x) anchor[x] /= static_cast<float>(n);
  const float inv_anchor = 1.0f / std::max(std::sqrt(dot(anchor.data(), anchor.data(), d)), 1e-8f);
  for (int e = 0; e < n; ++e) {
    const float* k = keys + static_cast<size_t>(e) * d;
    out[e] = -(dot(k, anchor.data(), d) * inv_norm[e]) * inv_anchor;
  }
}

void redundancy_scores(const float* keys, int n, int d, int span, RedundancyMode mode, float tau, float threshold,
                       float* out) {
  ORIGAMI_CHECK(mode != RedundancyMode::kNone && span >= 1 && tau > 0.0f);
  if (n <= 0) return;
  std::vector<float> norm(n);
  for (int e = 0; e < n; ++e) {
    const float* k = keys + static_cast<size_t>(e) * d;
    norm[e] = std::sqrt(dot(k, k, d));
  }
  std::vector<float> rowsum(n, 0.0f), col(n, 0.0f);
  const bool lightning = mode == RedundancyMode::kLightning;
  // Column by column: C[., j] over the considered rows, zero the newest entry above the
  // threshold, add into the row sums (ascending j for every row).
  for (int j = 0; j < n; ++j) {
    const int lo = lightning ? (j / span) * span : 0;
    const int hi = lightning ? std::min(n, lo + span) : n;
    const float* kj = keys + static_cast<size_t>(j) * d;
    for (int i = lo; i < hi; ++i) {
      col[i] = i == j ? 0.0f
                      : dot(keys + static_cast<size_t>(i) * d, kj, d) / std::max(norm[i] * norm[j], 1e-8f);
    }
    for (int i = hi - 1; i >= lo; --i) {
      if (i != j && col[i] > threshold) {
        col[i] = 0.0f;
        break;
      }
    }
    for (int i = lo; i < hi; ++i) rowsum[i] += col[i];
  }
  for (int i = 0; i < n; ++i) {
    float len = static_cast<float>(n);
    if (lightning) {
      const int start = (i / span) * span;
      len = static_cast<float>(std::min(span, n - start));
    }
    out[i] = rowsum[i] / len / tau;
  }
  softmax_inplace(out, n);
}

void protect_scores(float* s, const float* r, int n, float lambda, int window, int num_sinks) {
  if (r) {
    for (int e = 0; e < n; ++e) s[e] = lambda * s[e] - (1.0f - lambda) * r[e];
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const int w = std::clamp(window, 0, n);
  for (int e = n - w; e < n; ++e) s[e] = kInf;
  const int sinks = std::clamp(num_sinks, 0, n);
  for (int e = 0; e < sinks; ++e) s[e] = kInf;
}

void score_head(const ScoreRecipe& recipe, const float* keys, int n, int d, const float* window_q, int group_size,
                float scale, int block_size, float* f, int num_scored, bool first_compression, float* out,
                int num_keep, const float* values) {
  if (n <= 0) return;
  // 1. The base score.
  ScorerInput in;
  in.keys = keys;
  in.values = values;
  in.n = n;
  in.d = d;
  if (recipe.needs_queries()) {
    in.window_q = window_q;
    in.w = std::min(recipe.window, n);
  }
  in.group_size = group_size;
  in.scale = scale;
  in.recipe = &recipe;
  score_base(recipe.scorer, in, out);
  // 2. Global score (F keeps the unpooled score).
  if (recipe.global_decay > 0.0f) {
    ORIGAMI_CHECK(f != nullptr);
    update_global_scores(out, f, n, num_scored, recipe.global_decay, recipe.global_mode);
  }
  // 3. Pooling.
  if (recipe.pool_kernel > 1 && (first_compression || !recipe.pool_first_only)) {
    std::vector<float> pooled(n);
    pool_scores(out, n, recipe.pool_kernel, recipe.pool_type, pooled.data());
    std::copy(pooled.begin(), pooled.end(), out);
  }
  // 4-5. Redundancy and protection.
  std::vector<float> r;
  if (recipe.redundancy != RedundancyMode::kNone) {
    r.resize(n);
    redundancy_scores(keys, n, d, recipe.lightning_span(block_size), recipe.redundancy, recipe.redundancy_tau, recipe.redundancy_threshold,
                      r.data());
  }
  protect_scores(out, r.empty() ? nullptr : r.data(), n, recipe.redundancy_lambda, recipe.protected_tail(num_keep),
                 recipe.num_sinks);
}

void select_keep(const float* s, int n, int k, int32_t* out) {
  ORIGAMI_CHECK(k >= 0 && k <= n);
  if (k == 0) return;
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  // A strict total order: higher score first, NaN last, ties to the larger index.
  auto beats = [s](int32_t a, int32_t b) {
    const bool na = std::isnan(s[a]), nb = std::isnan(s[b]);
    if (na != nb) return nb;
    if (!na && s[a] != s[b]) return s[a] > s[b];
    return a > b;
  };
  if (k < n) std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), beats);
  std::sort(idx.begin(), idx.begin() + k);
  std::copy(idx.begin(), idx.begin() + k, out);
}

void compact_entries(float* base, size_t block_stride, int head, int block_size, int row_floats,
                     const BlockId* src_blocks, const BlockId* dst_blocks, const int32_t* keep, int num_keep) {
  const size_t head_offset = static_cast<size_t>(head) * block_size * row_floats;
  auto row = [&](BlockId block, int offset) {
    return base + static_cast<size_t>(block) * block_stride + head_offset + static_cast<size_t>(offset) * row_floats;
  };
  for (int i = 0; i < num_keep; ++i) {
    const int src = keep[i];
    float* from = row(src_blocks[src / block_size], src % block_size);
    float* to = row(dst_blocks[i / block_size], i % block_size);
    if (from != to) std::memmove(to, from, static_cast<size_t>(row_floats) * sizeof(float));
  }
}

}  // namespace origami::cpu
