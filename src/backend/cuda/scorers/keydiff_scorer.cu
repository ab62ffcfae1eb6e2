// `keydiff` base scorer on the GPU (KeyDiff): S = -cos(k, a), a = the mean of the head's unit keys;
// cpu::keydiff_scores' twin (backend/cpu/compression_ops.h), equal to rounding (the GPU sums the
// anchor and the dot products in another order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

constexpr int kMaxHeadDim = 256;

// Grid (row), kThreads threads. Three passes over the row's n keys:
//   1. one warp per entry: 1 / max(|k_e|, 1e-8) into the row's S (scratch until pass 3);
//   2. one thread per dimension x: a[x] = (sum over e ascending of k_e[x] / |k_e|) / n, then |a|;
//   3. one warp per entry: S[e] = -(k_e . a) / |k_e| / max(|a|, 1e-8).
// Pass 3 reads entry e's inverse norm before the same warp overwrites it.
__global__ void __launch_bounds__(kThreads) keydiff_score_kernel(const GroupArgs a) {
  __shared__ float anchor[kMaxHeadDim];
  __shared__ float partial[kThreads / 32];
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  if (jd.scorer != Scorer::kKeyDiff) return;
  const int n = jd.n, d = a.head_dim;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = kThreads / 32;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  float* S = a.scores + row_offset(jd, ri.lh);

  for (int e = warp; e < n; e += warps) {
    float ss = lane_sum_squares(key_row(a, k_layer, table, e, ri.head), lane, d);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
    if (lane == 0) S[e] = 1.0f / fmaxf(sqrtf(ss), 1e-8f);
  }
  __syncthreads();

  for (int x = threadIdx.x; x < d; x += blockDim.x) {
    float sum = 0.0f;
    for (int e = 0; e < n; ++e) sum += kv_value(key_row(a, k_layer, table, e, ri.head), x) * S[e];
    anchor[x] = sum / static_cast<float>(n);
  }
  __syncthreads();
  float ss = 0.0f;
  for (int x = threadIdx.x; x < d; x += blockDim.x) ss = fmaf(anchor[x], anchor[x], ss);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += partial[w];
  const float inv_anchor = 1.0f / fmaxf(sqrtf(total), 1e-8f);

  for (int e = warp; e < n; e += warps) {
    const float inv_norm = S[e];
    float dot = lane_dot(key_row(a, k_layer, table, e, ri.head), anchor, lane, d);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(kFull, dot, o);
    if (lane == 0) S[e] = -(dot * inv_norm) * inv_anchor;
  }
}

}  // namespace

cudaError_t launch_score_keydiff(const GroupArgs& a, cudaStream_t stream) {
  if (a.head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
  keydiff_score_kernel<<<a.num_jobs * rows_per_job(a), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
