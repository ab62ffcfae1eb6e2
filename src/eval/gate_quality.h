#pragma once
// How well Fast KVzip gates predict the exact KVzip scores they were trained on (docs/gates.md):
// per (layer, KV head) of a document, over its tokens after the sinks (both score those 1),
//   - Spearman's rank correlation between the gate's scores and KVzip's (average ranks for ties);
//   - top-k overlap: the share of KVzip's top k = ceil(keep * n) tokens that the gate's top k
//     also holds (ties broken toward the later token, as selection breaks them);
// averaged over heads, layers and documents.
#include <vector>

#include "eval/kvzip_scorer.h"
#include "gates/gate_weights.h"

namespace origami::eval {

// Spearman's rho of two equally long series (0 when either is constant).
double spearman(const std::vector<float>& a, const std::vector<float>& b);
// |top_k(a) ∩ top_k(b)| / k.
double topk_overlap(const std::vector<float>& a, const std::vector<float>& b, int k);

// The gates' scores over a scored document: [layer][head][token], from result.hidden.
HeadScores gate_head_scores(const gates::GateWeights& gates, const KVzipResult& result);

struct GateQuality {
  int documents = 0;
  double keep = 0.25;
  std::vector<double> layer_spearman;  // mean over heads and documents
  std::vector<double> layer_overlap;
  double spearman = 0.0;               // mean over layers
  double overlap = 0.0;
};

// Accumulates documents (KVzip results with hidden states) and averages at the end.
class GateQualityMeter {
 public:
  GateQualityMeter(int num_layers, double keep, int num_sinks) : keep_(keep), num_sinks_(num_sinks) {
    spearman_.assign(num_layers, 0.0);
    overlap_.assign(num_layers, 0.0);
  }
  void add(const HeadScores& gate, const HeadScores& kvzip);
  GateQuality result() const;

 private:
  double keep_;
  int num_sinks_;
  int documents_ = 0;
  std::vector<double> spearman_, overlap_;  // sums of per-document head means
};

}  // namespace origami::eval
