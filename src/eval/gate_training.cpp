#include "eval/gate_training.h"

namespace origami::eval {

void append_training_rows(const KVzipResult& result, gates::GateTrainingSet* set) {
  const gates::GateShape& shape = set->shape;
  const int n = static_cast<int>(result.hidden[0].size() / shape.hidden_size);
  // Targets as rows [token][head].
  std::vector<std::vector<float>> targets(shape.num_layers,
                                          std::vector<float>(static_cast<size_t>(n) * shape.num_kv_heads));
  for (int l = 0; l < shape.num_layers; ++l)
    for (int h = 0; h < shape.num_kv_heads; ++h)
      for (int t = 0; t < n; ++t) targets[l][static_cast<size_t>(t) * shape.num_kv_heads + h] = result.scores[l][h][t];
  set->append(result.hidden, targets, n);
}

Expected<std::vector<KVzipResult>> score_samples(KVzipScorer& scorer, const std::vector<CalibrationSample>& samples,
                                                 gates::GateTrainingSet* set,
                                                 const std::function<void(size_t)>& progress) {
  std::vector<KVzipResult> kept;
  for (size_t i = 0; i < samples.size(); ++i) {
    Expected<KVzipResult> r = scorer.score(samples[i].token_ids, /*keep_hidden=*/true);
    if (!r) return Status(r.status().code(), samples[i].origin + ": " + r.status().message());
    if (set != nullptr)
      append_training_rows(*r, set);
    else
      kept.push_back(std::move(*r));
    if (progress) progress(i);
  }
  return kept;
}

GateQuality measure_gate_quality(const gates::GateWeights& gates, const std::vector<KVzipResult>& results,
                                 double keep, int num_sinks) {
  GateQualityMeter meter(gates.shape.num_layers, keep, num_sinks);
  for (const KVzipResult& r : results) meter.add(gate_head_scores(gates, r), r.scores);
  return meter.result();
}

}  // namespace origami::eval
