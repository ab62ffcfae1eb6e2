// `attention` base scorer on the GPU: the observation window's attention (Zipage C.2, SnapKV),
// cpu::window_attention_scores' twin (backend/cpu/compression_ops.h), in two passes over the
// 64x64 dot-product tiles (compression_device.cuh): softmax statistics, then probabilities. The
// tiles make both passes see identical logits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/compression_device.cuh"
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
  const int t = threadIdx.x, lr = t >> 2, ty = t >> 4, tx = t & 15;
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
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float lg[4], mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = e0 + tx + 16 * j;
        lg[j] = e <= limit[i] ? acc[i][j] * a.scale : -INFINITY;
        mx = fmaxf(mx, lg[j]);
      }
      mx = halfwarp_max(mx);
      const float new_m = fmaxf(m[i], mx);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += lg[j] == -INFINITY ? 0.0f : expf(lg[j] - new_m);
      sum = halfwarp_sum(sum);
      const float keep_old = m[i] == -INFINITY ? 0.0f : expf(m[i] - new_m);
      s[i] = s[i] * keep_old + sum;
      m[i] = new_m;
    }
  }
  if (tx == 0) {
    float2* lse = a.lse + jd.lse0 + static_cast<size_t>(ri.lh) * wg;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qr = q0 + ty + 16 * i;
      if (qr < q1) lse[qr] = make_float2(m[i], s[i]);
    }
  }
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

}  // namespace

cudaError_t launch_score_attention(const GroupArgs& a, cudaStream_t stream) {
  if (a.max_window_group <= 0) return cudaSuccess;  // no job of the group has a window
  const int rpj = rows_per_job(a), rows = a.num_jobs * rpj;
  const int qtiles = (a.max_window_group + rows_per_qtile(a.group_size) - 1) / rows_per_qtile(a.group_size);
  attn_lse_kernel<<<dim3(rows, qtiles), kThreads, 0, stream>>>(a);
  attn_score_kernel<<<dim3(a.num_chunks, rpj), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
