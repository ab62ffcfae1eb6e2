// `vknorm` base scorer on the GPU (PagedEviction): S = |v| / max(|k|, kVkNormMinKeyNorm) per
// entry, cpu::score_vknorm's twin (backend/cpu/scorers/vknorm_scorer.cpp, which says why the score
// is taken from the cache at eviction time). One warp per entry: lane-strided fmaf sums of squares
// of the bf16 key and value in fp32, xor-shuffle sums, sqrtf.
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
  const bf16* k_layer = a.k + ri.layer * a.kv_layer_pitch;
  const bf16* v_layer = a.v + ri.layer * a.kv_layer_pitch;
  const int32_t* table = a.pages + jd.src_page0;
  for (int r = warp; r < kTile; r += kThreads / 32) {
    const int e = e0 + r;
    if (e >= jd.n) break;
    const bf16* k = key_row(a, k_layer, table, e, ri.head);
    const bf16* v = key_row(a, v_layer, table, e, ri.head);  // V has K's layout
    float kk = 0.0f, vv = 0.0f;
    for (int x = lane; x < a.head_dim; x += 32) {
      const float kx = __bfloat162float(k[x]), vx = __bfloat162float(v[x]);
      kk = fmaf(kx, kx, kk);
      vv = fmaf(vx, vx, vv);
    }
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
