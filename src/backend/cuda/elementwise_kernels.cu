// Element-wise kernels of the CUDA backend. Arithmetic is fp32; storage is bf16 except the
// residual stream, which stays fp32 so that 30-60 layers of additions do not lose precision.
#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/elementwise_math.cuh"
#include "backend/cuda/kv_cache_write.cuh"
#include "backend/cuda/pointer_alignment.h"
#include "backend/cuda/programmatic_launch.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

__global__ void embedding_gather_kernel(const bf16* __restrict__ table, const int32_t* __restrict__ ids,
                                        int hidden, float* __restrict__ residual) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const int t = blockIdx.x;
  const bf16* row = table + static_cast<size_t>(ids[t]) * hidden;
  float* dst = residual + static_cast<size_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = __bfloat162float(row[i]);
}

__global__ void add_rmsnorm_kernel(float* __restrict__ residual, const bf16* __restrict__ delta,
                                   const bf16* __restrict__ weight, float eps, int hidden, bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  const float inv_rms = add_rmsnorm_row(residual, delta, eps, hidden, base, scratch);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    out[base + i] = __float2bfloat16(residual[base + i] * inv_rms * __bfloat162float(weight[i]));  // rmsnorm_scaled
}

// The same computation with the row held in registers: each thread loads its 8-element chunks
// (16-byte loads, all issued before the first use) once, instead of two latency-bound scalar
// passes over the row. kChunks: chunks per thread (hidden <= kChunks * 8 * kNormThreads); needs
// hidden % 8 == 0 and 16-byte aligned pointers (the launcher checks).
template <int kChunks>
__global__ void __launch_bounds__(kNormThreads) add_rmsnorm_vec_kernel(float* __restrict__ residual,
                                                                      const bf16* __restrict__ delta,
                                                                      const bf16* __restrict__ weight, float eps,
                                                                      int hidden, bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  __shared__ float scratch[32];
  const size_t base = static_cast<size_t>(blockIdx.x) * hidden;
  const int num_chunks = hidden / 8;
  float x[kChunks][8];
  uint4 w[kChunks];
  const float inv_rms = add_rmsnorm_row_vec<kChunks>(residual, delta, weight, eps, hidden, base, x, w, scratch);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int c = threadIdx.x + j * kNormThreads;
    if (c >= num_chunks) continue;
    const bf16* wv = reinterpret_cast<const bf16*>(&w[j]);
    uint4 o;
    bf16* ov = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int k = 0; k < 8; ++k) ov[k] = __float2bfloat16(x[j][k] * inv_rms * __bfloat162float(wv[k]));  // rmsnorm_scaled
    reinterpret_cast<uint4*>(out + base)[c] = o;
  }
}

// One block per token; one warp per head (q heads first, then k heads, then v heads copied).
__global__ void qk_norm_rope_kernel(RopeArgs a) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  extern __shared__ float head_buf[];  // [num_warps, head_dim]
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  const int d = a.head_dim, half = d / 2;
  float* buf = head_buf + warp * d;
  const float pos = static_cast<float>(a.positions[t]);
  const int total_heads = a.num_heads + 2 * a.num_kv_heads;
  for (int h = warp; h < total_heads; h += num_warps) {
    const bf16* src = a.qkv + static_cast<size_t>(t) * a.qkv_stride + static_cast<size_t>(h) * d;
    bf16* dst;
    const bf16* norm = nullptr;
    bool rotate = true;
    if (h < a.num_heads) {
      dst = a.q_out + (static_cast<size_t>(t) * a.num_heads + h) * d;
      norm = a.q_norm;
    } else if (h < a.num_heads + a.num_kv_heads) {
      dst = a.k_out + (static_cast<size_t>(t) * a.num_kv_heads + (h - a.num_heads)) * d;
      norm = a.k_norm;
    } else {
      dst = a.v_out + (static_cast<size_t>(t) * a.num_kv_heads + (h - a.num_heads - a.num_kv_heads)) * d;
      rotate = false;
    }
    float sum_sq = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float x = __bfloat162float(src[i]);
      buf[i] = x;
      sum_sq += x * x;
    }
    __syncwarp();
    if (!rotate) {
      for (int i = lane; i < d; i += 32) dst[i] = __float2bfloat16(buf[i]);
      __syncwarp();
      continue;
    }
    if (norm != nullptr) {
      const float inv_rms = rsqrtf(warp_sum(sum_sq) / d + a.eps);
      // The HF models round the normalised head to the activation dtype before RoPE.
      for (int i = lane; i < d; i += 32)
        buf[i] = __bfloat162float(__float2bfloat16(buf[i] * inv_rms * __bfloat162float(norm[i])));
      __syncwarp();
    }
    for (int i = lane; i < half; i += 32) {
      float s, c;
      sincosf(pos * a.inv_freq[i], &s, &c);
      const float x1 = buf[i], x2 = buf[i + half];
      dst[i] = __float2bfloat16(x1 * c - x2 * s);
      dst[i + half] = __float2bfloat16(x2 * c + x1 * s);
    }
    __syncwarp();
  }
}

// qk_norm_rope_kernel for head_dim D in {64, 128} with one warp per head and the head in
// registers: lane l holds elements l + 32 k, so the rotate-half partner of element i < D/2
// (i + D/2) sits in the same lane and no shared memory is needed. Grid: x = token,
// y = groups of warps-per-block heads, so every head of every token has its own warp (more
// parallelism for small batches than one block per token). Same arithmetic as above. With
// a.kv.slot_mapping set, k and v heads also go into the paged cache (RopeArgs), in the lane
// layout kv_fp8_store_row_warp takes. The block's heads share one token, so its D / 2 rotations
// (sin, cos) are made once a block into shared memory: the same sincosf of the same product each
// warp made for itself before (ncu at 8,192 rows: the kernel was compute-bound, issue slots 88%
// busy, the sincosf most of it), so the same bits.
template <int D>
__global__ void qk_norm_rope_warp_kernel(RopeArgs a) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  constexpr int kPer = D / 32, kHalfPer = kPer / 2;
  __shared__ float2 rotation[D / 2];  // (sin, cos) of this token's position at frequency i
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warps = blockDim.x >> 5;
  const int h = blockIdx.y * warps + (threadIdx.x >> 5);
  const int total_heads = a.num_heads + 2 * a.num_kv_heads;
  // Uniform over the block: whether any of its heads is a q or k head (the rest are v, copied).
  if (blockIdx.y * warps < a.num_heads + a.num_kv_heads) {
    const float pos = static_cast<float>(a.positions[t]);
    for (int i = threadIdx.x; i < D / 2; i += blockDim.x) {
      float sn, cs;
      sincosf(pos * a.inv_freq[i], &sn, &cs);
      rotation[i] = make_float2(sn, cs);
    }
    __syncthreads();
  }
  if (h >= total_heads) return;
  const bf16* src = a.qkv + static_cast<size_t>(t) * a.qkv_stride + static_cast<size_t>(h) * D;
  const bool is_q = h < a.num_heads, is_v = h >= a.num_heads + a.num_kv_heads;
  const int kv_head = is_q ? -1 : is_v ? h - a.num_heads - a.num_kv_heads : h - a.num_heads;
  bf16 out[kPer];  // element lane + 32 k of the head as stored
  if (is_v) {  // v: copied
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[k] = src[lane + 32 * k];
  } else {
    const bf16* norm = is_q ? a.q_norm : a.k_norm;
    float x[kPer], nw[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      x[k] = __bfloat162float(src[lane + 32 * k]);
      nw[k] = norm != nullptr ? __bfloat162float(norm[lane + 32 * k]) : 1.0f;
    }
    if (norm != nullptr) {
      float sum_sq = 0.0f;
#pragma unroll
      for (int k = 0; k < kPer; ++k) sum_sq += x[k] * x[k];
      const float inv_rms = rsqrtf(warp_sum(sum_sq) / D + a.eps);
      // The HF models round the normalised head to the activation dtype before RoPE.
#pragma unroll
      for (int k = 0; k < kPer; ++k) x[k] = __bfloat162float(__float2bfloat16(x[k] * inv_rms * nw[k]));
    }
#pragma unroll
    for (int k = 0; k < kHalfPer; ++k) {
      const float2 r = rotation[lane + 32 * k];
      const float sn = r.x, cs = r.y;
      const float x1 = x[k], x2 = x[k + kHalfPer];
      out[k] = __float2bfloat16(x1 * cs - x2 * sn);  // element lane + 32 k
      out[k + kHalfPer] = __float2bfloat16(x2 * cs + x1 * sn);  // element lane + 32 k + D / 2
    }
  }
  bf16* const out_base = is_q ? a.q_out : is_v ? a.v_out : a.k_out;  // k_out / v_out null: skipped
  if (out_base != nullptr) {
    bf16* dst = out_base + (is_q ? static_cast<size_t>(t) * a.num_heads + h
                                 : static_cast<size_t>(t) * a.num_kv_heads + kv_head) * D;
#pragma unroll
    for (int k = 0; k < kPer; ++k) dst[lane + 32 * k] = out[k];
  }
  if (is_q || a.kv.slot_mapping == nullptr) return;
  const long long row = kv_cache_row_offset(a.kv, t, kv_head);
  if (row < 0) return;  // a padding row: uniform over the warp
  if (a.kv_fp8.k_codes != nullptr) {
    float x[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) x[k] = __bfloat162float(out[k]);
    kv_fp8_store_row_warp(x, kPer, lane, (is_v ? a.kv_fp8.v_codes : a.kv_fp8.k_codes) + row,
                          (is_v ? a.kv_fp8.v_scales : a.kv_fp8.k_scales) + row / D);
  } else {
    bf16* cache = (is_v ? a.kv.v_cache : a.kv.k_cache) + row;
#pragma unroll
    for (int k = 0; k < kPer; ++k) cache[lane + 32 * k] = out[k];
  }
}

__global__ void silu_and_mul_kernel(const bf16* __restrict__ gate_up, int inter, bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t t = blockIdx.y;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= inter) return;
  const float g = __bfloat162float(gate_up[t * 2 * inter + i]);
  const float u = __bfloat162float(gate_up[t * 2 * inter + inter + i]);
  out[t * inter + i] = __float2bfloat16(silu_times(g, u));
}

// 8 outputs per thread with 16-byte loads and stores (inter % 8 == 0, aligned rows).
__global__ void silu_and_mul_vec_kernel(const bf16* __restrict__ gate_up, int inter, bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;  // 8-element chunk
  if (c >= inter / 8) return;
  const uint4 gv = reinterpret_cast<const uint4*>(gate_up + t * 2 * inter)[c];
  const uint4 uv = reinterpret_cast<const uint4*>(gate_up + t * 2 * inter + inter)[c];
  const bf16* g8 = reinterpret_cast<const bf16*>(&gv);
  const bf16* u8 = reinterpret_cast<const bf16*>(&uv);
  uint4 o;
  bf16* o8 = reinterpret_cast<bf16*>(&o);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float g = __bfloat162float(g8[k]);
    o8[k] = __float2bfloat16(g / (1.0f + __expf(-g)) * __bfloat162float(u8[k]));  // silu_times
  }
  reinterpret_cast<uint4*>(out + t * inter)[c] = o;
}

__global__ void bias_add_kernel(bf16* __restrict__ x, const bf16* __restrict__ bias, int cols) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  x[t * cols + c] = __float2bfloat16(__bfloat162float(x[t * cols + c]) + __bfloat162float(bias[c]));
}

__global__ void gather_rows_kernel(const bf16* __restrict__ in, const int32_t* __restrict__ rows, int cols,
                                   bf16* __restrict__ out) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const size_t r = blockIdx.x;
  const bf16* src = in + static_cast<size_t>(rows[r]) * cols;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[r * cols + c] = src[c];
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void fill_random_kernel(bf16* out, size_t n, float std, float constant, uint64_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    if (std == 0.0f) {
      out[i] = __float2bfloat16(constant);
      continue;
    }
    const uint64_t r = splitmix64(seed ^ splitmix64(i));
    // Box-Muller from two 24-bit uniforms in (0, 1].
    const float u1 = (static_cast<float>(r >> 40) + 1.0f) * (1.0f / 16777216.0f);
    const float u2 = static_cast<float>((r >> 16) & 0xffffff) * (1.0f / 16777216.0f);
    out[i] = __float2bfloat16(std * sqrtf(-2.0f * __logf(u1)) * __cosf(6.2831853f * u2));
  }
}

}  // namespace

void launch_embedding_gather(const bf16* table, const int32_t* ids, int n, int hidden, float* residual,
                             cudaStream_t stream) {
  if (n == 0) return;
  ORIGAMI_CUDA_CHECK(launch_programmatic(embedding_gather_kernel, n, kNormThreads, 0, stream, table, ids, hidden, residual));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_add_rmsnorm(float* residual, const bf16* delta, const bf16* weight, float eps, int n, int hidden,
                        bf16* out, cudaStream_t stream) {
  if (n == 0) return;
  const bool aligned = aligned_to(residual, 16) && aligned_to(delta, 16) && aligned_to(weight, 16) && aligned_to(out, 16);
  const int vec_chunks = add_rmsnorm_vec_chunks(hidden, aligned);
  if (vec_chunks == 1) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_vec_kernel<1>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, out));
  } else if (vec_chunks == 2) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_vec_kernel<2>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, out));
  } else if (vec_chunks == 4) {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_vec_kernel<4>, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, out));
  } else {
    ORIGAMI_CUDA_CHECK(launch_programmatic(add_rmsnorm_kernel, n, kNormThreads, 0, stream, residual, delta, weight, eps, hidden, out));
  }
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope(const RopeArgs& args, cudaStream_t stream) {
  const bool write_kv = args.kv.slot_mapping != nullptr;
  if (write_kv) {
    ORIGAMI_CHECK_MSG(qk_norm_rope_writes_kv(args.head_dim), "launch_qk_norm_rope: no fused KV write for this head_dim");
    ORIGAMI_CHECK_MSG(args.kv.num_tokens == args.num_tokens && args.kv.num_kv_heads == args.num_kv_heads &&
                          args.kv.head_dim == args.head_dim &&
                          kv_write_args_valid(args.kv, args.kv_fp8.k_codes != nullptr ? &args.kv_fp8 : nullptr) &&
                          (args.kv_fp8.k_codes != nullptr || (args.kv.k_cache != nullptr && args.kv.v_cache != nullptr)),
                      "launch_qk_norm_rope: bad fused KV write arguments");
  } else {
    ORIGAMI_CHECK_MSG(args.k_out != nullptr && args.v_out != nullptr, "launch_qk_norm_rope: k_out / v_out missing");
  }
  if (args.num_tokens == 0) return;
  const int total_heads = args.num_heads + 2 * args.num_kv_heads;
  if (qk_norm_rope_writes_kv(args.head_dim)) {
    constexpr int kWarps = 8;
    const dim3 grid(args.num_tokens, (total_heads + kWarps - 1) / kWarps);
    if (args.head_dim == 64) ORIGAMI_CUDA_CHECK(launch_programmatic(qk_norm_rope_warp_kernel<64>, grid, kWarps * 32, 0, stream, args));
    else ORIGAMI_CUDA_CHECK(launch_programmatic(qk_norm_rope_warp_kernel<128>, grid, kWarps * 32, 0, stream, args));
    ORIGAMI_CUDA_CHECK_LAUNCH();
    return;
  }
  const int num_warps = total_heads < 16 ? total_heads : 16;
  const size_t smem = static_cast<size_t>(num_warps) * args.head_dim * sizeof(float);
  ORIGAMI_CUDA_CHECK(launch_programmatic(qk_norm_rope_kernel, args.num_tokens, num_warps * 32, smem, stream, args));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_silu_and_mul(const bf16* gate_up, int n, int inter, bf16* out, cudaStream_t stream) {
  if (n == 0) return;
  if (inter % 8 == 0 && aligned_to(gate_up, 16) && aligned_to(out, 16)) {
    dim3 grid((inter / 8 + 127) / 128, n);
    ORIGAMI_CUDA_CHECK(launch_programmatic(silu_and_mul_vec_kernel, grid, 128, 0, stream, gate_up, inter, out));
    ORIGAMI_CUDA_CHECK_LAUNCH();
    return;
  }
  dim3 grid((inter + 255) / 256, n);
  ORIGAMI_CUDA_CHECK(launch_programmatic(silu_and_mul_kernel, grid, 256, 0, stream, gate_up, inter, out));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_bias_add(bf16* x, const bf16* bias, int n, int cols, cudaStream_t stream) {
  if (n == 0) return;
  dim3 grid((cols + 255) / 256, n);
  ORIGAMI_CUDA_CHECK(launch_programmatic(bias_add_kernel, grid, 256, 0, stream, x, bias, cols));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const bf16* in, const int32_t* rows, int num_rows, int cols, bf16* out,
                        cudaStream_t stream) {
  if (num_rows == 0) return;
  ORIGAMI_CUDA_CHECK(launch_programmatic(gather_rows_kernel, num_rows, 256, 0, stream, in, rows, cols, out));
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

void launch_fill_random_bf16(bf16* out, size_t n, float std, float constant, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<1024, 256, 0, stream>>>(out, n, std, constant, seed);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
