// `kara` base scorer on the GPU (Kara's sliding window), cpu::score_kara's twin
// (backend/cpu/scorers/kara_scorer.cpp), in three kernels:
//  1. softmax statistics of every window query over the compressible region's keys (no causal
//     mask), online over the 64x64 dot-product tiles (compression_device.cuh);
//  2. the importance A of each region entry: the probabilities summed over the window's queries,
//     a GQA group's heads averaged (cpu::kara_window_scores; the summation order differs, so A
//     agrees to rounding);
//  3. per row, cpu::token2chunk on A (the same total orders, so the same kept set for the same
//     A): ranks by counting (every thread ranks its entries against the whole region), the
//     chunk choice serially by one thread (at most chunk_budget / (gamma - 2) passes over the
//     region), then S = +inf for every entry before the window and every kept one, A for the
//     others. final_scores serves as the row's scratch for the marks (finalize rewrites it).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;

// Pass 1. Grid (row, query tile): (max, sum of exp) of each window query over the region.
__global__ void __launch_bounds__(kThreads) kara_lse_kernel(const GroupArgs a) {
  __shared__ TileSmem sm;
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  if (jd.scorer != Scorer::kKara || jd.kara_region <= 0) return;
  const int G = a.group_size, qpt = rows_per_qtile(G), wg = jd.window * G;
  const int q0 = blockIdx.y * qpt;
  if (q0 >= wg) return;
  const int q1 = min(q0 + qpt, wg);
  const int lr = threadIdx.x >> 2;
  const int start = jd.n - jd.window, m = jd.kara_region;
  const bf16* q_layer = a.q + ri.layer * a.q_layer_pitch;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  const bf16* a_row = q0 + lr < q1 ? query_row(a, q_layer, jd, ri.head, q0 + lr) : nullptr;
  float mx_run[4], s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    mx_run[i] = -INFINITY;
    s[i] = 0.0f;
  }
  for (int e0 = 0; e0 < m; e0 += kTile) {
    const KvRow b_row = e0 + lr < m ? key_row(a, k_layer, table, start + e0 + lr, ri.head) : KvRow{};
    float acc[4][4];
    tile_dots(a_row, b_row, a.head_dim, sm, acc);
    fold_softmax_tile(acc, e0, a.scale, [&](int, int e) { return e < m; }, mx_run, s);  // no causal mask
  }
  store_softmax_stats(a.lse + jd.lse0 + static_cast<size_t>(ri.lh) * wg, q0, q1, mx_run, s);
}

// Pass 2. Grid (64-entry chunk of the job's entries, layer/head of the group): A of the chunk's
// region entries into scores (entries outside the region are left to pass 3).
__global__ void __launch_bounds__(kThreads) kara_colsum_kernel(const GroupArgs a) {
  __shared__ TileSmem sm;
  __shared__ float p[kTile][kTile + 1];
  const int job = a.chunk_job[blockIdx.x];
  const RowInfo ri = row_info(a, job, blockIdx.y);
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.scorer != Scorer::kKara || jd.kara_region <= 0) return;
  const int start = jd.n - jd.window, m = jd.kara_region;
  const int c0 = (blockIdx.x - jd.chunk0) * kTile;  // the chunk's first entry
  if (c0 + kTile <= start || c0 >= start + m) return;
  const int G = a.group_size, qpt = rows_per_qtile(G), wg = jd.window * G;
  const int t = threadIdx.x, lr = t >> 2, ty = t >> 4, tx = t & 15;
  const bf16* q_layer = a.q + ri.layer * a.q_layer_pitch;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  auto in_region = [&](int e) { return e >= start && e < start + m; };
  const KvRow b_row = in_region(c0 + lr) ? key_row(a, k_layer, table, c0 + lr, ri.head) : KvRow{};
  const float2* lse = a.lse + jd.lse0 + static_cast<size_t>(ri.lh) * wg;
  const float inv_group = 1.0f / static_cast<float>(G);
  float colsum = 0.0f;  // threads 0..63: entry c0 + t
  for (int q0 = 0; q0 < wg; q0 += qpt) {
    const int q1 = min(q0 + qpt, wg);
    const bf16* a_row = q0 + lr < q1 ? query_row(a, q_layer, jd, ri.head, q0 + lr) : nullptr;
    float acc[4][4];
    tile_dots(a_row, b_row, a.head_dim, sm, acc);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qr = q0 + ty + 16 * i;
      const bool valid = qr < q1;
      const float2 st = valid ? lse[qr] : make_float2(0.0f, 1.0f);
      const float inv = 1.0f / st.y;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = c0 + tx + 16 * j;
        p[ty + 16 * i][tx + 16 * j] = valid && in_region(e) ? expf(acc[i][j] * a.scale - st.x) * inv : 0.0f;
      }
    }
    __syncthreads();
    if (t < kTile)
      for (int r = 0; r < q1 - q0; ++r) colsum += p[r][t] * inv_group;
  }
  if (t < kTile && in_region(c0 + t)) a.scores[row_offset(jd, ri.lh) + c0 + t] = colsum;
}

// Entry a beats entry b (cpu::select_keep's total order): higher first, NaN lowest, ties to the
// larger index.
__device__ __forceinline__ bool beats(float sa, int ia, float sb, int ib) {
  const bool na = isnan(sa), nb = isnan(sb);
  if (na != nb) return nb;
  if (!na && sa != sb) return sa > sb;
  return ia > ib;
}

// Marks in final_scores: 0 free, 1 discrete candidate, 2 chunk interior, 3 filled.
// Pass 3. Grid (row), kThreads threads.
__global__ void __launch_bounds__(kThreads) kara_select_kernel(const GroupArgs a) {
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  if (jd.scorer != Scorer::kKara) return;
  const int start = jd.n - jd.window, m = jd.kara_region;
  float* s = a.scores + row_offset(jd, ri.lh);
  const float* A = s + start;
  float* mark = a.final_scores + row_offset(jd, ri.lh) + start;
  const int total = min(jd.window_keep, m);
  const int discrete = max(total - jd.chunk_budget, 0);
  __shared__ int filled;
  // 1. Discrete candidates: the `discrete` best by A.
  for (int e = threadIdx.x; e < m; e += blockDim.x) {
    int rank = 0;
    for (int f = 0; f < m; ++f) rank += beats(A[f], f, A[e], e) ? 1 : 0;
    mark[e] = rank < discrete ? 1.0f : 0.0f;
  }
  __syncthreads();
  // 2. Token2Chunk: the best chunks between consecutive candidates, one pass per chunk.
  if (threadIdx.x == 0) {
    int marked = discrete;
    const int num_chunks = jd.chunk_budget / (jd.chunk_max_len - 2);
    for (int c = 0; c < num_chunks; ++c) {
      int prev = -1, k = 0, best_k = -1, best_lo = 0, best_hi = 0;
      float best_r = 0.0f;
      for (int e = 0; e < m; ++e) {
        if (mark[e] != 1.0f) continue;
        if (prev >= 0) {
          const int span = e - prev;
          // Not yet taken (a taken chunk's interior is marked 2).
          if (span < jd.chunk_max_len && span >= 2 && mark[prev + 1] == 0.0f) {
            const float r = (A[prev] + A[e]) * static_cast<float>(span - 1);
            if (best_k < 0 || beats(r, k, best_r, best_k)) {
              best_k = k;
              best_r = r;
              best_lo = prev + 1;
              best_hi = e;
            }
          }
          ++k;
        }
        prev = e;
      }
      if (best_k < 0) break;
      for (int e = best_lo; e < best_hi; ++e) mark[e] = 2.0f;
      marked += best_hi - best_lo;
    }
    filled = total - marked;
  }
  __syncthreads();
  // 3. Fill: the `filled` best entries among those marked neither 1 nor 2 (3 is set meanwhile by
  // other threads; it counts as free, so the ranks do not depend on timing).
  for (int e = threadIdx.x; e < m; e += blockDim.x) {
    if (mark[e] == 1.0f || mark[e] == 2.0f) continue;
    int rank = 0;
    for (int f = 0; f < m; ++f)
      if (mark[f] != 1.0f && mark[f] != 2.0f) rank += beats(A[f], f, A[e], e) ? 1 : 0;
    if (rank < filled) mark[e] = 3.0f;
  }
  __syncthreads();
  // 4. The scorer's output: +inf before the window, for kept region entries and the buffer.
  for (int e = threadIdx.x; e < jd.n; e += blockDim.x) {
    const int r = e - start;
    if (r < 0 || r >= m || mark[r] != 0.0f) s[e] = INFINITY;
  }
}

}  // namespace

cudaError_t launch_score_kara(const GroupArgs& a, cudaStream_t stream) {
  if (a.max_window_group <= 0) return cudaSuccess;
  const int rpj = rows_per_job(a), rows = a.num_jobs * rpj;
  const int qtiles = (a.max_window_group + rows_per_qtile(a.group_size) - 1) / rows_per_qtile(a.group_size);
  kara_lse_kernel<<<dim3(rows, qtiles), kThreads, 0, stream>>>(a);
  kara_colsum_kernel<<<dim3(a.num_chunks, rpj), kThreads, 0, stream>>>(a);
  kara_select_kernel<<<rows, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
