// The CPU dispatch of the base scorers, generated from the registry (kv/scorers.h).
#include "backend/cpu/scorers/scorer_input.h"
#include "core/check.h"

namespace origami::cpu {

void score_base(Scorer scorer, const ScorerInput& in, float* out) {
  switch (scorer) {
#define ORIGAMI_CPU_SCORER_CASE(e, name, q, summary) \
  case Scorer::e: score_##name(in, out); return;
    ORIGAMI_BASE_SCORERS(ORIGAMI_CPU_SCORER_CASE)
#undef ORIGAMI_CPU_SCORER_CASE
  }
  ORIGAMI_CHECK(false && "unregistered scorer");
}

}  // namespace origami::cpu
