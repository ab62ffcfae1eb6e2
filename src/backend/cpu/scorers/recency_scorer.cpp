// `recency` (StreamingLLM): S = entry index; see cpu::recency_scores (compression_ops.h).
#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"

namespace origami::cpu {

void score_recency(const ScorerInput& in, float* out) { recency_scores(in.n, out); }

}  // namespace origami::cpu
