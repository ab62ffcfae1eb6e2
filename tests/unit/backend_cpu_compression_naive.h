#pragma once
// Naive brute force of the compression scorers, in double precision, written straight from the
// definitions in backend/cpu/compression_ops.h (and independently of its code), for the
// backend_cpu_compression_* tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kv/compression.h"

namespace origami::test {

inline std::vector<float> random_vec(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

// Keys drawn around a few centres, so that many pairs are near-duplicates (cosine ~0.99) while
// unrelated pairs stay far below the threshold: the zeroing rule is exercised and no similarity
// sits near the threshold, where float and double could disagree.
inline std::vector<float> clustered_keys(int n, int d, int num_centres, uint32_t seed) {
  std::vector<float> centres = random_vec(static_cast<size_t>(num_centres) * d, seed);
  std::vector<float> noise = random_vec(static_cast<size_t>(n) * d, seed + 1, 0.05f);
  std::mt19937 rng(seed + 2);
  std::vector<float> keys(static_cast<size_t>(n) * d);
  for (int e = 0; e < n; ++e) {
    const int c = static_cast<int>(rng() % num_centres);
    for (int x = 0; x < d; ++x) keys[static_cast<size_t>(e) * d + x] = centres[c * d + x] + noise[e * d + x];
  }
  return keys;
}

inline double ddot(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

inline std::vector<double> naive_window_attention(const std::vector<float>& q, const std::vector<float>& keys, int n, int w,
                                           int d, int g, double scale) {
  std::vector<double> out(n, 0.0);
  for (int i = 0; i < w; ++i) {
    std::vector<double> best(n, 0.0);
    for (int j = 0; j < g; ++j) {
      const float* qi = &q[(static_cast<size_t>(i) * g + j) * d];
      std::vector<double> logits(n, -std::numeric_limits<double>::infinity());
      double m = -std::numeric_limits<double>::infinity();
      for (int e = 0; e <= n - w + i; ++e) {
        logits[e] = ddot(qi, &keys[static_cast<size_t>(e) * d], d) * scale;
        m = std::max(m, logits[e]);
      }
      double z = 0;
      for (int e = 0; e <= n - w + i; ++e) z += std::exp(logits[e] - m);
      for (int e = 0; e <= n - w + i; ++e) best[e] = std::max(best[e], std::exp(logits[e] - m) / z);
    }
    for (int e = 0; e < n; ++e) out[e] += best[e] / w;
  }
  return out;
}

inline std::vector<double> naive_pool(const std::vector<float>& in, int kernel, PoolType type) {
  const int n = static_cast<int>(in.size());
  std::vector<double> out(n);
  for (int e = 0; e < n; ++e) {
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    int count = 0;
    for (int x = e - kernel / 2; x <= e + kernel / 2; ++x) {
      if (x < 0 || x >= n) continue;
      m = std::max(m, static_cast<double>(in[x]));
      sum += in[x];
      ++count;
    }
    out[e] = type == PoolType::kMax ? m : sum / count;
  }
  return out;
}

// K-norm: -|k_e| per entry, in double.
inline std::vector<double> naive_key_norm_scores(const std::vector<float>& keys, int n, int d) {
  std::vector<double> s(n);
  for (int e = 0; e < n; ++e) {
    const float* k = keys.data() + static_cast<size_t>(e) * d;
    s[e] = -std::sqrt(ddot(k, k, d));
  }
  return s;
}

// The full similarity matrix, then the documented zeroing, row sums, normalisation and softmax.
inline std::vector<double> naive_redundancy(const std::vector<float>& keys, int n, int d, int bs, RedundancyMode mode,
                                     double tau, double threshold) {
  const bool lightning = mode == RedundancyMode::kLightning;
  std::vector<std::vector<double>> c(n, std::vector<double>(n, 0.0));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (i == j || (lightning && i / bs != j / bs)) continue;
      const float* a = &keys[static_cast<size_t>(i) * d];
      const float* b = &keys[static_cast<size_t>(j) * d];
      c[i][j] = ddot(a, b, d) / std::max(std::sqrt(ddot(a, a, d)) * std::sqrt(ddot(b, b, d)), 1e-8);
    }
  for (int j = 0; j < n; ++j)
    for (int i = n - 1; i >= 0; --i)
      if (c[i][j] > threshold) {  // zero entries (diagonal, other blocks) never exceed threshold >= 0
        c[i][j] = 0;
        break;
      }
  std::vector<double> r(n);
  double m = -std::numeric_limits<double>::infinity();
  for (int i = 0; i < n; ++i) {
    double sum = 0;
    for (int j = 0; j < n; ++j) sum += c[i][j];
    const double len = lightning ? std::min(bs, n - (i / bs) * bs) : n;
    r[i] = sum / len / tau;
    m = std::max(m, r[i]);
  }
  double z = 0;
  for (double& x : r) z += (x = std::exp(x - m));
  for (double& x : r) x /= z;
  return r;
}

// Top k by repeated linear scans: the best remaining entry under (score desc, NaN last, index desc).
inline std::vector<int32_t> naive_top_k(const std::vector<float>& s, int k) {
  const int n = static_cast<int>(s.size());
  std::vector<char> taken(n, 0);
  std::vector<int32_t> out;
  for (int round = 0; round < k; ++round) {
    int best = -1;
    for (int e = 0; e < n; ++e) {
      if (taken[e]) continue;
      if (best < 0) {
        best = e;
        continue;
      }
      // e (the later index) replaces best unless it scores lower: NaN is below every number.
      const bool en = std::isnan(s[e]), bn = std::isnan(s[best]);
      bool lower;
      if (en || bn) lower = en && !bn;
      else lower = s[e] < s[best];
      if (!lower) best = e;
    }
    taken[best] = 1;
    out.push_back(best);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// KeyDiff in double: -cos(k_e, mean of the unit keys).
inline std::vector<double> naive_keydiff(const std::vector<float>& keys, int n, int d) {
  std::vector<double> anchor(d, 0.0), out(n);
  for (int e = 0; e < n; ++e) {
    const float* k = keys.data() + static_cast<size_t>(e) * d;
    const double norm = std::sqrt(ddot(k, k, d));
    for (int x = 0; x < d; ++x) anchor[x] += k[x] / norm / n;
  }
  double an = 0;
  for (double a : anchor) an += a * a;
  an = std::sqrt(an);
  for (int e = 0; e < n; ++e) {
    const float* k = keys.data() + static_cast<size_t>(e) * d;
    double dot = 0;
    for (int x = 0; x < d; ++x) dot += k[x] * anchor[x];
    out[e] = -dot / (std::sqrt(ddot(k, k, d)) * an);
  }
  return out;
}

// Token2Chunk (Kara eqs. 5-8, App. C.3) written out plainly: the (keep - alpha) best entries by
// a (ties to the newer), the floor(alpha / (gamma - 2)) best gaps between consecutive ones that
// are shorter than gamma, by (a_i + a_j) * gap (ties to the later gap), filled, and the rest of
// the budget to the best remaining entries. The kept indices of a, ascending.
inline std::vector<int> naive_token2chunk(const std::vector<double>& a, int keep, int alpha, int gamma) {
  const int m = static_cast<int>(a.size());
  keep = std::min(keep, m);
  auto better = [&](int x, int y) { return a[x] != a[y] ? a[x] > a[y] : x > y; };
  std::vector<int> order(static_cast<size_t>(m));
  for (int e = 0; e < m; ++e) order[e] = e;
  std::sort(order.begin(), order.end(), better);
  std::vector<char> kept(static_cast<size_t>(m), 0);
  std::vector<int> disc;
  for (int i = 0; i < std::max(keep - alpha, 0); ++i) kept[order[i]] = 1;
  for (int e = 0; e < m; ++e)
    if (kept[e]) disc.push_back(e);
  struct Gap {
    double r;
    int k, lo, hi;
  };
  std::vector<Gap> gaps;
  for (size_t k = 0; k + 1 < disc.size(); ++k) {
    const int span = disc[k + 1] - disc[k];
    if (span < gamma && span >= 2)
      gaps.push_back({(a[disc[k]] + a[disc[k + 1]]) * (span - 1), static_cast<int>(k), disc[k] + 1, disc[k + 1]});
  }
  std::sort(gaps.begin(), gaps.end(), [](const Gap& x, const Gap& y) { return x.r != y.r ? x.r > y.r : x.k > y.k; });
  int count = static_cast<int>(disc.size());
  for (size_t g = 0; g < gaps.size() && static_cast<int>(g) < alpha / (gamma - 2); ++g)
    for (int e = gaps[g].lo; e < gaps[g].hi; ++e, ++count) kept[e] = 1;
  for (int e : order) {
    if (count >= keep) break;
    if (!kept[e]) {
      kept[e] = 1;
      ++count;
    }
  }
  std::vector<int> out;
  for (int e = 0; e < m; ++e)
    if (kept[e]) out.push_back(e);
  return out;
}

// Kara's importance: q [w, g, d], keys [m, d] (the region) -> A [m], the bidirectional softmax of
// every (query, head) over all m keys, summed over the queries, the group's heads averaged.
inline std::vector<double> naive_kara_window_scores(const std::vector<float>& q, const float* keys, int m, int w,
                                                    int d, int g, double scale) {
  std::vector<double> a(static_cast<size_t>(m), 0.0);
  for (int i = 0; i < w; ++i)
    for (int j = 0; j < g; ++j) {
      const float* qi = q.data() + (static_cast<size_t>(i) * g + j) * d;
      std::vector<double> logit(static_cast<size_t>(m));
      double mx = -std::numeric_limits<double>::infinity();
      for (int e = 0; e < m; ++e) {
        double dot = 0;
        for (int x = 0; x < d; ++x) dot += static_cast<double>(qi[x]) * keys[static_cast<size_t>(e) * d + x];
        logit[e] = dot * scale;
        mx = std::max(mx, logit[e]);
      }
      double z = 0;
      for (int e = 0; e < m; ++e) z += std::exp(logit[e] - mx);
      for (int e = 0; e < m; ++e) a[e] += std::exp(logit[e] - mx) / z / g;
    }
  return a;
}

// The kara scorer's output: +inf before the window, for the Token2Chunk-kept region entries and
// the buffer; A for the others.
inline std::vector<double> naive_kara_scores(const ScoreRecipe& r, const std::vector<float>& keys, int n, int d,
                                             const std::vector<float>& q, int g, double scale) {
  const int w = std::min(r.window, n), start = n - w, m = std::max(w - r.recent, 0);
  std::vector<double> s(static_cast<size_t>(n), std::numeric_limits<double>::infinity());
  if (m == 0) return s;
  const std::vector<double> a = naive_kara_window_scores(q, keys.data() + static_cast<size_t>(start) * d, m, w, d, g, scale);
  for (int e = 0; e < m; ++e) s[start + e] = a[e];
  for (int e : naive_token2chunk(a, r.window_keep, r.chunk_budget, r.chunk_max_len))
    s[start + e] = std::numeric_limits<double>::infinity();
  return s;
}

// The whole documented pipeline for one (layer, KV head): base score, global score (f_new gets
// the new F), pooling, redundancy, +inf protection. f_prev: [n], read below num_scored.
inline std::vector<double> naive_scores(const ScoreRecipe& r, const std::vector<float>& keys, int n, int d,
                                        const std::vector<float>& q, int g, double scale, int bs,
                                        const std::vector<float>& f_prev, int num_scored, bool first,
                                        std::vector<double>* f_new, int num_keep = 0) {
  std::vector<double> s(n, 0.0);
  switch (r.scorer) {
    case Scorer::kZero: break;
    case Scorer::kAttention: s = naive_window_attention(q, keys, n, std::min(r.window, n), d, g, scale); break;
    case Scorer::kRecency:
      for (int e = 0; e < n; ++e) s[e] = e;
      break;
    case Scorer::kKeyNorm: s = naive_key_norm_scores(keys, n, d); break;
    case Scorer::kKeyDiff: s = naive_keydiff(keys, n, d); break;
    case Scorer::kKara: s = naive_kara_scores(r, keys, n, d, q, g, scale); break;
    case Scorer::kValueKeyNorm:
      // ||v|| / ||k|| needs the values, which this twin is not given: PagedEviction's scorer has its
      // own brute force. Every s stays NaN, so a comparison made with this twin fails at once.
      s.assign(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN());
      break;
  }
  if (r.global_decay > 0) {
    for (int e = 0; e < std::min(num_scored, n); ++e) {
      const double prev = r.global_decay * static_cast<double>(f_prev[e]);
      s[e] = r.global_mode == GlobalMode::kSum ? prev + s[e] : std::max(prev, s[e]);
    }
    if (f_new) *f_new = s;
  }
  if (r.pool_kernel > 1 && (first || !r.pool_first_only)) {
    std::vector<float> as_float(s.begin(), s.end());
    s = naive_pool(as_float, r.pool_kernel, r.pool_type);
  }
  if (r.redundancy != RedundancyMode::kNone) {
    const int span = r.redundancy_span > 0 ? r.redundancy_span : bs;
    auto red = naive_redundancy(keys, n, d, span, r.redundancy, r.redundancy_tau, r.redundancy_threshold);
    for (int e = 0; e < n; ++e) s[e] = r.redundancy_lambda * s[e] - (1.0 - r.redundancy_lambda) * red[e];
  }
  const double inf = std::numeric_limits<double>::infinity();
  for (int e = std::max(0, n - r.protected_tail(num_keep)); e < n; ++e) s[e] = inf;
  for (int e = 0; e < std::min(r.num_sinks, n); ++e) s[e] = inf;
  return s;
}

}  // namespace origami::test
