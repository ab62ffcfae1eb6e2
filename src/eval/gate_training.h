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

// Scores every sample with KVzip and appends (attention input, target) rows for every layer.
// `progress(i)` is called after sample i.
Expected<gates::GateTrainingSet> collect_gate_training_set(KVzipScorer& scorer,
                                                           const std::vector<CalibrationSample>& samples,
                                                           const gates::GateShape& shape,
                                                           const std::function<void(size_t)>& progress = {});

// Spearman and top-k overlap (at `keep`) of each of `gates` against KVzip on the samples (scored
// once, shared by every gate set: e.g. the trained gates and their initialization).
Expected<std::vector<GateQuality>> measure_gate_quality(const std::vector<const gates::GateWeights*>& gates,
                                                        KVzipScorer& scorer,
                                                        const std::vector<CalibrationSample>& samples, double keep);

}  // namespace origami::eval
