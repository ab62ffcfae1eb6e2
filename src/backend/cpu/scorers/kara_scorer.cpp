// `kara` (Kara, sliding-window compression): only the window of the last w = recipe.window
// entries is compressed. Its compressible region, entries [n - w, n - U) with U = recipe.recent
// (the buffer), is scored by the bidirectional attention of the window's w queries
// (cpu::kara_window_scores), and Token2Chunk (cpu::token2chunk) marks recipe.window_keep of its
// entries. The scorer writes the decision: +inf for every entry before the window and every
// marked one, the importance A for the others (the buffer is protected by the recipe), so the
// shared selection keeps exactly the entries before the window (in place: they never move), the
// marked ones and the buffer when num_keep = n - (w - U) + window_keep.
#include <limits>
#include <vector>

#include "backend/cpu/compression_ops.h"
#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {

void score_kara(const ScorerInput& in, float* out) {
  ORIGAMI_CHECK(in.window_q != nullptr && in.w >= 1 && in.recipe != nullptr);
  const ScoreRecipe& r = *in.recipe;
  const int start = in.n - in.w;
  const int m = std::max(in.w - r.recent, 0);
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int e = 0; e < in.n; ++e) out[e] = kInf;
  if (m == 0) return;
  std::vector<float> a(static_cast<size_t>(m));
  kara_window_scores(in.window_q, in.keys + static_cast<size_t>(start) * in.d, m, in.w, in.d, in.group_size, in.scale,
                     a.data());
  std::vector<uint8_t> keep(static_cast<size_t>(m));
  token2chunk(a.data(), m, r.window_keep, r.chunk_budget, r.chunk_max_len, keep.data());
  for (int e = 0; e < m; ++e) out[start + e] = keep[static_cast<size_t>(e)] != 0 ? kInf : a[static_cast<size_t>(e)];
}

}  // namespace origami::cpu
