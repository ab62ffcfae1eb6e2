#include "backend/cuda/fp8_fused_kernels.h"

#include <cooperative_groups.h>

#include <algorithm>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cluster_rows.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_math.cuh"
#include "backend/cuda/fp8_quantize.cuh"
#include "backend/cuda/pointer_alignment.h"
#include "backend/cuda/programmatic_launch.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

using bf16 = __nv_bfloat16;
namespace cg = cooperative_groups;

// The row's scale: the static one, or fp8_row_scale of the block's largest |value| (amax: this
// thread's). Every thread of the block calls it (a block reduction).
__device__ __forceinline__ float fp8_block_scale(const Fp8RowsOut& q, float amax, float* scratch) {
  return q.static_scale != nullptr ? *q.static_scale : fp8_row_scale(block_max(amax, scratch));
}

// 8 codes of 8 bf16 values (packed in a uint4) under scale s, as one 8-byte store.
__device__ __forceinline__ void store_codes8(const uint4& v, float s, uint8_t* dst) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
  uint8_t c[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) c[k] = fp8_code(__bfloat162float(e[k]), s);
  *reinterpret_cast<uint2*>(dst) = *reinterpret_cast<const uint2*>(c);
}

__device__ __forceinline__ float amax8(const uint4& v, float amax) {
  const bf16* e = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(__bfloat162float(e[k])));
  return amax;
}

// add_rmsnorm_vec_kernel<kChunks>'s row, its bf16 output kept in registers (out: also stored),
// then quantized.
template <int kChunks>
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_quantize_vec_kernel(float* __restrict__ residual, const bf16* __restrict__ delta,
                                    const bf16* __restrict__ weight, float eps, int hidden, Fp8RowsOut q,
                                    bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  const int num_chunks = hidden / 8;
  float x[kChunks][8];
  uint4 w[kChunks];
  const float inv_rms = add_rmsnorm_row_vec<kChunks>(residual, delta, weight, eps, hidden, base, x, w, scratch);
  uint4 y[kChunks];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kNormThreads;
    if (c >= num_chunks) continue;
    const bf16* wv = reinterpret_cast<const bf16*>(&w[j]);
    bf16* yv = reinterpret_cast<bf16*>(&y[j]);
#pragma unroll
    for (int k = 0; k < 8; ++k) yv[k] = __float2bfloat16(rmsnorm_scaled(x[j][k], inv_rms, __bfloat162float(wv[k])));
    amax = amax8(y[j], amax);
    if (out != nullptr) reinterpret_cast<uint4*>(out + base)[c] = y[j];
  }
  const float s = fp8_block_scale(q, amax, scratch);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kNormThreads;
    if (c < num_chunks) store_codes8(y[j], s, q.codes + base + 8 * c);
  }
  if (threadIdx.x == 0) q.scales[blockIdx.x] = s;
}

// add_rmsnorm_kernel's row (any hidden), quantized: each normed value is computed once for the
// amax and again for its code (the same arithmetic, so the same bf16 value).
__global__ void add_rmsnorm_quantize_kernel(float* __restrict__ residual, const bf16* __restrict__ delta,
                                            const bf16* __restrict__ weight, float eps, int hidden, Fp8RowsOut q,
                                            bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  const float inv_rms = add_rmsnorm_row(residual, delta, eps, hidden, base, scratch);
  auto normed = [&](int i) {
    return __float2bfloat16(rmsnorm_scaled(residual[base + i], inv_rms, __bfloat162float(weight[i])));
  };
  float amax = 0.0f;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    const bf16 y = normed(i);
    if (out != nullptr) out[base + i] = y;
    amax = fmaxf(amax, fabsf(__bfloat162float(y)));
  }
  const float s = fp8_block_scale(q, amax, scratch);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) q.codes[base + i] = fp8_code(__bfloat162float(normed(i)), s);
  if (threadIdx.x == 0) q.scales[blockIdx.x] = s;
}

// silu_and_mul_vec_kernel over a row: chunk c = threadIdx.x + j * blockDim.x of 8 elements for
// j < kSiluChunks, the bf16 results kept in registers between the amax and the codes.
// kSplit: the row is shared out over a thread-block cluster (cluster_rows.h; grid.x = rows x its
// CTAs), CTA r taking chunks [r x chunks_per_cta, + chunks_per_cta), and the row's amax is the
// largest of its CTAs' (read over distributed shared memory), so the codes and the scale are those
// of one CTA a row. Why: one 14,336-wide row on one CTA took 6.8 us of each layer of a batch-1
// step (ncu, H200, Llama-3.1-8B), each thread's four chunks a serial chain of exponentials and
// divisions; over 8 CTAs of a chunk a thread, 4.4 us (launch_silu_and_mul_quantize_fp8).
constexpr int kSiluChunks = 4;
constexpr int kSiluMaxThreads = 1024;

template <bool kSplit>
__global__ void __launch_bounds__(kSiluMaxThreads)
    silu_and_mul_quantize_vec_kernel(const bf16* __restrict__ gate_up, int inter, Fp8RowsOut q, int chunks_per_cta) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  __shared__ float cta_amax;  // kSplit: this CTA's largest |value|, read by the cluster
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned int ctas = kSplit ? cluster.num_blocks() : 1u;
  const size_t t = kSplit ? blockIdx.x / ctas : blockIdx.x;
  const int first = kSplit ? static_cast<int>(cluster.block_rank()) * chunks_per_cta : 0;
  const int num_chunks = inter / 8;
  const int end = kSplit ? min(num_chunks, first + chunks_per_cta) : num_chunks;
  const uint4* g4 = reinterpret_cast<const uint4*>(gate_up + t * 2 * inter);
  const uint4* u4 = reinterpret_cast<const uint4*>(gate_up + t * 2 * inter + inter);
  uint4 y[kSiluChunks];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kSiluChunks; ++j) {
    const int c = first + threadIdx.x + j * blockDim.x;
    if (c >= end) continue;
    const uint4 gv = g4[c], uv = u4[c];
    const bf16* g8 = reinterpret_cast<const bf16*>(&gv);
    const bf16* u8 = reinterpret_cast<const bf16*>(&uv);
    bf16* y8 = reinterpret_cast<bf16*>(&y[j]);
#pragma unroll
    for (int k = 0; k < 8; ++k) y8[k] = __float2bfloat16(silu_times(__bfloat162float(g8[k]), __bfloat162float(u8[k])));
    amax = amax8(y[j], amax);
  }
  float s;
  if (!kSplit || q.static_scale != nullptr) {
    s = fp8_block_scale(q, amax, scratch);
  } else {
    const float mine = block_max(amax, scratch);
    if (threadIdx.x == 0) cta_amax = mine;
    cluster.sync();
    float row_amax = 0.0f;
    for (unsigned int r = 0; r < ctas; ++r) row_amax = fmaxf(row_amax, *cluster.map_shared_rank(&cta_amax, r));
    s = fp8_row_scale(row_amax);
    cluster.sync();  // no CTA leaves while another may still read its cta_amax
  }
  uint8_t* codes = q.codes + t * inter;
#pragma unroll
  for (int j = 0; j < kSiluChunks; ++j) {
    const int c = first + threadIdx.x + j * blockDim.x;
    if (c < end) store_codes8(y[j], s, codes + 8 * c);
  }
  if (threadIdx.x == 0 && first == 0) q.scales[t] = s;
}

// Any inter or alignment: each value computed for the amax and again for its code.
__global__ void silu_and_mul_quantize_kernel(const bf16* __restrict__ gate_up, int inter, Fp8RowsOut q) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  const size_t t = blockIdx.x;
  const bf16* gate = gate_up + t * 2 * inter;
  const bf16* up = gate + inter;
  auto value = [&](int i) { return __float2bfloat16(silu_times(__bfloat162float(gate[i]), __bfloat162float(up[i]))); };
  float amax = 0.0f;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) amax = fmaxf(amax, fabsf(__bfloat162float(value(i))));
  const float s = fp8_block_scale(q, amax, scratch);
  for (int i = threadIdx.x; i < inter; i += blockDim.x) q.codes[t * inter + i] = fp8_code(__bfloat162float(value(i)), s);
  if (threadIdx.x == 0) q.scales[t] = s;
}

void check_rows_out(const Fp8RowsOut& q, const char* who) {
  ORIGAMI_CHECK_MSG(q.codes != nullptr && q.scales != nullptr, who);
}

}  // namespace

void launch_add_rmsnorm_quantize_fp8(float* residual, const bf16* delta, const bf16* weight, float eps, int n,
                                     int hidden, const Fp8RowsOut& q, bf16* out, cudaStream_t stream) {
  check_rows_out(q, "launch_add_rmsnorm_quantize_fp8: codes / scales missing");
  if (n == 0) return;
  // As launch_add_rmsnorm picks (out, when skipped, as the aligned buffer it would be).
  const bool aligned = aligned_to(residual, 16) && aligned_to(delta, 16) && aligned_to(weight, 16) &&
                       aligned_to(out, 16);
  const int vec_chunks = add_rmsnorm_vec_chunks(hidden, aligned);
  ORIGAMI_CHECK_MSG(vec_chunks == 0 || aligned_to(q.codes, 8), "launch_add_rmsnorm_quantize_fp8: codes not 8-byte aligned");
  if (vec_chunks == 1) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_quantize_vec_kernel<1>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, q, out));
  } else if (vec_chunks == 2) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_quantize_vec_kernel<2>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, q, out));
  } else if (vec_chunks == 4) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_quantize_vec_kernel<4>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, q, out));
  } else {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_quantize_kernel, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, q, out));
  }
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_silu_and_mul_quantize_fp8(const bf16* gate_up, int n, int inter, const Fp8RowsOut& q,
                                      cudaStream_t stream) {
  check_rows_out(q, "launch_silu_and_mul_quantize_fp8: codes / scales missing");
  if (n == 0) return;
  const int num_chunks = inter / 8;
  // Each row over `ctas` CTAs (one at large batches). One CTA a row: enough warps for kSiluChunks
  // chunks a thread. Shared out: a chunk a thread where the share allows, since a thread's chunks
  // are a serial chain of exponentials and divisions, which at one or two warps a scheduler no
  // other warp hides (8 CTAs of 64 threads with 4 chunks each measured as slow as one CTA a row).
  const int ctas = cluster_ctas_per_row(n, current_device_sm_count());
  const int chunks_per_cta = (num_chunks + ctas - 1) / ctas;
  const int chunks_per_thread =
      ctas == 1 ? kSiluChunks : std::clamp((chunks_per_cta + kSiluMaxThreads - 1) / kSiluMaxThreads, 1, kSiluChunks);
  const int threads = std::max(32, ((chunks_per_cta + chunks_per_thread - 1) / chunks_per_thread + 31) / 32 * 32);
  if (inter % 8 == 0 && aligned_to(gate_up, 16) && aligned_to(q.codes, 8) && threads <= kSiluMaxThreads) {
    if (ctas == 1)
      ORIGAMI_CUDA_CHECK(launch_programmatic(silu_and_mul_quantize_vec_kernel<false>, n, threads, 0, stream, gate_up,
                                             inter, q, chunks_per_cta));
    else
      ORIGAMI_CUDA_CHECK(launch_programmatic_clusters(silu_and_mul_quantize_vec_kernel<true>, n * ctas, threads, 0,
                                                      stream, static_cast<unsigned>(ctas), gate_up, inter, q,
                                                      chunks_per_cta));
  } else {
    ORIGAMI_CUDA_CHECK(launch_programmatic(silu_and_mul_quantize_kernel, n, 256, 0, stream, gate_up, inter, q));
  }
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
