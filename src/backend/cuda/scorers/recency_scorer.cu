// `recency` base scorer on the GPU (StreamingLLM): S = entry index, cpu::recency_scores' twin.
#include <cuda_runtime.h>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

// Grid (64-entry chunk, layer/head of the group), one thread per entry.
__global__ void __launch_bounds__(kTile) recency_score_kernel(const GroupArgs a) {
  const int job = a.chunk_job[blockIdx.x];
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.scorer != Scorer::kRecency) return;
  const int e = (blockIdx.x - jd.chunk0) * kTile + threadIdx.x;
  if (e < jd.n) a.scores[row_offset(jd, blockIdx.y) + e] = static_cast<float>(e);
}

}  // namespace

cudaError_t launch_score_recency(const GroupArgs& a, cudaStream_t stream) {
  recency_score_kernel<<<dim3(a.num_chunks, rows_per_job(a)), kTile, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
