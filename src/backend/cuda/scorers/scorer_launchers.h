#pragma once
// The CUDA launchers of the base scorers (kv/scorers.h), one file each in this folder:
//   cudaError_t launch_score_<name>(const GroupArgs& args, cudaStream_t stream);
// writes S = args.scores[jd.score0 + row * jd.n + e] for every row of the group's jobs whose
// recipe uses that scorer (jd.scorer) and leaves other jobs' rows alone. Like every compression
// launcher it only enqueues work on `stream` (no allocation, no synchronisation), so it may run
// inside a captured CUDA graph. launch_compression_scores calls the launchers of the scorers in
// GroupArgs::scorers, generated from the registry, so a new scorer needs no edit there.
#include <cuda_runtime.h>

#include "backend/cuda/compression_kernels.h"
#include "kv/scorers.h"

namespace origami::cuda {

#define ORIGAMI_DECLARE_CUDA_SCORER(e, name, q, summary) \
  cudaError_t launch_score_##name(const GroupArgs& args, cudaStream_t stream);
ORIGAMI_BASE_SCORERS(ORIGAMI_DECLARE_CUDA_SCORER)
#undef ORIGAMI_DECLARE_CUDA_SCORER

}  // namespace origami::cuda
