// `keydiff` (KeyDiff, Park et al. 2025; kvpress's KeyDiffPress): S = -cos(k, a) with a the mean of
// the head's unit keys, so keys unlike the average key are kept; query-agnostic. The arithmetic is
// cpu::keydiff_scores (compression_ops.h), which the CUDA launcher matches to rounding.
#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"

namespace origami::cpu {

void score_keydiff(const ScorerInput& in, float* out) { keydiff_scores(in.keys, in.n, in.d, out); }

}  // namespace origami::cpu
