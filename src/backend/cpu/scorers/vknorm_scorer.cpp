// `vknorm` (PagedEviction, Chitty-Venkata et al. 2025): S = ||v||_2 / ||k||_2 per entry. A value
// with a large norm carries much of what the head returns, and a key with a large norm draws
// little attention (Devoto et al. 2024), so the ratio stands in for the attention weights that a
// fused attention kernel never materialises. It needs no queries.
//
// When the score is computed: the paper scores a token when its K and V are written. origami
// scores from the cache at eviction time, which is the same number: keys are cached after RoPE,
// and RoPE rotates pairs of dimensions, so ||RoPE(k)|| = ||k||; values are cached as computed.
// Scoring at eviction time keeps the forward pass (and its CUDA graphs) untouched and needs no
// per-entry score storage.
//
// Arithmetic (the CUDA launcher matches it to rounding): the sums of squares in fp32, then
// sqrt(vv) / max(sqrt(kk), kVkNormMinKeyNorm) (an all-zero key scores finite).
#include <algorithm>
#include <cmath>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {

void score_vknorm(const ScorerInput& in, float* out) {
  ORIGAMI_CHECK_MSG(in.values != nullptr, "the vknorm scorer reads the cached values");
  for (int e = 0; e < in.n; ++e) {
    const float* k = in.keys + static_cast<size_t>(e) * in.d;
    const float* v = in.values + static_cast<size_t>(e) * in.d;
    out[e] = std::sqrt(dot(v, v, in.d)) / std::max(std::sqrt(dot(k, k, in.d)), kVkNormMinKeyNorm);
  }
}

}  // namespace origami::cpu
