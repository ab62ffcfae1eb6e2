// `attention` base scorer on the GPU: the observation window's attention (Zipage C.2, SnapKV),
// cpu::window_attention_scores' twin (backend/cpu/compression_ops.h), in two passes over the keys:
// softmax statistics, then probabilities, both passes computing identical logits.
//
// Two implementations. The tensor-core one (head_dim 64 or 128, a window of at most 64 query rows,
// GQA groups of 1, 2, 4 or 8 heads: every model origami serves) runs one block per row (job, layer,
// KV head): the window's queries stay in shared memory while the keys stream by twice, 64 at a
// time, through mma.m16n8k16. The products are exact (bf16 queries times bf16 keys, or times FP8
// codes whose scale multiplies the fp32 sum: KeyRowsLoad), so only the fp32 summation order
// differs from the CPU's. At the max-load headline's batches (56 requests x 32 layers x 8 heads x
// 640 entries) it replaced two CUDA-core kernels of 64x64 fmaf tiles, 44% of a batch's device time
// (docs/kernels.md). The CUDA-core kernels remain for other shapes.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/paged_attention_mma.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

// --- Window attention -------------------------------------------------------------------------

// Pass 1. Grid (row, query tile). Softmax statistics (max, sum of exp) of every window query over
// the entries it sees (entries 0 .. n - w + u, causal), online over 64-entry tiles.
__global__ void __launch_bounds__(kThreads) attn_lse_kernel(const GroupArgs a) {
  __shared__ TileSmem sm;
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  if (jd.scorer != Scorer::kAttention) return;
  const int G = a.group_size, qpt = rows_per_qtile(G), wg = jd.window * G;
  const int q0 = blockIdx.y * qpt;
  if (q0 >= wg) return;
  const int q1 = min(q0 + qpt, wg);
  const int t = threadIdx.x, lr = t >> 2, ty = t >> 4;
  const bf16* q_layer = a.q + ri.layer * a.q_layer_pitch;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  const bf16* a_row = q0 + lr < q1 ? query_row(a, q_layer, jd, ri.head, q0 + lr) : nullptr;
  int limit[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qr = q0 + ty + 16 * i;
    limit[i] = qr < q1 ? jd.n - jd.window + qr / G : -1;
  }
  float m[4], s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    s[i] = 0.0f;
  }
  for (int e0 = 0; e0 < jd.n; e0 += kTile) {
    const KvRow b_row = e0 + lr < jd.n ? key_row(a, k_layer, table, e0 + lr, ri.head) : KvRow{};
    float acc[4][4];
    tile_dots(a_row, b_row, a.head_dim, sm, acc);
    fold_softmax_tile(acc, e0, a.scale, [&](int i, int e) { return e <= limit[i]; }, m, s);  // causal
  }
  store_softmax_stats(a.lse + jd.lse0 + static_cast<size_t>(ri.lh) * wg, q0, q1, m, s);
}

// Pass 2. Grid (64-entry chunk, layer/head of the group). p = softmax probability of every
// (window query, head of the group) for the chunk's entries; per entry the max over the group's
// heads, summed over the window in ascending order and divided by w (cpu::window_attention_scores).
__global__ void __launch_bounds__(kThreads) attn_score_kernel(const GroupArgs a) {
  __shared__ TileSmem sm;
  __shared__ float p[kTile][kTile + 1];
  const int job = a.chunk_job[blockIdx.x];
  const RowInfo ri = row_info(a, job, blockIdx.y);
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.scorer != Scorer::kAttention) return;
  const int e0 = (blockIdx.x - jd.chunk0) * kTile;
  const int G = a.group_size, qpt = rows_per_qtile(G), wg = jd.window * G;
  const int t = threadIdx.x, lr = t >> 2, ty = t >> 4, tx = t & 15;
  const bf16* q_layer = a.q + ri.layer * a.q_layer_pitch;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  const KvRow b_row = e0 + lr < jd.n ? key_row(a, k_layer, table, e0 + lr, ri.head) : KvRow{};
  const float2* lse = a.lse + jd.lse0 + static_cast<size_t>(ri.lh) * wg;
  float colsum = 0.0f;  // threads 0..63: entry e0 + t
  for (int q0 = 0; q0 < wg; q0 += qpt) {
    const int q1 = min(q0 + qpt, wg);
    const bf16* a_row = q0 + lr < q1 ? query_row(a, q_layer, jd, ri.head, q0 + lr) : nullptr;
    float acc[4][4];
    tile_dots(a_row, b_row, a.head_dim, sm, acc);  // its first barrier orders p's reuse
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qr = q0 + ty + 16 * i;
      const bool valid = qr < q1;
      const float2 st = valid ? lse[qr] : make_float2(0.0f, 1.0f);
      const int limit = valid ? jd.n - jd.window + qr / G : -1;
      const float inv = 1.0f / st.y;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = e0 + tx + 16 * j;
        p[ty + 16 * i][tx + 16 * j] = e <= limit ? expf(acc[i][j] * a.scale - st.x) * inv : 0.0f;
      }
    }
    __syncthreads();
    if (t < kTile) {
      const int nu = (q1 - q0) / G;
      for (int u = 0; u < nu; ++u) {
        float best = 0.0f;
        for (int g = 0; g < G; ++g) best = fmaxf(best, p[u * G + g][t]);
        colsum += best;
      }
    }
  }
  if (t < kTile && e0 + t < jd.n)
    a.scores[jd.score0 + static_cast<size_t>(ri.lh) * jd.n + e0 + t] = colsum / static_cast<float>(jd.window);
}

// --- Window attention on the tensor cores -------------------------------------------------------

// Grid: one block of 4 warps per row. Warp w owns query rows 16 w .. 16 w + 15 of the window
// (qr = u * G + g, zero past window * G) against the 64 keys of a tile; lane (g, t4) holds rows
// g and g + 8 and columns 8 x + 2 t4 + {0, 1} (fragments: paged_attention_mma.cuh). A GQA group's
// G rows are G consecutive g of one half (G <= 8 divides 8), i.e. lanes whose bits 2 .. are equal
// but for the group's low bits: its max is an xor-shuffle over those bits, the sum over the
// warp's groups one over the bits above, and the 4 warps' sums meet in shared memory.
// (128, 6): six blocks a SM (what its shared memory allows) need at most 80 registers a thread,
// which it compiles to without spilling (at 143 registers unbounded, three blocks a SM ran).
template <int D, bool kFp8>
__global__ void __launch_bounds__(128, 6) attn_window_mma_kernel(const GroupArgs a) {
  constexpr int kStride = D + 8;  // +16 B per row: the 8 rows of an ldmatrix hit distinct banks
  __shared__ __align__(16) bf16 sq[kTile * kStride];
  __shared__ __align__(16) bf16 sk[kTile * kStride];
  __shared__ float key_scale[kFp8 ? kTile : 1];
  __shared__ float warp_sum[4][kTile];
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  if (jd.scorer != Scorer::kAttention) return;
  const int G = a.group_size, wg = jd.window * G;  // wg <= 64: the launcher's condition
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const bf16* q_layer = a.q + ri.layer * a.q_layer_pitch;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  for (int c = tid; c < kTile * (D / 8); c += 128) {
    const int r = c / (D / 8), col = (c % (D / 8)) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < wg) v = *reinterpret_cast<const uint4*>(query_row(a, q_layer, jd, ri.head, r) + col);
    *reinterpret_cast<uint4*>(sq + r * kStride + col) = v;
  }
  // The last entry window query row h of this lane sees (causal inside the window); -1: no row.
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int qr = warp * 16 + g + 8 * h;
    limit[h] = qr < wg ? jd.n - jd.window + qr / G : -1;
  }
  // s[x][i]: the logit of row h = i / 2 and column 8 x + 2 t4 + i % 2 of the tile at e0, -inf where
  // masked (entries past n are past every limit).
  auto tile_logits = [&](int e0, float (&s)[kTile / 8][4]) {
    __syncthreads();  // the previous tile is consumed (and the queries are stored)
    {
      KeyRowsLoad<D, kFp8, 128, kTile> keys;
      keys.fetch(a, k_layer, table, ri.head, e0, jd.n, kTile);
      keys.store(kTile, sk, kStride, key_scale);
    }
    __syncthreads();
    warp_tile_dots_mma<D>(sq + warp * 16 * kStride, sk, kStride, s);
#pragma unroll
    for (int x = 0; x < kTile / 8; ++x)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int cl = x * 8 + 2 * t4 + (i & 1);
        float dot = s[x][i];
        if constexpr (kFp8) dot *= key_scale[cl];
        s[x][i] = e0 + cl <= limit[i >> 1] ? dot * a.scale : -INFINITY;
      }
  };
  // Pass 1: each row's softmax statistics, online over the tiles (the quad shares a row).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int e0 = 0; e0 < jd.n; e0 += kTile) {
    float s[kTile / 8][4];
    tile_logits(e0, s);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int x = 0; x < kTile / 8; ++x) mx = fmaxf(mx, fmaxf(s[x][2 * h], s[x][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, 2));
      const float new_m = fmaxf(m[h], mx);
      float sum = 0.0f;
#pragma unroll
      for (int x = 0; x < kTile / 8; ++x)
#pragma unroll
        for (int c = 0; c < 2; ++c) sum += s[x][2 * h + c] == -INFINITY ? 0.0f : expf(s[x][2 * h + c] - new_m);
      sum += __shfl_xor_sync(kFull, sum, 1);
      sum += __shfl_xor_sync(kFull, sum, 2);
      const float keep_old = m[h] == -INFINITY ? 0.0f : expf(m[h] - new_m);
      l[h] = l[h] * keep_old + sum;
      m[h] = new_m;
    }
  }
  const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
  // Pass 2: probabilities, their max over each GQA group, summed over the window's queries.
  for (int e0 = 0; e0 < jd.n; e0 += kTile) {
    float s[kTile / 8][4];
    tile_logits(e0, s);
#pragma unroll
    for (int x = 0; x < kTile / 8; ++x)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float p[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float lg = s[x][2 * h + c];
          p[h] = lg == -INFINITY ? 0.0f : expf(lg - m[h]) * inv[h];
        }
        for (int o = 4; o < 4 * G; o <<= 1)
#pragma unroll
          for (int h = 0; h < 2; ++h) p[h] = fmaxf(p[h], __shfl_xor_sync(kFull, p[h], o));
        float sum = p[0] + p[1];  // rows g and g + 8: different groups (G <= 8)
        for (int o = 4 * G; o < 32; o <<= 1) sum += __shfl_xor_sync(kFull, sum, o);
        if (g == 0) warp_sum[warp][x * 8 + 2 * t4 + c] = sum;
      }
    __syncthreads();
    const int e = e0 + tid;
    if (tid < kTile && e < jd.n)
      a.scores[jd.score0 + static_cast<size_t>(ri.lh) * jd.n + e] =
          (warp_sum[0][tid] + warp_sum[1][tid] + warp_sum[2][tid] + warp_sum[3][tid]) / static_cast<float>(jd.window);
  }
}

// Whether the tensor-core kernel serves the group (the file comment's shapes).
bool window_mma_applies(const GroupArgs& a) {
  const int G = a.group_size;
  return (a.head_dim == 64 || a.head_dim == 128) && a.max_window_group <= kTile &&
         (G == 1 || G == 2 || G == 4 || G == 8);
}

}  // namespace

cudaError_t launch_score_attention(const GroupArgs& a, cudaStream_t stream) {
  if (a.max_window_group <= 0) return cudaSuccess;  // no job of the group has a window
  const int rpj = rows_per_job(a), rows = a.num_jobs * rpj;
  if (window_mma_applies(a)) {
    const bool fp8 = a.k8 != nullptr;
    if (a.head_dim == 64 && fp8)
      attn_window_mma_kernel<64, true><<<rows, 128, 0, stream>>>(a);
    else if (a.head_dim == 64)
      attn_window_mma_kernel<64, false><<<rows, 128, 0, stream>>>(a);
    else if (fp8)
      attn_window_mma_kernel<128, true><<<rows, 128, 0, stream>>>(a);
    else
      attn_window_mma_kernel<128, false><<<rows, 128, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const int qtiles = (a.max_window_group + rows_per_qtile(a.group_size) - 1) / rows_per_qtile(a.group_size);
  attn_lse_kernel<<<dim3(rows, qtiles), kThreads, 0, stream>>>(a);
  attn_score_kernel<<<dim3(a.num_chunks, rpj), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
