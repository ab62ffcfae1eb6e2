// `attention`: the observation window's attention (Zipage C.2, SnapKV); the arithmetic is
// cpu::window_attention_scores (compression_ops.h).
#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {

void score_attention(const ScorerInput& in, float* out) {
  ORIGAMI_CHECK(in.window_q != nullptr && in.w >= 1);
  window_attention_scores(in.window_q, in.keys, in.n, in.w, in.d, in.group_size, in.scale, out);
}

}  // namespace origami::cpu
