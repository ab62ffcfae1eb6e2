#pragma once
// Device helpers shared by the compression kernels (compression_kernels.cu) and the base scorers'
// launchers (scorers/*.cu): the constants and the 64x64 dot-product tile routine, bf16 loads, the
// row numbering of a group (compression_kernels.h) and the paged-cache addressing. CUDA only.
//
// The dot-product work (window queries x keys, keys x keys) runs through one 64x64 tile routine
// on the CUDA cores: 256 threads, each owning a 4x4 block of the tile (rows ty + 16 i, columns
// tx + 16 j), with the head dimension streamed through shared memory 32 values at a time and
// accumulated with fmaf in ascending order. A pair's dot product therefore does not depend on
// where it sits in a tile.
//
// K/V rows come from either pool (KvRow): the bf16 cache, or the FP8 one (--kv-cache-dtype fp8,
// GroupArgs::k8), whose rows are read as the CPU backend stores them, each code dequantized in
// fp32 (e4m3 value times the row's scale, kv/kv_cache_dtype.h), so every fp32 kernel computes
// from the same values as the CPU twin in the same fmaf order. Which pool is a property of the
// whole launch, so the branch between them is uniform.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/paged_attention_mma.cuh"

namespace origami::cuda::compression_device {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;      // entries (and query rows) per tile
constexpr int kDk = 32;        // head-dim values per shared-memory step
constexpr int kThreads = 256;  // tile kernels: 16 x 16 threads, 4 x 4 outputs each
constexpr int kRowThreads = 512;    // per-row kernels (finalize)
constexpr int kSelectThreads = 1024;
constexpr unsigned kFull = 0xffffffffu;

struct TileSmem {
  float a[kTile][kDk + 1];  // +1: the 16 rows a half-warp reads sit in distinct banks
  float b[kTile][kDk + 1];
};

// 8 bf16 values (16 bytes) as floats; zeros for a null source (rows past the end).
__device__ __forceinline__ void load8(const bf16* src, float* dst) {
  if (src == nullptr) {
#pragma unroll
    for (int q = 0; q < 8; ++q) dst[q] = 0.0f;
    return;
  }
  const uint4 raw = *reinterpret_cast<const uint4*>(src);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(h[q]);
    dst[2 * q] = f.x;
    dst[2 * q + 1] = f.y;
  }
}

// One K or V row of the paged cache: bf16 values (bf), or FP8 codes (f8) with the row's scale.
// Both null: a zero row (past the end).
struct KvRow {
  const bf16* bf = nullptr;
  const uint8_t* f8 = nullptr;
  float scale = 0.0f;
};

// The value an FP8 code of a row with scale `scale` stands for, bit for bit kv_fp8_dequantize
// (the CPU emulation's): the e4m3 value (exact in fp16, converted by the hardware) times the
// scale, rounded once (never fused into a following add).
__device__ __forceinline__ float fp8_value(uint8_t code, float scale) {
  const __half h(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3));
  return __fmul_rn(__half2float(h), scale);
}

// 8 values at `offset` of a row as floats; zeros for a null row.
__device__ __forceinline__ void load8(const bf16* row, int offset, float* dst) {
  load8(row != nullptr ? row + offset : nullptr, dst);
}
__device__ __forceinline__ void load8(const KvRow& row, int offset, float* dst) {
  if (row.f8 == nullptr) {
    load8(row.bf != nullptr ? row.bf + offset : nullptr, dst);
    return;
  }
  const uint2 raw = *reinterpret_cast<const uint2*>(row.f8 + offset);  // 8 codes
  const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[q], __NV_E4M3)));
    dst[2 * q] = __fmul_rn(f.x, row.scale);
    dst[2 * q + 1] = __fmul_rn(f.y, row.scale);
  }
}

// Sum over x = lane, lane + 32, ... < d (ascending) of row[x]^2, fmaf into fp32: one lane's part
// of a warp's sum of squares.
__device__ __forceinline__ float lane_sum_squares(const KvRow& row, int lane, int d) {
  float ss = 0.0f;
  if (row.f8 != nullptr) {
    for (int x = lane; x < d; x += 32) {
      const float v = fp8_value(row.f8[x], row.scale);
      ss = fmaf(v, v, ss);
    }
  } else {
    for (int x = lane; x < d; x += 32) {
      const float v = __bfloat162float(row.bf[x]);
      ss = fmaf(v, v, ss);
    }
  }
  return ss;
}

// Sum over x = lane, lane + 32, ... < d (ascending) of row[x] * w[x], fmaf into fp32.
__device__ __forceinline__ float lane_dot(const KvRow& row, const float* w, int lane, int d) {
  float dot = 0.0f;
  if (row.f8 != nullptr) {
    for (int x = lane; x < d; x += 32) dot = fmaf(fp8_value(row.f8[x], row.scale), w[x], dot);
  } else {
    for (int x = lane; x < d; x += 32) dot = fmaf(__bfloat162float(row.bf[x]), w[x], dot);
  }
  return dot;
}

// Value x of a row as fp32.
__device__ __forceinline__ float kv_value(const KvRow& row, int x) {
  return row.f8 != nullptr ? fp8_value(row.f8[x], row.scale) : __bfloat162float(row.bf[x]);
}

// acc[i][j] = dot(A row ty + 16 i, B row tx + 16 j) over d values. Thread t loads row t / 4 of
// both tiles (a_row / b_row: a query row's first value, a KvRow, or null / an empty KvRow for a
// zero row), 8 values at d offset k0 + (t % 4) * 8 per step. Starts with a barrier, so callers
// may reuse shared memory read after the previous call.
template <typename ARow, typename BRow>
__device__ __forceinline__ void tile_dots(const ARow& a_row, const BRow& b_row, int d, TileSmem& sm,
                                          float (&acc)[4][4]) {
  const int t = threadIdx.x, lr = t >> 2, piece = (t & 3) * 8;
  const int ty = t >> 4, tx = t & 15;
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < d; k0 += kDk) {
    float tmp[8];
    __syncthreads();
    load8(a_row, k0 + piece, tmp);
#pragma unroll
    for (int q = 0; q < 8; ++q) sm.a[lr][piece + q] = tmp[q];
    load8(b_row, k0 + piece, tmp);
#pragma unroll
    for (int q = 0; q < 8; ++q) sm.b[lr][piece + q] = tmp[q];
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kDk; ++kk) {
      float av[4], bv[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) av[i] = sm.a[ty + 16 * i][kk];
#pragma unroll
      for (int j = 0; j < 4; ++j) bv[j] = sm.b[tx + 16 * j][kk];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
}

// Reductions over the 16 lanes sharing a tile row (xor offsets < 16 stay in the half-warp).
// Every lane of the warp must call them.
__device__ __forceinline__ float halfwarp_max(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ __forceinline__ float halfwarp_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// One tile_dots tile folded into the running softmax statistics of the thread's four query rows
// (rows ty + 16 i; m: max logit, s: sum of exp(logit - m)): entry e0 + tx + 16 j counts for row i
// where sees(i, e) holds, its logit acc[i][j] * scale. Every lane of the warp must call it.
template <typename Sees>
__device__ __forceinline__ void fold_softmax_tile(const float (&acc)[4][4], int e0, float scale, Sees sees,
                                                  float (&m)[4], float (&s)[4]) {
  const int tx = threadIdx.x & 15;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float lg[4], mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int e = e0 + tx + 16 * j;
      lg[j] = sees(i, e) ? acc[i][j] * scale : -INFINITY;
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

// The statistics of the thread's rows q0 + ty + 16 i below q1 into lse (one lane of each 16).
__device__ __forceinline__ void store_softmax_stats(float2* lse, int q0, int q1, const float (&m)[4],
                                                    const float (&s)[4]) {
  const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
  if (tx != 0) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int qr = q0 + ty + 16 * i;
    if (qr < q1) lse[qr] = make_float2(m[i], s[i]);
  }
}

struct RowInfo {
  int job, lh, layer, head;  // layer: index inside the group
};
__device__ __forceinline__ RowInfo row_info(const GroupArgs& a, int job, int lh) {
  return RowInfo{job, lh, lh / a.num_kv_heads, lh % a.num_kv_heads};
}

// Offset (elements) of entry `offset` of `page` for KV head (slot) `head` in one layer's array
// whose rows are `row` elements wide and whose pages are `page_heads` head rows apart.
__device__ __forceinline__ size_t slot_offset(const GroupArgs& a, int page, int head, int offset, int row,
                                              int page_heads) {
  return ((static_cast<size_t>(page) * page_heads + head) * a.block_size + offset) * row;
}
// K/V (head_dim wide) and F (one float) entries (GroupArgs::kv_page_heads, f_page_heads).
__device__ __forceinline__ size_t kv_offset(const GroupArgs& a, int page, int head, int offset) {
  return slot_offset(a, page, head, offset, a.head_dim, a.kv_page_heads > 0 ? a.kv_page_heads : a.num_kv_heads);
}
// The K/V row's index: kv_offset / head_dim, where an FP8 cache keeps the row's scale.
__device__ __forceinline__ size_t kv_row_index(const GroupArgs& a, int page, int head, int offset) {
  return slot_offset(a, page, head, offset, 1, a.kv_page_heads > 0 ? a.kv_page_heads : a.num_kv_heads);
}
__device__ __forceinline__ size_t f_offset(const GroupArgs& a, int page, int head, int offset) {
  return slot_offset(a, page, head, offset, 1, a.f_page_heads > 0 ? a.f_page_heads : a.num_kv_heads);
}

// One layer's K (or V) of the group in whichever pool the cache uses.
struct KvLayer {
  const bf16* bf = nullptr;
  const uint8_t* f8 = nullptr;
  const float* scales = nullptr;
};
__device__ __forceinline__ KvLayer kv_layer(const GroupArgs& a, int layer, bool value) {
  KvLayer kl;
  if (a.k8 != nullptr) {
    kl.f8 = (value ? a.v8 : a.k8) + layer * a.kv_layer_pitch;
    kl.scales = (value ? a.v_scales : a.k_scales) + layer * (a.kv_layer_pitch / a.head_dim);
  } else {
    kl.bf = (value ? a.v : a.k) + layer * a.kv_layer_pitch;
  }
  return kl;
}
__device__ __forceinline__ KvLayer key_layer(const GroupArgs& a, int layer) { return kv_layer(a, layer, false); }
__device__ __forceinline__ KvLayer value_layer(const GroupArgs& a, int layer) { return kv_layer(a, layer, true); }

// Entry e (through the page table) of KV head (slot) `head` of a layer: the FP8 row's codes start
// at the element offset the bf16 row would (its scale at that offset / head_dim).
__device__ __forceinline__ KvRow key_row(const GroupArgs& a, const KvLayer& kl, const int32_t* table, int e,
                                         int head) {
  const size_t r = kv_row_index(a, table[e / a.block_size], head, e % a.block_size);
  KvRow row;
  if (kl.f8 != nullptr) {
    row.f8 = kl.f8 + r * a.head_dim;
    row.scale = kl.scales[r];
  } else {
    row.bf = kl.bf + r * a.head_dim;
  }
  return row;
}

// s = A B^T for one warp on the tensor cores (mma.m16n8k16, bf16 in, fp32 out): its 16 rows of A
// (a_rows: the first of them) against 64 rows of B (b_rows), D values each, rows `stride` bf16
// apart in shared memory. Lane (g = lane / 4, t4 = lane % 4) gets s[x][i] for row g + 8 (i / 2)
// and column 8 x + 2 t4 + i % 2 (fragments: paged_attention_mma.cuh). The k steps ascend, so a
// pair's sum does not depend on where it sits in a tile.
template <int D>
__device__ __forceinline__ void warp_tile_dots_mma(const bf16* a_rows, const bf16* b_rows, int stride,
                                                   float (&s)[kTile / 8][4]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int x = 0; x < kTile / 8; ++x) s[x][0] = s[x][1] = s[x][2] = s[x][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    attn::ldmatrix_x4(fa, a_rows + ((lane & 7) + ((lane >> 3) & 1) * 8) * stride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int n2 = 0; n2 < kTile / 16; ++n2) {
      uint32_t fb[4];
      attn::ldmatrix_x4(fb,
                        b_rows + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * stride + kk * 16 + ((lane >> 3) & 1) * 8);
      attn::mma_bf16_16816(s[2 * n2], fa, fb[0], fb[1]);
      attn::mma_bf16_16816(s[2 * n2 + 1], fa, fb[2], fb[3]);
    }
  }
}

// Keys base .. base + rows - 1 of a layer (through `table`, KV head `head`; rows at or past `end`
// zero) for the tensor cores, in two steps so that a caller can overlap the loads with work on
// the tile before: fetch() issues every global load of the block's share into registers at once
// (kRows x D / 8 pieces of 8 values over kThreadsN threads, unrolled, so their latencies overlap),
// store() writes them into a bf16 tile of rows `stride` elements apart. bf16 keys go as they are;
// FP8 keys as their E4M3 codes' values WITHOUT the scales (every E4M3 value is exact in bf16: 3
// mantissa bits, exponents 2^-9 .. 2^8), each row's scale into scales[row] (0 past the end), so a
// product with them is exact and the scale is applied to the fp32 sum. The caller synchronises.
template <int D, bool kFp8, int kThreadsN, int kRows>
struct KeyRowsLoad {
  static constexpr int kPieces = D / 8;
  static constexpr int kPer = kRows * kPieces / kThreadsN;
  static_assert(kRows * kPieces % kThreadsN == 0, "the block's threads split the pieces evenly");
  using Raw = std::conditional_t<kFp8, uint2, uint4>;  // 8 codes or 8 bf16 values
  Raw raw[kPer];
  float scale[kPer];

  __device__ __forceinline__ void fetch(const GroupArgs& a, const KvLayer& kl, const int32_t* table, int head,
                                        int base, int end, int rows) {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kThreadsN, r = c / kPieces, col = (c % kPieces) * 8;
      const int e = base + r;
      raw[k] = Raw{};
      scale[k] = 0.0f;
      if (r < rows && e < end) {
        const size_t row = kv_row_index(a, table[e / a.block_size], head, e % a.block_size);
        if constexpr (kFp8) {
          raw[k] = *reinterpret_cast<const uint2*>(kl.f8 + row * D + col);
          if (col == 0) scale[k] = kl.scales[row];
        } else {
          raw[k] = *reinterpret_cast<const uint4*>(kl.bf + row * D + col);
        }
      }
    }
  }

  __device__ __forceinline__ void store(int rows, bf16* dst, int stride, float* scales) const {
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int c = static_cast<int>(threadIdx.x) + k * kThreadsN, r = c / kPieces, col = (c % kPieces) * 8;
      if (r >= rows) continue;
      uint4 v;
      if constexpr (kFp8) {
        const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw[k]);
        __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
        for (int q = 0; q < 4; ++q)  // fp8 -> fp16 -> fp32 -> bf16, exact at every step
          out[q] = __float22bfloat162_rn(__half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[q], __NV_E4M3))));
        if (col == 0) scales[r] = scale[k];
      } else {
        v = raw[k];
      }
      *reinterpret_cast<uint4*>(dst + r * stride + col) = v;
    }
  }
};

// Query row pointer of window query `qr` (= u * group_size + g) of a job's KV head.
__device__ __forceinline__ const bf16* query_row(const GroupArgs& a, const bf16* q_layer, const CompressionJobDesc& jd,
                                                 int head, int qr) {
  const int u = qr / a.group_size, g = qr % a.group_size;
  const int slot_row = (jd.q_pos0 + u) % a.max_window;
  if (jd.heads0 >= 0) head = a.pages[jd.heads0 + head];  // head groups: the slot's KV head
  const size_t heads = static_cast<size_t>(a.q_kv_heads > 0 ? a.q_kv_heads : a.num_kv_heads) * a.group_size;
  return q_layer + static_cast<size_t>(jd.layer) * a.q_layer_pitch +
         ((static_cast<size_t>(jd.query_slot) * a.max_window + slot_row) * heads +
                    static_cast<size_t>(head) * a.group_size + g) *
                       a.head_dim;
}

// Query rows per tile: whole GQA groups, so a window query's max over its heads stays in a tile.
__device__ __host__ __forceinline__ int rows_per_qtile(int group_size) { return (kTile / group_size) * group_size; }

// Entries a job keeps per row: num_keep, or the joint selection's count (GroupArgs::kept_counts),
// which never exceeds num_keep (the destination's capacity).
__device__ __forceinline__ int kept_count(const GroupArgs& a, int job, const CompressionJobDesc& jd) {
  return jd.joint && a.kept_counts != nullptr ? min(a.kept_counts[job], jd.num_keep) : jd.num_keep;
}

// Offset (elements) of row `lh` (layer of the group * num_kv_heads + head) of a job in the
// per-entry scratch (scores, final_scores, redundancy, norms, z): entry e is at + e.
__device__ __forceinline__ size_t row_offset(const CompressionJobDesc& jd, int lh) {
  return jd.score0 + static_cast<size_t>(lh) * jd.n;
}

// For the 64-entry chunk of grid block (blockIdx.x = chunk, blockIdx.y = layer/head of the group)
// of job `job`: out[row_offset + e] = sign * |k_e| for the chunk's entries, one warp per entry
// (blockDim.x = kThreads): lane-strided fmaf sum of squares in fp32, xor-shuffle sum, sqrtf.
__device__ __forceinline__ void chunk_key_norms(const GroupArgs& a, int job, const CompressionJobDesc& jd, float sign,
                                                float* out) {
  const RowInfo ri = row_info(a, job, blockIdx.y);
  const int e0 = (blockIdx.x - jd.chunk0) * kTile;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const KvLayer k_layer = key_layer(a, ri.layer);
  const int32_t* table = a.pages + jd.src_page0;
  for (int r = warp; r < kTile; r += kThreads / 32) {
    const int e = e0 + r;
    if (e >= jd.n) break;
    float ss = lane_sum_squares(key_row(a, k_layer, table, e, ri.head), lane, a.head_dim);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
    if (lane == 0) out[row_offset(jd, ri.lh) + e] = sign * sqrtf(ss);
  }
}

}  // namespace origami::cuda::compression_device
