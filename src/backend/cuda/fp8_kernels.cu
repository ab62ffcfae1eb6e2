#include "backend/cuda/fp8_kernels.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/pointer_alignment.h"
#include "backend/cuda/programmatic_launch.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 256;

// One block per row; 8 bf16 per thread per step (16-byte loads), codes stored 8 at a time.
__global__ void quantize_rows_kernel(const __nv_bfloat16* __restrict__ x, int cols, const float* static_scale,
                                     uint8_t* __restrict__ codes, float* __restrict__ scales) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t row = blockIdx.x;
  const __nv_bfloat16* in = x + row * cols;
  uint8_t* out = codes + row * cols;
  __shared__ float s_scale;
  if (static_scale != nullptr) {
    if (threadIdx.x == 0) s_scale = *static_scale;
  } else {
    float amax = 0.0f;
    for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(in + c);
      const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(__bfloat162float(e[i])));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    __shared__ float warp_max[kThreads / 32];
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float m = 0.0f;
      for (int w = 0; w < (blockDim.x + 31) / 32; ++w) m = fmaxf(m, warp_max[w]);
      s_scale = fp8_row_scale(m);
    }
  }
  __syncthreads();
  const float s = s_scale;
  if (threadIdx.x == 0) scales[row] = s;
  for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(in + c);
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
    uint8_t q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      q[i] = fp8_code(__bfloat162float(e[i]), s);
    *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(q);
  }
}

// Any shape: one element a thread step.
__global__ void scale_product_kernel(const float* __restrict__ acc, int rows, int cols,
                                     const float* __restrict__ row_scale_v, const float* __restrict__ col_scale_v,
                                     __nv_bfloat16* __restrict__ y) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t n = static_cast<size_t>(rows) * cols;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / cols, c = i % cols;
    y[i] = __float2bfloat16(acc[i] * row_scale_v[r] * col_scale_v[c]);
  }
}

// Four columns a thread (cols % 4 == 0, 16-byte aligned partials and column scales: 16-byte loads
// of each partial, 8-byte stores), row blockIdx.y: the partials added in split order, then scaled
// as scale_product_kernel scales (sum * row scale * column scale, rounded once to bf16), so one
// split gives its bits. No division per element: the decode-sized products (3-320 rows) this
// serves are a few microseconds each, where an index division per element was a visible share.
__global__ void sum_scale_partials_kernel(const float* __restrict__ acc, int splits, int rows, int cols,
                                          const float* __restrict__ row_scale_v, const float* __restrict__ col_scale_v,
                                          __nv_bfloat16* __restrict__ y) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * 4;
  if (c >= cols) return;
  const size_t plane = static_cast<size_t>(rows) * cols;
  const size_t e = static_cast<size_t>(blockIdx.y) * cols + c;
  float4 sum = *reinterpret_cast<const float4*>(acc + e);
  for (int s = 1; s < splits; ++s) {
    const float4 v = *reinterpret_cast<const float4*>(acc + s * plane + e);
    sum.x += v.x;
    sum.y += v.y;
    sum.z += v.z;
    sum.w += v.w;
  }
  const float rs = row_scale_v[blockIdx.y];
  const float4 cs = *reinterpret_cast<const float4*>(col_scale_v + c);
  __nv_bfloat162 out[2];
  out[0] = __floats2bfloat162_rn(sum.x * rs * cs.x, sum.y * rs * cs.y);
  out[1] = __floats2bfloat162_rn(sum.z * rs * cs.z, sum.w * rs * cs.w);
  *reinterpret_cast<uint2*>(y + e) = *reinterpret_cast<const uint2*>(out);
}

// Whether sum_scale_partials_kernel serves the shape and buffers.
bool four_columns_a_thread(const float* acc, int rows, int cols, const float* col_scale_v, const __nv_bfloat16* y) {
  return cols % 4 == 0 && rows <= 65535 && aligned_to(acc, 16) && aligned_to(col_scale_v, 16) && aligned_to(y, 8);
}

void launch_four_columns_a_thread(const float* acc, int splits, int rows, int cols, const float* row_scale_v,
                                  const float* col_scale_v, __nv_bfloat16* y, cudaStream_t stream) {
  constexpr int kColThreads = 128;
  const dim3 grid((cols / 4 + kColThreads - 1) / kColThreads, rows);
  ORIGAMI_CUDA_CHECK(launch_programmatic(sum_scale_partials_kernel, grid, kColThreads, 0, stream, acc, splits, rows,
                                         cols, row_scale_v, col_scale_v, y));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_quantize_rows_fp8(const __nv_bfloat16* x, int rows, int cols, const float* static_scale, uint8_t* codes,
                              float* scales, cudaStream_t stream) {
  if (rows == 0) return;
  const int threads = cols >= 8 * kThreads ? kThreads : ((cols / 8 + 31) / 32) * 32;
  ORIGAMI_CUDA_CHECK(launch_programmatic(quantize_rows_kernel, rows, threads > 0 ? threads : 32, 0, stream, x, cols,
                                        static_scale, codes, scales));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_scale_fp8_product(const float* acc, int rows, int cols, const float* row_scale_v, const float* col_scale_v,
                              __nv_bfloat16* y, cudaStream_t stream) {
  if (rows == 0) return;
  if (four_columns_a_thread(acc, rows, cols, col_scale_v, y)) {
    launch_four_columns_a_thread(acc, 1, rows, cols, row_scale_v, col_scale_v, y, stream);
    return;
  }
  const size_t n = static_cast<size_t>(rows) * cols;
  const int blocks = static_cast<int>(std::min<size_t>((n + 255) / 256, 4096));
  ORIGAMI_CUDA_CHECK(launch_programmatic(scale_product_kernel, blocks, 256, 0, stream, acc, rows, cols, row_scale_v,
                                         col_scale_v, y));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_sum_scale_fp8_partials(const float* acc, int splits, int rows, int cols, const float* row_scale_v,
                                   const float* col_scale_v, __nv_bfloat16* y, cudaStream_t stream) {
  if (rows == 0) return;
  if (splits == 1) {
    launch_scale_fp8_product(acc, rows, cols, row_scale_v, col_scale_v, y, stream);
    return;
  }
  ORIGAMI_CHECK_MSG(four_columns_a_thread(acc, rows, cols, col_scale_v, y),
                    "split-K partials need a column count that is a multiple of 4 and aligned buffers");
  launch_four_columns_a_thread(acc, splits, rows, cols, row_scale_v, col_scale_v, y, stream);
}

}  // namespace origami::cuda
