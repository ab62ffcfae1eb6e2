// KV-compression kernels; see compression_kernels.h and, for the exact semantics, the CPU twins in
// backend/cpu/compression_ops.h. The base scorers live in scorers/ (one file each); this file
// holds the shared stages (redundancy, finalisation), selection, compaction and query capture.
//
// The dot-product work (window queries x keys, keys x keys) runs through one 64x64 tile routine
// (compression_device.cuh) on the CUDA cores: 256 threads, each owning a 4x4 block of the tile
// (rows ty + 16 i, columns tx + 16 j), with the head dimension streamed through shared memory 32
// values at a time and accumulated with fmaf in ascending order. A pair's dot product therefore
// does not depend on where it sits in a tile, which makes the two attention passes
// (scorers/attention_scorer.cu) see identical logits and makes
// the key-key similarity exactly symmetric (fmaf(a, b, c) == fmaf(b, a, c)). The redundancy
// score finds each column's zeroed entry from the rows' side, which relies on C being symmetric;
// its tensor-core variant (head_dim 64/128, the O(n^2) flash case) sums the exact bf16 products
// in the tensor cores' order, so a pair and its mirror can differ in the last bit, which matters
// only for a similarity within rounding of the threshold.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/compression_device.cuh"
#include "backend/cuda/dynamic_smem_limit.h"
#include "backend/cuda/paged_attention_mma.cuh"
#include "backend/cuda/radix_select.cuh"
#include "backend/cuda/scorers/scorer_launchers.h"

namespace origami::cuda {
namespace {

using namespace compression_device;
using radix_select::order_key;

// Merges, across the lanes `lane ^ o` for o = lanes / 2 .. 1 (a group of `lanes` lanes that
// share a row), each lane's newest column above the redundancy threshold (`j`, -1 if none) and
// its similarity `v`: afterwards every lane of the group holds the largest j and its v.
template <int kLanes>
__device__ __forceinline__ void merge_newest_similar(int& j, float& v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) {
    const int oj = __shfl_xor_sync(kFull, j, o);
    const float ov = __shfl_xor_sync(kFull, v, o);
    if (oj > j) {
      j = oj;
      v = ov;
    }
  }
}

// --- Query capture ----------------------------------------------------------------------------

__global__ void capture_queries_kernel(const bf16* q, const int32_t* dst_rows, int num_tokens, int row_elems,
                                       bf16* q_cache) {
  const int pieces = row_elems / 8;
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<long long>(num_tokens) * pieces) return;
  const int t = static_cast<int>(idx / pieces), pc = static_cast<int>(idx % pieces);
  const int row = dst_rows[t];
  if (row < 0) return;
  *reinterpret_cast<uint4*>(q_cache + static_cast<size_t>(row) * row_elems + pc * 8) =
      *reinterpret_cast<const uint4*>(q + static_cast<size_t>(t) * row_elems + pc * 8);
}

// --- Redundancy -------------------------------------------------------------------------------

// Whether redundancy_span_mma_kernel scores this job's redundancy in this launch (the plan listed
// its spans; the head dim suits the tensor cores), so the chunk-wise kernels leave it alone.
__device__ __forceinline__ bool spans_tiled(const GroupArgs& a, const CompressionJobDesc& jd) {
  return a.num_span_chunks > 0 && redundancy_tiles_head_dim(a.head_dim) && redundancy_span_tiled(jd);
}

// Grid (64-entry chunk, layer/head). |k_e| for the chunk's entries, one warp per entry.
__global__ void __launch_bounds__(kThreads) key_norms_kernel(const GroupArgs a) {
  const int job = a.chunk_job[blockIdx.x];
  const CompressionJobDesc jd = a.jobs[job];
  if (jd.redundancy == 0 || spans_tiled(a, jd)) return;  // the span kernel computes its own
  chunk_key_norms(a, job, jd, 1.0f, a.norms);
}

// What both redundancy kernels know of the 64-row chunk their block owns: the job's row
// (layer, KV head), the columns its rows are compared with (every entry for flash; the spans the
// rows fall in for lightning), and where the row's keys, norms and outputs are.
struct RedundancyChunk {
  bool active;     // the job scores redundancy at all
  RowInfo ri;
  int n, span, e0;  // entries, lightning span, first row of the chunk
  bool lightning;
  int col_lo, col_hi;  // columns [col_lo, col_hi) cover every pair a row of the chunk considers
  KvLayer k_layer;
  const int32_t* table;
  size_t off;  // of the row in scores/redundancy/z/norms
  const float* norms;
  float threshold;

  // Whether entry `row` is compared with entry `col` (C[row][col] counts).
  __device__ __forceinline__ bool considers(int row, int col) const {
    return row < n && col < col_hi && col != row && (!lightning || row / span == col / span);
  }
};
__device__ __forceinline__ RedundancyChunk redundancy_chunk(const GroupArgs& a) {
  RedundancyChunk c;
  const int job = a.chunk_job[blockIdx.x];
  const CompressionJobDesc& jd = a.jobs[job];
  c.active = jd.redundancy != 0 && !spans_tiled(a, jd);
  c.ri = row_info(a, job, blockIdx.y);
  c.n = jd.n;
  c.span = jd.redundancy_span;
  c.e0 = (blockIdx.x - jd.chunk0) * kTile;
  c.lightning = jd.redundancy == 2;
  c.col_lo = 0;
  c.col_hi = c.n;
  if (c.lightning) {
    const int last = min(c.e0 + kTile - 1, c.n - 1);
    c.col_lo = (c.e0 / c.span) * c.span;
    c.col_hi = min(c.n, (last / c.span + 1) * c.span);
  }
  c.k_layer = key_layer(a, c.ri.layer);
  c.table = a.pages + jd.src_page0;
  c.off = jd.score0 + static_cast<size_t>(c.ri.lh) * c.n;
  c.norms = a.norms + c.off;
  c.threshold = jd.redundancy_threshold;
  return c;
}

// Grid (64-entry chunk of rows, layer/head). For each row entry i: the sum over considered
// columns j != i of C[i][j] = k_i . k_j / max(|k_i| |k_j|, 1e-8), and the largest considered j
// with C[i][j] > threshold together with that value. Flash considers every j < n; lightning only
// j in i's span (jd.redundancy_span entries; one block by default). Since C is symmetric, that j is the row cpu::redundancy_scores zeroes in column
// i; the finalize kernel subtracts those values from the row sums.
__global__ void __launch_bounds__(kThreads) redundancy_kernel(const GroupArgs a) {
  __shared__ TileSmem sm;
  const RedundancyChunk rc = redundancy_chunk(a);
  if (!rc.active) return;
  const int t = threadIdx.x, lr = t >> 2, ty = t >> 4, tx = t & 15;
  const KvRow a_row = rc.e0 + lr < rc.n ? key_row(a, rc.k_layer, rc.table, rc.e0 + lr, rc.ri.head) : KvRow{};
  int row_e[4], last_j[4];
  float row_norm[4], row_sum[4], last_v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    row_e[i] = rc.e0 + ty + 16 * i;
    row_norm[i] = row_e[i] < rc.n ? rc.norms[row_e[i]] : 0.0f;
    row_sum[i] = 0.0f;
    last_j[i] = -1;
    last_v[i] = 0.0f;
  }
  for (int c0 = rc.col_lo; c0 < rc.col_hi; c0 += kTile) {
    const KvRow b_row = c0 + lr < rc.col_hi ? key_row(a, rc.k_layer, rc.table, c0 + lr, rc.ri.head) : KvRow{};
    float acc[4][4];
    tile_dots(a_row, b_row, a.head_dim, sm, acc);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cj = c0 + tx + 16 * j;
      const float col_norm = cj < rc.col_hi ? rc.norms[cj] : 0.0f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (!rc.considers(row_e[i], cj)) continue;
        const float c = acc[i][j] / fmaxf(row_norm[i] * col_norm, 1e-8f);
        row_sum[i] += c;
        if (c > rc.threshold) {  // columns ascend, so the last one seen is the largest j
          last_j[i] = cj;
          last_v[i] = c;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float sum = halfwarp_sum(row_sum[i]);
    int lj = last_j[i];
    float lv = last_v[i];
    merge_newest_similar<16>(lj, lv);
    if (tx == 0 && row_e[i] < rc.n) {
      a.redundancy[rc.off + row_e[i]] = sum;
      a.z[rc.off + row_e[i]] = make_int2(lj, __float_as_int(lv));
    }
  }
}

// The tensor-core redundancy kernels' end for a lane's rows g and g + 8 (row_e, of the row block
// at `off` in the scratch; rows at or past `end` are not written): the row sums over the columns
// of its quad, and the newest partner above the threshold, stored by the quad's first lane.
__device__ __forceinline__ void store_redundancy_rows(const GroupArgs& a, size_t off, const int (&row_e)[2], int end,
                                                      const float (&row_sum)[2], const int (&last_j)[2],
                                                      const float (&last_v)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) sum += __shfl_xor_sync(kFull, sum, o);
    int lj = last_j[h];
    float lv = last_v[h];
    merge_newest_similar<4>(lj, lv);
    if ((threadIdx.x & 3) == 0 && row_e[h] < end) {
      a.redundancy[off + row_e[h]] = sum;
      a.z[off + row_e[h]] = make_int2(lj, __float_as_int(lv));
    }
  }
}

// The same on the tensor cores (head_dim 64 or 128): 4 warps, each owning 16 of the 64 rows
// against the 64 columns of a tile (mma.m16n8k16, bf16 in, fp32 out, fragments as in the
// attention kernel). The products of bf16 values are exact, so only the fp32 summation order
// differs from the CUDA-core path; lanes hold rows g and g + 8 of their warp's 16 and columns
// 8 n + 2 (lane % 4) + {0, 1}, reduced over the 4 lanes of a quad at the end.
//
// FP8 cache (kFp8): the tiles hold the E4M3 codes' values as bf16 WITHOUT the scales
// (KeyRowsLoad), so the tensor cores form c_i . c_j from exact products as above, and
// k_i . k_j = (s_i s_j) (c_i . c_j) in fp32: one rounding more than the CPU's sum of dequantized
// products, and (s_i s_j) is symmetric, so the mirror pair differs only as in the bf16 case. The
// scales ride in shared memory beside the norms.
template <int D, bool kFp8>
__global__ void __launch_bounds__(128) redundancy_mma_kernel(const GroupArgs a) {
  constexpr int kStride = D + 8;  // +16 B per row: the 8 rows of an ldmatrix hit distinct banks
  __shared__ __align__(16) bf16 sa[kTile * kStride];
  __shared__ __align__(16) bf16 sb[kTile * kStride];
  __shared__ float col_norm[kTile];
  __shared__ float row_scale[kFp8 ? kTile : 1], col_scale[kFp8 ? kTile : 1];
  const RedundancyChunk rc = redundancy_chunk(a);
  if (!rc.active) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  auto load_tile = [&](bf16* dst, float* scales, int base, int end) {
    KeyRowsLoad<D, kFp8, 128, kTile> tile;
    tile.fetch(a, rc.k_layer, rc.table, rc.ri.head, base, end, kTile);
    tile.store(kTile, dst, kStride, scales);
  };
  load_tile(sa, row_scale, rc.e0, rc.n);
  int row_e[2], last_j[2];
  float row_norm[2], row_sum[2], last_v[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_e[h] = rc.e0 + warp * 16 + g + 8 * h;
    row_norm[h] = row_e[h] < rc.n ? rc.norms[row_e[h]] : 0.0f;
    row_sum[h] = 0.0f;
    last_j[h] = -1;
    last_v[h] = 0.0f;
  }
  for (int c0 = rc.col_lo; c0 < rc.col_hi; c0 += kTile) {
    __syncthreads();  // the previous column tile is consumed
    load_tile(sb, col_scale, c0, rc.col_hi);
    if (tid < kTile) col_norm[tid] = c0 + tid < rc.col_hi ? rc.norms[c0 + tid] : 0.0f;
    __syncthreads();
    float s[kTile / 8][4];
    warp_tile_dots_mma<D>(sa + warp * 16 * kStride, sb, kStride, s);
#pragma unroll
    for (int x = 0; x < kTile / 8; ++x)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i >> 1, cl = x * 8 + 2 * t4 + (i & 1), cj = c0 + cl;
        if (!rc.considers(row_e[h], cj)) continue;
        float dot = s[x][i];
        if constexpr (kFp8) dot *= row_scale[warp * 16 + g + 8 * h] * col_scale[cl];
        const float c = dot / fmaxf(row_norm[h] * col_norm[cl], 1e-8f);
        row_sum[h] += c;
        if (c > rc.threshold && cj > last_j[h]) {
          last_j[h] = cj;
          last_v[h] = c;
        }
      }
  }
  store_redundancy_rows(a, rc.off, row_e, rc.n, row_sum, last_j, last_v);
}

// Lightning redundancy span by span (redundancy_span_tiled jobs): one block of 8 warps per (span,
// layer/head) loads the span's keys into shared memory once (dynamic shared memory: up to
// kMaxTiledSpan rows), computes their norms there (as key_norms_kernel does, bit for bit), and
// compares every row with every column of the span on the tensor cores. Warp w owns rows
// 32 w .. 32 w + 31 as two 16-row tiles; the products and their order are those of
// redundancy_mma_kernel (the quotient by the norms a fast division). Against that kernel, which
// reloads a span's columns for each of its 64-row chunks and recomputes which span a pair is in,
// this reads each key once per span (4x fewer loads at spans of 256) and its pairs are in the span
// by construction.
// (256, 3): three blocks a SM, what its shared memory allows, need at most 85 registers a thread.
template <int D, bool kFp8>
__global__ void __launch_bounds__(256, 3) redundancy_span_mma_kernel(const GroupArgs a) {
  constexpr int kStride = D + 8;  // +16 B per row: the 8 rows of an ldmatrix hit distinct banks
  extern __shared__ __align__(16) unsigned char span_smem[];
  bf16* sk = reinterpret_cast<bf16*>(span_smem);
  float* key_scale = reinterpret_cast<float*>(sk + kMaxTiledSpan * kStride);
  float* norm = key_scale + kMaxTiledSpan;
  const int chunk = a.span_chunks[blockIdx.x];
  const int job = a.chunk_job[chunk];
  const CompressionJobDesc& jd = a.jobs[job];
  const RowInfo ri = row_info(a, job, blockIdx.y);
  const int s0 = (chunk - jd.chunk0) * kTile, s1 = min(jd.n, s0 + jd.redundancy_span);
  const int rows = ((s1 - s0 + kTile - 1) / kTile) * kTile;  // whole tiles, zero past s1
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  for (int t = 0; t < rows; t += kTile) {  // a tile at a time: fewer live registers than the span at once
    KeyRowsLoad<D, kFp8, 256, kTile> keys;
    keys.fetch(a, k_layer, table, ri.head, s0 + t, s1, kTile);
    keys.store(kTile, sk + t * kStride, kStride, key_scale + t);
  }
  __syncthreads();
  for (int r = warp; r < rows; r += 8) {  // lane_sum_squares' order, then key_norms' shuffle
    const float sc = kFp8 ? key_scale[r] : 1.0f;
    float ss = 0.0f;
    for (int x = lane; x < D; x += 32) {
      float v = __bfloat162float(sk[r * kStride + x]);
      if constexpr (kFp8) v = __fmul_rn(v, sc);
      ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
    if (lane == 0) norm[r] = sqrtf(ss);
  }
  __syncthreads();
  const size_t off = jd.score0 + static_cast<size_t>(ri.lh) * jd.n;
  const float threshold = jd.redundancy_threshold;
  for (int mt = 0; mt < 2; ++mt) {
    const int rb = warp * 32 + mt * 16;  // the warp's 16-row tile (warp-uniform)
    if (rb >= rows) break;
    int row_e[2], last_j[2];
    float row_norm[2], row_scale[2], row_sum[2], last_v[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = rb + g + 8 * h;
      row_e[h] = s0 + r;
      row_norm[h] = norm[r];
      row_scale[h] = kFp8 ? key_scale[r] : 1.0f;
      row_sum[h] = 0.0f;
      last_j[h] = -1;
      last_v[h] = 0.0f;
    }
    for (int c0 = 0; c0 < rows; c0 += kTile) {
      float s[kTile / 8][4];
      warp_tile_dots_mma<D>(sk + rb * kStride, sk + c0 * kStride, kStride, s);
      // Only a tile on the diagonal holds pairs (i, i), only the span's last tiles pairs past its
      // end: elsewhere (most tiles) no pair needs a check. __fdividef: the quotient within 2 ulp
      // of the CPU's division, which the scores' tolerance covers (the denominators are norms,
      // far from its range limits).
      const bool checked = c0 == (rb & ~(kTile - 1)) || c0 + kTile > s1 - s0 || rb + 16 > s1 - s0;
#pragma unroll
      for (int x = 0; x < kTile / 8; ++x)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = i >> 1, cl = c0 + x * 8 + 2 * t4 + (i & 1), cj = s0 + cl;
          if (checked && (row_e[h] >= s1 || cj >= s1 || cj == row_e[h])) continue;
          float dot = s[x][i];
          if constexpr (kFp8) dot *= row_scale[h] * key_scale[cl];
          const float c = __fdividef(dot, fmaxf(row_norm[h] * norm[cl], 1e-8f));
          row_sum[h] += c;
          if (c > threshold) {  // columns ascend within a lane, so the last one seen is its largest j
            last_j[h] = cj;
            last_v[h] = c;
          }
        }
    }
    store_redundancy_rows(a, off, row_e, s1, row_sum, last_j, last_v);
  }
}

template <int D, bool kFp8>
cudaError_t launch_redundancy_spans(const GroupArgs& a, int rpj, cudaStream_t stream) {
  constexpr size_t kBytes = kMaxTiledSpan * (D + 8) * sizeof(bf16) + 2 * kMaxTiledSpan * sizeof(float);
  static DynamicSmemLimit limit;
  if (cudaError_t err = limit.ensure(redundancy_span_mma_kernel<D, kFp8>, kBytes); err != cudaSuccess) return err;
  redundancy_span_mma_kernel<D, kFp8><<<dim3(a.num_span_chunks, rpj), 256, kBytes, stream>>>(a);
  return cudaGetLastError();
}

// --- Per-row finalisation ---------------------------------------------------------------------

// Block-wide reduction of one value per thread (all threads call; returns the result to all).
template <bool kMax>
__device__ float block_reduce(float v, float* smem32) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(kFull, v, o);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();  // smem32 may still be read by a previous call
  if (lane == 0) smem32[warp] = v;
  __syncthreads();
  float r = smem32[0];
  for (int w = 1; w < warps; ++w) r = kMax ? fmaxf(r, smem32[w]) : r + smem32[w];
  return r;
}

// Grid (row). Global update (S = F = max(decay * F_prev, S), or decay * F_prev + S, on scored entries), pooling,
// redundancy softmax and combination, protection: cpu::score_head steps 2-5.
__global__ void __launch_bounds__(kRowThreads) finalize_kernel(const GroupArgs a) {
  __shared__ float red[32];
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  const int n = jd.n, bs = a.block_size;
  const size_t off = jd.score0 + static_cast<size_t>(ri.lh) * n;
  float* S = a.scores + off;
  float* T = a.final_scores + off;
  const int32_t* table = a.pages + jd.src_page0;
  const float* f_layer = a.f != nullptr ? a.f + ri.layer * a.f_layer_pitch : nullptr;

  // Step 2: global update of the base score S (written by the job's scorer, scorers/*.cu); S keeps
  // the result (the entries' new F).
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    float s = S[e];
    if (jd.global_decay > 0.0f && e < jd.num_scored) {
      const float prev = f_layer[f_offset(a, table[e / bs], ri.head, e % bs)];
      // Rounded as the CPU's two statements (no fused multiply-add).
      const float decayed = __fmul_rn(jd.global_decay, prev);
      s = jd.global_sum ? __fadd_rn(decayed, s) : (decayed < s ? s : decayed);  // sum, or std::max(decayed, s)
    }
    S[e] = s;
  }
  __syncthreads();

  // Step 4 (first half): the redundancy distribution R = softmax(rowsum / L / tau).
  float* R = a.redundancy + off;
  float r_max = 0.0f, r_inv = 0.0f;
  const bool lightning = jd.redundancy == 2;
  auto r_logit = [&](int e) {
    float len = static_cast<float>(n);
    if (lightning) len = static_cast<float>(min(jd.redundancy_span, n - (e / jd.redundancy_span) * jd.redundancy_span));
    return __ldcg(R + e) / len / jd.redundancy_tau;
  };
  if (jd.redundancy != 0) {
    const int2* z = a.z + off;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const int2 zj = z[j];
      if (zj.x >= 0) atomicAdd(R + zj.x, -__int_as_float(zj.y));
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < n; e += blockDim.x) mx = fmaxf(mx, r_logit(e));
    r_max = block_reduce<true>(mx, red);
    float sum = 0.0f;
    for (int e = threadIdx.x; e < n; e += blockDim.x) sum += expf(r_logit(e) - r_max);
    r_inv = 1.0f / block_reduce<false>(sum, red);
  }

  // Steps 3-5: pooling, combination, protection.
  const int half = jd.pool_kernel > 1 ? jd.pool_kernel / 2 : -1;
  const int protect_from = n - min(max(jd.protect_window, 0), n);
  const int sinks = min(max(jd.num_sinks, 0), n);
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    float v;
    if (half >= 0) {
      const int lo = max(0, e - half), hi = min(n - 1, e + half);
      if (jd.pool_avg) {
        float sum = 0.0f;
        for (int x = lo; x <= hi; ++x) sum += __ldcg(S + x);
        v = sum / static_cast<float>(hi - lo + 1);
      } else {
        v = __ldcg(S + lo);
        for (int x = lo + 1; x <= hi; ++x) {
          const float o = __ldcg(S + x);
          v = v < o ? o : v;  // std::max(v, o)
        }
      }
    } else {
      v = __ldcg(S + e);
    }
    if (jd.redundancy != 0) {
      const float r = expf(r_logit(e) - r_max) * r_inv;
      v = jd.redundancy_lambda * v - (1.0f - jd.redundancy_lambda) * r;
    }
    if (e >= protect_from || e < sinks) v = INFINITY;
    T[e] = v;
  }
}

// --- Selection --------------------------------------------------------------------------------

// Grid (row). Radix select (radix_select.cuh) of the k-th largest key (k: the job's count,
// kept_count()); keys are unique, so exactly k entries have a key >= it. Then an ordered
// compaction writes the kept indices ascending.
__global__ void __launch_bounds__(kSelectThreads) select_kernel(const GroupArgs a) {
  __shared__ radix_select::RadixSmem radix;
  __shared__ int s_total;
  __shared__ int warp_off[32];
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  const int n = jd.n, k = kept_count(a, ri.job, jd);
  if (k <= 0) return;
  const float* T = a.final_scores + jd.score0 + static_cast<size_t>(ri.lh) * n;
  int32_t* keep = a.keep + jd.keep0 + static_cast<size_t>(ri.lh) * jd.num_keep;
  const int t = threadIdx.x;
  if (k >= n) {
    for (int e = t; e < n; e += blockDim.x) keep[e] = e;
    return;
  }
  const unsigned long long threshold =
      radix_select::block_kth_key(
          k,
          [&](auto&& f) {
            for (int e = t; e < n; e += blockDim.x) f(order_key(T[e], e));
          },
          radix)
          .key;

  const int lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
  int base = 0;
  for (int e0 = 0; e0 < n; e0 += blockDim.x) {
    const int e = e0 + t;
    const bool flag = e < n && order_key(T[e], e) >= threshold;
    const unsigned ballot = __ballot_sync(kFull, flag);
    const int before = __popc(ballot & ((1u << lane) - 1u));
    if (lane == 0) warp_off[warp] = __popc(ballot);
    __syncthreads();
    if (warp == 0) {
      const int c = lane < warps ? warp_off[lane] : 0;
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(kFull, incl, o);
        if (lane >= o) incl += y;
      }
      if (lane < warps) warp_off[lane] = incl - c;
      if (lane == 31) s_total = incl;
    }
    __syncthreads();
    if (flag) keep[base + warp_off[warp] + before] = e;
    base += s_total;
    __syncthreads();  // warp_off and s_total are rewritten next round
  }
}

// --- Compaction -------------------------------------------------------------------------------

// Grid (row). Destination entries in chunks of 64: every thread first loads its pieces of the
// chunk's source rows into registers, then (after a barrier) stores them. A destination slot
// is at most its source slot's table position (the precondition), so a chunk's stores never hit
// a source read by a later chunk, and the barrier keeps them from a source of the same chunk.
// A piece is 8 values: 16 bytes of bf16, or (kFp8) 8 bytes of codes, with the row's K and V
// scales moved by the thread of the row like F.
template <bool kFp8>
__global__ void __launch_bounds__(kThreads) compact_kernel(const GroupArgs a) {
  constexpr int kMaxPieces = 8;  // head_dim <= 256: (64 rows * 32 pieces) / 256 threads
  using Piece = std::conditional_t<kFp8, uint2, uint4>;
  using Elem = std::conditional_t<kFp8, uint8_t, bf16>;
  const int rpj = a.num_group_layers * a.num_kv_heads;
  const RowInfo ri = row_info(a, blockIdx.x / rpj, blockIdx.x % rpj);
  const CompressionJobDesc jd = a.jobs[ri.job];
  const int k = kept_count(a, ri.job, jd), bs = a.block_size, d = a.head_dim;
  if (k <= 0) return;
  const int32_t* keep = a.keep + jd.keep0 + static_cast<size_t>(ri.lh) * jd.num_keep;
  const int32_t* src = a.pages + jd.src_page0;
  const int32_t* dst = a.pages + jd.dst_page0;
  Elem* k_layer;
  Elem* v_layer;
  float* k_scales = nullptr;
  float* v_scales = nullptr;
  if constexpr (kFp8) {
    k_layer = a.k8 + ri.layer * a.kv_layer_pitch;
    v_layer = a.v8 + ri.layer * a.kv_layer_pitch;
    k_scales = a.k_scales + ri.layer * (a.kv_layer_pitch / d);
    v_scales = a.v_scales + ri.layer * (a.kv_layer_pitch / d);
  } else {
    k_layer = a.k + ri.layer * a.kv_layer_pitch;
    v_layer = a.v + ri.layer * a.kv_layer_pitch;
  }
  const bool move_f = jd.global_decay > 0.0f && a.f != nullptr;
  float* f_layer = move_f ? a.f + ri.layer * a.f_layer_pitch : nullptr;
  const float* new_f = a.scores + jd.score0 + static_cast<size_t>(ri.lh) * jd.n;
  const int pieces = d / 8, per_thread = (kTile * pieces) / kThreads;
  const int t = threadIdx.x;
  for (int i0 = 0; i0 < k; i0 += kTile) {
    Piece kb[kMaxPieces], vb[kMaxPieces];
    size_t to[kMaxPieces];
    bool moves[kMaxPieces];
#pragma unroll
    for (int it = 0; it < kMaxPieces; ++it) {
      moves[it] = false;
      if (it >= per_thread) continue;
      const int idx = it * kThreads + t, r = idx / pieces, pc = idx % pieces, i = i0 + r;
      if (i >= k) continue;
      const int e = keep[i];
      const size_t from = kv_offset(a, src[e / bs], ri.head, e % bs) + pc * 8;
      to[it] = kv_offset(a, dst[i / bs], ri.head, i % bs) + pc * 8;
      if (from == to[it]) continue;
      moves[it] = true;
      kb[it] = *reinterpret_cast<const Piece*>(k_layer + from);
      vb[it] = *reinterpret_cast<const Piece*>(v_layer + from);
    }
    float fv = 0.0f;
    size_t f_to = 0;
    const bool f_move = move_f && t < kTile && i0 + t < k;
    if (f_move) {
      const int i = i0 + t;
      fv = new_f[keep[i]];
      f_to = f_offset(a, dst[i / bs], ri.head, i % bs);
    }
    // FP8: thread t < 64 moves the K and V scales of the chunk's row t.
    float ks = 0.0f, vs = 0.0f;
    size_t s_to = 0;
    bool s_move = false;
    if constexpr (kFp8) {
      if (t < kTile && i0 + t < k) {
        const int i = i0 + t, e = keep[i];
        const size_t s_from = kv_row_index(a, src[e / bs], ri.head, e % bs);
        s_to = kv_row_index(a, dst[i / bs], ri.head, i % bs);
        s_move = s_from != s_to;
        if (s_move) {
          ks = k_scales[s_from];
          vs = v_scales[s_from];
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < kMaxPieces; ++it) {
      if (!moves[it]) continue;
      *reinterpret_cast<Piece*>(k_layer + to[it]) = kb[it];
      *reinterpret_cast<Piece*>(v_layer + to[it]) = vb[it];
    }
    if (f_move) f_layer[f_to] = fv;
    if (s_move) {
      k_scales[s_to] = ks;
      v_scales[s_to] = vs;
    }
  }
}

// FP8 (k8 set): every one of its pointers set, and head_dim a multiple of 32 (as kDk already
// requires; the write kernel's condition too).
bool valid_geometry(const GroupArgs& a) {
  return a.num_jobs >= 0 && a.num_group_layers >= 1 && a.num_kv_heads >= 1 && a.group_size >= 1 &&
         a.group_size <= kTile && a.head_dim >= kDk && a.head_dim <= 256 && a.head_dim % kDk == 0 &&
         a.block_size >= 1 && a.num_group_layers * a.num_kv_heads <= 65535 &&
         (a.k8 == nullptr || (a.v8 != nullptr && a.k_scales != nullptr && a.v_scales != nullptr));
}

}  // namespace

int rows_per_job(const GroupArgs& a) { return a.num_group_layers * a.num_kv_heads; }

void launch_capture_queries(const bf16* q, const int32_t* dst_rows, int num_tokens, int row_elems, bf16* q_cache,
                            cudaStream_t stream) {
  if (num_tokens <= 0) return;
  const long long total = static_cast<long long>(num_tokens) * (row_elems / 8);
  constexpr int kBlock = 256;
  capture_queries_kernel<<<static_cast<unsigned>((total + kBlock - 1) / kBlock), kBlock, 0, stream>>>(
      q, dst_rows, num_tokens, row_elems, q_cache);
}

cudaError_t launch_base_scores(const GroupArgs& a, cudaStream_t stream) {
  if (!valid_geometry(a)) return cudaErrorInvalidValue;
  if (a.num_jobs == 0) return cudaSuccess;
  // Each base scorer used in the group writes S (scores) for its jobs' rows.
#define ORIGAMI_LAUNCH_SCORER(e, name, q, summary)               \
  if (a.scorers & scorer_bit(Scorer::e)) {                     \
    const cudaError_t err = launch_score_##name(a, stream);    \
    if (err != cudaSuccess) return err;                        \
  }
  ORIGAMI_BASE_SCORERS(ORIGAMI_LAUNCH_SCORER)
#undef ORIGAMI_LAUNCH_SCORER
  return cudaSuccess;
}

cudaError_t launch_compression_scores(const GroupArgs& a, cudaStream_t stream) {
  if (!valid_geometry(a)) return cudaErrorInvalidValue;
  if (a.num_jobs == 0) return cudaSuccess;
  const int rpj = rows_per_job(a), rows = a.num_jobs * rpj;
  // Step 1: the base scores.
  const cudaError_t base = launch_base_scores(a, stream);
  if (base != cudaSuccess) return base;
  const bool fp8 = a.k8 != nullptr;
  // Span-tiled jobs first (redundancy_span_tiled), then any other redundancy job chunk by chunk.
  const bool spans = a.any_redundancy && a.num_span_chunks > 0 && redundancy_tiles_head_dim(a.head_dim);
  if (spans) {
    const cudaError_t err = a.head_dim == 64 ? (fp8 ? launch_redundancy_spans<64, true>(a, rpj, stream)
                                                    : launch_redundancy_spans<64, false>(a, rpj, stream))
                                             : (fp8 ? launch_redundancy_spans<128, true>(a, rpj, stream)
                                                    : launch_redundancy_spans<128, false>(a, rpj, stream));
    if (err != cudaSuccess) return err;
  }
  if (a.any_redundancy && (!spans || a.other_redundancy)) {
    key_norms_kernel<<<dim3(a.num_chunks, rpj), kThreads, 0, stream>>>(a);
    const dim3 grid(a.num_chunks, rpj);
    if (a.head_dim == 64 && fp8)
      redundancy_mma_kernel<64, true><<<grid, 128, 0, stream>>>(a);
    else if (a.head_dim == 64)
      redundancy_mma_kernel<64, false><<<grid, 128, 0, stream>>>(a);
    else if (a.head_dim == 128 && fp8)
      redundancy_mma_kernel<128, true><<<grid, 128, 0, stream>>>(a);
    else if (a.head_dim == 128)
      redundancy_mma_kernel<128, false><<<grid, 128, 0, stream>>>(a);
    else
      redundancy_kernel<<<grid, kThreads, 0, stream>>>(a);
  }
  finalize_kernel<<<rows, kRowThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_compression_select(const GroupArgs& a, cudaStream_t stream) {
  if (!valid_geometry(a)) return cudaErrorInvalidValue;
  if (a.num_jobs == 0) return cudaSuccess;
  select_kernel<<<a.num_jobs * rows_per_job(a), kSelectThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t launch_compression_compact(const GroupArgs& a, cudaStream_t stream) {
  if (!valid_geometry(a)) return cudaErrorInvalidValue;
  if (a.num_jobs == 0) return cudaSuccess;
  if (a.k8 != nullptr)
    compact_kernel<true><<<a.num_jobs * rows_per_job(a), kThreads, 0, stream>>>(a);
  else
    compact_kernel<false><<<a.num_jobs * rows_per_job(a), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace origami::cuda
