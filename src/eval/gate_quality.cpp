#include "eval/gate_quality.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "gates/sink_attention_gate.h"

namespace origami::eval {
namespace {

// Ranks 1..n, ties sharing their average rank.
std::vector<double> average_ranks(const std::vector<float>& v) {
  const int n = static_cast<int>(v.size());
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] < v[b]; });
  std::vector<double> ranks(n);
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && v[order[j + 1]] == v[order[i]]) ++j;
    const double r = 0.5 * (i + j) + 1.0;
    for (int k = i; k <= j; ++k) ranks[order[k]] = r;
    i = j + 1;
  }
  return ranks;
}

std::vector<int> topk_indices(const std::vector<float>& v, int k) {
  std::vector<int> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a > b); });
  order.resize(k);
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace

double spearman(const std::vector<float>& a, const std::vector<float>& b) {
  ORIGAMI_CHECK(a.size() == b.size());
  const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
  const double n = static_cast<double>(a.size());
  const double mean = (n + 1.0) / 2.0;
  double cov = 0.0, va = 0.0, vb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  return va > 0.0 && vb > 0.0 ? cov / std::sqrt(va * vb) : 0.0;
}

double topk_overlap(const std::vector<float>& a, const std::vector<float>& b, int k) {
  ORIGAMI_CHECK(a.size() == b.size() && k >= 1 && k <= static_cast<int>(a.size()));
  const std::vector<int> ta = topk_indices(a, k), tb = topk_indices(b, k);
  std::vector<int> common;
  std::set_intersection(ta.begin(), ta.end(), tb.begin(), tb.end(), std::back_inserter(common));
  return static_cast<double>(common.size()) / k;
}

HeadScores gate_head_scores(const gates::GateWeights& gates, const KVzipResult& result) {
  const gates::GateShape& g = gates.shape;
  ORIGAMI_CHECK(static_cast<int>(result.hidden.size()) == g.num_layers);
  const int n = static_cast<int>(result.hidden[0].size() / g.hidden_size);
  HeadScores out(g.num_layers, std::vector<std::vector<float>>(g.num_kv_heads, std::vector<float>(n)));
  std::vector<float> rows(static_cast<size_t>(n) * g.num_kv_heads);
  for (int l = 0; l < g.num_layers; ++l) {
    gates::gate_scores(g, gates.layers[l], result.hidden[l].data(), n, g.hidden_size, rows.data());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < g.num_kv_heads; ++h) out[l][h][t] = rows[static_cast<size_t>(t) * g.num_kv_heads + h];
  }
  return out;
}

void GateQualityMeter::add(const HeadScores& gate, const HeadScores& kvzip) {
  ORIGAMI_CHECK(gate.size() == kvzip.size() && gate.size() == spearman_.size());
  for (size_t l = 0; l < gate.size(); ++l) {
    double rho = 0.0, overlap = 0.0;
    for (size_t h = 0; h < gate[l].size(); ++h) {
      const int skip = std::min<int>(num_sinks_, static_cast<int>(gate[l][h].size()));
      const std::vector<float> a(gate[l][h].begin() + skip, gate[l][h].end());
      const std::vector<float> b(kvzip[l][h].begin() + skip, kvzip[l][h].end());
      if (a.empty()) continue;
      const int k = std::max(1, static_cast<int>(std::ceil(keep_ * static_cast<double>(a.size()) - 1e-9)));
      rho += spearman(a, b);
      overlap += topk_overlap(a, b, k);
    }
    spearman_[l] += rho / static_cast<double>(gate[l].size());
    overlap_[l] += overlap / static_cast<double>(gate[l].size());
  }
  ++documents_;
}

GateQuality GateQualityMeter::result() const {
  GateQuality q;
  q.documents = documents_;
  q.keep = keep_;
  const double docs = std::max(1, documents_);
  for (size_t l = 0; l < spearman_.size(); ++l) {
    q.layer_spearman.push_back(spearman_[l] / docs);
    q.layer_overlap.push_back(overlap_[l] / docs);
    q.spearman += q.layer_spearman.back() / static_cast<double>(spearman_.size());
    q.overlap += q.layer_overlap.back() / static_cast<double>(spearman_.size());
  }
  return q;
}

}  // namespace origami::eval
