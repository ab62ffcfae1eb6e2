#pragma once
// The data side of Fast KVzip gate training (`origami train-gates`, docs/gates.md): KVzip's
// reconstruction scores and the layers' attention inputs over sample documents, as training
// tuples, and the gates' agreement with exact KVzip scores on held-out documents.
#include <functional>
#include <vector>

#include "eval/gate_quality.h"
#include "eval/head_calibration.h"
#include "eval/kvzip_scorer.h"
#include "gates/gate_trainer.h"

namespace origami::eval {

// Appends a scored document's (attention input, target) rows for every layer.
void append_training_rows(const KVzipResult& result, gates::GateTrainingSet* set);

// Scores every sample with KVzip (hidden states kept) and, when `set` is given, appends its rows
// there instead of keeping the result (training sets are large; held-out ones are kept whole).
// `progress(i)` is called after sample i.
Expected<std::vector<KVzipResult>> score_samples(KVzipScorer& scorer, const std::vector<CalibrationSample>& samples,
                                                 gates::GateTrainingSet* set,
                                                 const std::function<void(size_t)>& progress = {});

// Spearman and top-k overlap (at `keep`) of `gates` against the exact KVzip scores of `results`.
GateQuality measure_gate_quality(const gates::GateWeights& gates, const std::vector<KVzipResult>& results,
                                 double keep, int num_sinks);

}  // namespace origami::eval
