// `zero`: S = 0, for recipes scored by the later stages alone (e.g. redundancy only).
#include <algorithm>

#include "backend/cpu/scorers/scorer_input.h"

namespace origami::cpu {

void score_zero(const ScorerInput& in, float* out) { std::fill(out, out + in.n, 0.0f); }

}  // namespace origami::cpu
