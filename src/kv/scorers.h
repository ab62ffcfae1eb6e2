#pragma once
// The registry of base scorers: the first stage of the compression score pipeline
// (backend/cpu/compression_ops.h, step 1). A base scorer writes S per (layer, KV head, entry),
// higher meaning keep; the later stages (global score, pooling, redundancy, protection),
// selection and compaction are shared by every scorer.
//
// Adding a scorer: one line below, one CPU file in backend/cpu/scorers/ defining
// `void score_<name>(const ScorerInput&, float* out)`, and one CUDA file in
// backend/cuda/scorers/ defining `cudaError_t launch_score_<name>(const GroupArgs&, cudaStream_t)`.
// The CPU dispatch, the CUDA launch loop and the validation are generated from this list.
//
// Plain C++ (no standard library beyond <cstdint>/<cstring>), so nvcc compiles it too.
#include <cstdint>
#include <cstring>

// X(enumerator, name, needs_queries, summary)
//   name:          the scorer's name, and the suffix of its CPU and CUDA functions.
//   needs_queries: it reads the observation window's queries (captured into a query slot).
#define ORIGAMI_BASE_SCORERS(X)                                                                             \
  X(kZero, zero, false, "S = 0 (only the later stages score, e.g. redundancy alone)")                       \
  X(kAttention, attention, true,                                                                             \
    "observation-window attention: softmax(q.k / sqrt(d)), max over a GQA group, mean over the window")      \
  X(kRecency, recency, false, "StreamingLLM: S = entry index (the newest entries win)")                     \
  X(kKeyNorm, knorm, false, "K-norm: S = -||k||_2 (keys with a small L2 norm are kept)")                     \
  X(kKeyDiff, keydiff, false, "KeyDiff: S = -cos(k, mean of the head's unit keys) (distinctive keys are kept)") \
  X(kValueKeyNorm, vknorm, false, "PagedEviction: S = ||v||_2 / ||k||_2 (no attention weights)")              \
  X(kKara, kara, true,                                                                                      \
    "Kara: bidirectional window attention over the window's compressible keys + Token2Chunk (kept = +inf)")

namespace origami {

// vknorm: the smallest key norm its ratio divides by (CPU and CUDA alike).
constexpr float kVkNormMinKeyNorm = 1e-6f;

enum class Scorer : int32_t {
#define ORIGAMI_SCORER_ENUM(e, name, q, summary) e,
  ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_ENUM)
#undef ORIGAMI_SCORER_ENUM
};

// Number of registered scorers (they fit a 32-bit mask).
constexpr int kNumScorers = 0
#define ORIGAMI_SCORER_COUNT(e, name, q, summary) +1
    ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_COUNT)
#undef ORIGAMI_SCORER_COUNT
    ;
static_assert(kNumScorers <= 32, "scorer masks are 32 bits");

constexpr uint32_t scorer_bit(Scorer s) { return 1u << static_cast<int32_t>(s); }

constexpr bool valid_scorer(Scorer s) { return static_cast<int32_t>(s) >= 0 && static_cast<int32_t>(s) < kNumScorers; }

// The scorer's name ("attention", "knorm", ...); "unknown" outside the registry.
constexpr const char* scorer_name(Scorer s) {
  switch (s) {
#define ORIGAMI_SCORER_NAME(e, name, q, summary) \
  case Scorer::e: return #name;
    ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_NAME)
#undef ORIGAMI_SCORER_NAME
  }
  return "unknown";
}

// What the scorer computes, one line.
constexpr const char* scorer_summary(Scorer s) {
  switch (s) {
#define ORIGAMI_SCORER_SUMMARY(e, name, q, summary) \
  case Scorer::e: return summary;
    ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_SUMMARY)
#undef ORIGAMI_SCORER_SUMMARY
  }
  return "";
}

// Whether the scorer reads the observation window's queries.
constexpr bool scorer_needs_queries(Scorer s) {
  switch (s) {
#define ORIGAMI_SCORER_QUERIES(e, name, q, summary) \
  case Scorer::e: return q;
    ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_QUERIES)
#undef ORIGAMI_SCORER_QUERIES
  }
  return false;
}

// The scorer named `name`; false if none is.
inline bool find_scorer(const char* name, Scorer* out) {
#define ORIGAMI_SCORER_FIND(e, n, q, summary) \
  if (std::strcmp(name, #n) == 0) {           \
    *out = Scorer::e;                         \
    return true;                              \
  }
  ORIGAMI_BASE_SCORERS(ORIGAMI_SCORER_FIND)
#undef ORIGAMI_SCORER_FIND
  return false;
}

}  // namespace origami
