// `knorm` base scorer on the GPU: S = -|k| per entry (K-norm), cpu::score_knorm's twin
// (backend/cpu/scorers/knorm_scorer.cpp); the norm is the one the redundancy score uses
// (chunk_key_norms: fp32 sum of squares of the bf16 or dequantized FP8 key, sqrt).
#include <cuda_runtime.h>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

// Grid (64-entry chunk, layer/head of the group), one warp per entry.
__global__ void __launch_bounds__(kThreads) knorm_score_kernel(const GroupArgs a) {
  const int job = a.chunk_job[blockIdx.x];
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.scorer != Scorer::kKeyNorm) return;
  chunk_key_norms(a, job, jd, -1.0f, a.scores);
}

}  // namespace

cudaError_t launch_score_knorm(const GroupArgs& a, cudaStream_t stream) {
  knorm_score_kernel<<<dim3(a.num_chunks, rows_per_job(a)), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
