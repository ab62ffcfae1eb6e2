// `knorm` (K-norm, Devoto et al. 2024; kvpress's KnormPress): S = -||k||_2 per entry. Keys with a
// small L2 norm draw the most attention, so they are kept; the score needs no queries.
// Arithmetic (the CUDA launcher matches it to rounding): the sum of squares in fp32, then sqrt.
#include <cmath>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/scorers/scorer_input.h"

namespace origami::cpu {

void score_knorm(const ScorerInput& in, float* out) {
  for (int e = 0; e < in.n; ++e) {
    const float* k = in.keys + static_cast<size_t>(e) * in.d;
    out[e] = -std::sqrt(dot(k, k, in.d));
  }
}

}  // namespace origami::cpu
