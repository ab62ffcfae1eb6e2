// `vknorm` base scorer on the GPU (PagedEviction): S = |v| / max(|k|, kVkNormMinKeyNorm) per
// entry, cpu::score_vknorm's twin (backend/cpu/scorers/vknorm_scorer.cpp, which says why the score
// is taken from the cache at eviction time). One warp per entry: lane-strided fmaf sums of squares
// of the key and value (bf16, or dequantized FP8) in fp32, xor-shuffle sums, sqrtf.
#include <cuda_runtime.h>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

// Grid (64-entry chunk, layer/head of the group), one warp per entry.
__global__ void __launch_bounds__(kThreads) vknorm_score_kernel(const GroupArgs a) {
  const int job = a.chunk_job[blockIdx.x];
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.scorer != Scorer::kValueKeyNorm) return;
  const RowInfo ri = row_info(a, job, blockIdx.y);
  const int e0 = (blockIdx.x - jd.chunk0) * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const KvLayer k_layer = key_layer(a, ri.layer), v_layer = value_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  for (int r = warp; r < kTile; r += kThreads / 32) {
    const int e = e0 + r;
    if (e >= jd.n) break;
    // Two independent accumulations (V has K's layout).
    float kk = lane_sum_squares(key_row(a, k_layer, table, e, ri.head), lane, a.head_dim);
    float vv = lane_sum_squares(key_row(a, v_layer, table, e, ri.head), lane, a.head_dim);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      kk += __shfl_xor_sync(kFull, kk, o);
      vv += __shfl_xor_sync(kFull, vv, o);
    }
    if (lane == 0) a.scores[row_offset(jd, ri.lh) + e] = sqrtf(vv) / fmaxf(sqrtf(kk), kVkNormMinKeyNorm);
  }
}

}  // namespace

cudaError_t launch_score_vknorm(const GroupArgs& a, cudaStream_t stream) {
  vknorm_score_kernel<<<dim3(a.num_chunks, rows_per_job(a)), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
