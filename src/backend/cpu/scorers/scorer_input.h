#pragma once
// What a base scorer (kv/scorers.h) sees of one (layer, KV head) on the CPU, and its dispatch.
// Each registered scorer `name` has one file here defining
//   void score_<name>(const ScorerInput& in, float* out);   // out: [in.n], higher = keep
// and score_base() calls it through the registry's X-macro, so a new scorer needs no edit here.
#include "kv/compression.h"
#include "kv/scorers.h"

namespace origami::cpu {

struct ScorerInput {
  const float* keys = nullptr;      // [n, d] the head's cached keys in entry order (post-RoPE)
  const float* values = nullptr;    // [n, d] the head's cached values in entry order
  int n = 0;                        // cached entries (>= 1)
  int d = 0;                        // head_dim
  // The observation window's queries [w, group_size, d] (query i belongs to entry n - w + i),
  // w = min(recipe.window, n); null and 0 unless the scorer needs queries.
  const float* window_q = nullptr;
  int w = 0;
  int group_size = 1;               // query heads per KV head
  float scale = 1.0f;               // attention scale 1 / sqrt(d)
  const ScoreRecipe* recipe = nullptr;  // the whole recipe, for scorers with parameters of their own
};

#define ORIGAMI_DECLARE_CPU_SCORER(e, name, q, summary) void score_##name(const ScorerInput& in, float* out);
ORIGAMI_BASE_SCORERS(ORIGAMI_DECLARE_CPU_SCORER)
#undef ORIGAMI_DECLARE_CPU_SCORER

// Step 1 of the score pipeline: out[e] = the `scorer`'s score of entry e, e < in.n.
void score_base(Scorer scorer, const ScorerInput& in, float* out);

}  // namespace origami::cpu
