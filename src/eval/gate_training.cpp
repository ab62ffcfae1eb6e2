#include "eval/gate_training.h"

namespace origami::eval {

Expected<gates::GateTrainingSet> collect_gate_training_set(KVzipScorer& scorer,
                                                           const std::vector<CalibrationSample>& samples,
                                                           const gates::GateShape& shape,
                                                           const std::function<void(size_t)>& progress) {
  gates::GateTrainingSet set;
  set.shape = shape;
  for (size_t i = 0; i < samples.size(); ++i) {
    Expected<KVzipResult> r = scorer.score(samples[i].token_ids, /*keep_hidden=*/true);
    if (!r) return Status(r.status().code(), samples[i].origin + ": " + r.status().message());
    const int n = static_cast<int>(samples[i].token_ids.size());
    // Targets as rows [token][head].
    std::vector<std::vector<float>> targets(shape.num_layers, std::vector<float>(static_cast<size_t>(n) * shape.num_kv_heads));
    for (int l = 0; l < shape.num_layers; ++l)
      for (int h = 0; h < shape.num_kv_heads; ++h)
        for (int t = 0; t < n; ++t) targets[l][static_cast<size_t>(t) * shape.num_kv_heads + h] = r->scores[l][h][t];
    set.append(r->hidden, targets, n);
    if (progress) progress(i);
  }
  return set;
}

Expected<std::vector<GateQuality>> measure_gate_quality(const std::vector<const gates::GateWeights*>& gates,
                                                        KVzipScorer& scorer,
                                                        const std::vector<CalibrationSample>& samples, double keep) {
  if (gates.empty()) return std::vector<GateQuality>{};
  std::vector<GateQualityMeter> meters;
  for (size_t g = 0; g < gates.size(); ++g)
    meters.emplace_back(gates[g]->shape.num_layers, keep, scorer.options().num_sinks);
  for (const CalibrationSample& s : samples) {
    Expected<KVzipResult> r = scorer.score(s.token_ids, /*keep_hidden=*/true);
    if (!r) return Status(r.status().code(), s.origin + ": " + r.status().message());
    for (size_t g = 0; g < gates.size(); ++g) meters[g].add(gate_head_scores(*gates[g], *r), r->scores);
  }
  std::vector<GateQuality> out;
  for (const GateQualityMeter& m : meters) out.push_back(m.result());
  return out;
}

}  // namespace origami::eval
