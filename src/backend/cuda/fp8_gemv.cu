#include "backend/cuda/fp8_gemv.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pointer_alignment.h"
#include "backend/cuda/programmatic_launch.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 256;     // 8 warps a block
constexpr int kRowsPerWarp = 2;   // output channels a warp computes (their rows read side by side)
constexpr int kChunk = 16;        // codes a lane reads at once (16 bytes)
// Bytes at the start of each of a warp's weight rows pulled into L2 before the previous kernel is
// done (see fp8_gemv_kernel): the loop's first step. Measured on the H100 (docs/kernels.md): 2 KB
// the same, 3-8 KB slower at batch 1 (prefetches past what the previous kernel's time can fetch
// only compete with the GEMV's own loads).
constexpr int kPrefetchRowBytes = 1024;

// Asks L2 for the first kPrefetchRowBytes of a weight row, one 128-byte line a lane per 4 KB.
__device__ __forceinline__ void prefetch_row_start(const uint8_t* row, int k, int lane) {
  const int end = min(k, kPrefetchRowBytes);
  for (int off = lane * 128; off < end; off += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + off));
}

// 16 E4M3 codes to floats: one hardware conversion per pair (E4M3 -> f16 is exact), then f16 -> f32.
__device__ __forceinline__ void codes_to_float(const uint4& v, float out[kChunk]) {
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&v);
#pragma unroll
  for (int i = 0; i < kChunk / 2; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pairs[i], __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Adds the products of one chunk of every x row with one chunk of each of the warp's w rows.
template <int M>
__device__ __forceinline__ void accumulate_chunk(const uint4* __restrict__ x, int chunks, int c, const uint4 (&w)[kRowsPerWarp],
                                                 float (&acc)[kRowsPerWarp][M]) {
  float wf[kRowsPerWarp][kChunk];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) codes_to_float(w[r], wf[r]);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[kChunk];
    codes_to_float(__ldg(x + static_cast<size_t>(m) * chunks + c), xf);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
      for (int e = 0; e < kChunk; ++e) acc[r][m] = fmaf(xf[e], wf[r][e], acc[r][m]);
  }
}

// A warp computes kRowsPerWarp output channels for all M rows of x: each lane walks the rows'
// 16-byte chunks 32 apart (a warp reads 512 contiguous bytes of each row per step), two steps'
// loads issued before either is used. The weights are read once (streamed past L1: __ldcs); x, a
// few KB read by every warp, stays in cache (__ldg).
// At 1-2 rows the step's other kernels (norms, RoPE, attention, quantization) leave the memory
// idle, and a GEMV's first bytes wait for the kernel before it. The weights are written when the
// model loads and by no kernel of the step, so, outside programmatic_launch.h's rule (which covers
// memory other kernels of the step touch), each warp asks L2 for the start of its rows before
// wait_for_previous_grid(): those reads overlap the previous kernel's tail. (A kernel that ever
// writes weights within a step, e.g. an online adapter merge, would have to end that.)
template <int M>
__global__ void __launch_bounds__(kThreads) fp8_gemv_kernel(const uint8_t* __restrict__ x, const float* __restrict__ x_scales,
                                                            int k, const uint8_t* __restrict__ w,
                                                            const float* __restrict__ w_scales, int n,
                                                            __nv_bfloat16* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5)) * kRowsPerWarp;
  const uint4* wv[kRowsPerWarp];
  if (row0 < n) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const uint8_t* row = w + static_cast<size_t>(min(row0 + r, n - 1)) * k;  // a missing row re-reads the last
      wv[r] = reinterpret_cast<const uint4*>(row);
      prefetch_row_start(row, k, lane);
    }
  }
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step (the weights aside)
  allow_next_grid();
  if (row0 >= n) return;
  const int chunks = k / kChunk;
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  int c = lane;
  for (; c + 32 < chunks; c += 64) {
    uint4 a[kRowsPerWarp], b[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      a[r] = __ldcs(wv[r] + c);
      b[r] = __ldcs(wv[r] + c + 32);
    }
    accumulate_chunk<M>(xv, chunks, c, a, acc);
    accumulate_chunk<M>(xv, chunks, c + 32, b, acc);
  }
  if (c < chunks) {
    uint4 a[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) a[r] = __ldcs(wv[r] + c);
    accumulate_chunk<M>(xv, chunks, c, a, acc);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][m] += __shfl_xor_sync(0xffffffffu, acc[r][m], o);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    if (row0 + r >= n) break;
    const float ws = w_scales[row0 + r];
#pragma unroll
    for (int m = 0; m < M; ++m)  // the epilogue's order: acc * row scale * column scale
      y[static_cast<size_t>(m) * n + row0 + r] = __float2bfloat16(acc[r][m] * x_scales[m] * ws);
  }
}

}  // namespace

bool fp8_gemv_supported(int m, int k, const void* x, const void* w) {
  return m >= 1 && m <= kFp8GemvMaxRows && k > 0 && k % kChunk == 0 && aligned_to(x, 16) && aligned_to(w, 16);
}

void launch_fp8_gemv(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w, const float* w_scales,
                     int n, __nv_bfloat16* y, cudaStream_t stream) {
  ORIGAMI_CHECK_MSG(fp8_gemv_supported(m, k, x, w), "FP8 GEMV: unsupported rows, k or alignment");
  if (n <= 0) return;
  const int warps = (n + kRowsPerWarp - 1) / kRowsPerWarp;
  const int blocks = (warps + kThreads / 32 - 1) / (kThreads / 32);
  switch (m) {
    case 1: ORIGAMI_CUDA_CHECK(launch_programmatic(fp8_gemv_kernel<1>, blocks, kThreads, 0, stream, x, x_scales, k, w, w_scales, n, y)); break;
    case 2: ORIGAMI_CUDA_CHECK(launch_programmatic(fp8_gemv_kernel<2>, blocks, kThreads, 0, stream, x, x_scales, k, w, w_scales, n, y)); break;
    case 3: ORIGAMI_CUDA_CHECK(launch_programmatic(fp8_gemv_kernel<3>, blocks, kThreads, 0, stream, x, x_scales, k, w, w_scales, n, y)); break;
    default: ORIGAMI_CUDA_CHECK(launch_programmatic(fp8_gemv_kernel<4>, blocks, kThreads, 0, stream, x, x_scales, k, w, w_scales, n, y)); break;
  }
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
