// Paged attention (decode, prefill, mixed) on the tensor cores; see paged_attention.h.
//
// Grid: x = query-tile slot, y = KV head, z = KV split; with ragged paging (head groups),
// y = (KV head, split) from the split map and z = 1 (paged_attention.h RaggedHeads). A CTA of 4 warps owns 64 packed query
// rows (row r of a sequence's head group = new token r / G, query head kv_head * G + r % G) and
// one KV range; each warp owns 16 rows. Tile slots are laid out without a host-side work list:
// sequence i owns slots from floor(q_indptr[i] * G / 64) + i on, which leaves every sequence at
// least the ceil(q_len * G / 64) slots it needs (the "+ i" adds one per sequence); a CTA finds
// its sequence by binary search over q_indptr and exits if its slot is a spare. This keeps the
// launch shape a function of (num_tokens, num_seqs) alone, so CUDA graphs can replay it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/dynamic_smem_limit.h"
#include "backend/cuda/paged_attention.h"
#include "backend/cuda/paged_attention_mma.cuh"
#include "backend/cuda/programmatic_launch.h"
#include "core/invariant_divider.h"

namespace origami::cuda {
namespace {

using attn::cp_async_16;
using attn::cp_async_4;
using attn::cp_async_16_bytes;
using attn::e4m3x4_to_f16x2x2;
using attn::exp2_ftz;
using attn::e4m3x4_to_f16x4;
using attn::kE4M3ToF16Scale;
using attn::mma_f16_16816;
using attn::pack_f16x2;
using attn::cp_async_commit;
using attn::cp_async_wait;
using attn::ldmatrix_x4;
using attn::ldmatrix_x4_trans;
using attn::mma_bf16_16816;
using attn::pack_bf16x2;

constexpr int kTileRows = 64;   // packed query rows per CTA of the wide kernel (prefill, mixed)
constexpr int kNarrowRows = 16; // packed query rows per CTA of the narrow kernel (decode)
constexpr int kTileKV = 64;     // KV entries per shared-memory tile
constexpr int kThreads = 128;   // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kMinChunk = 128;  // shortest KV split worth a CTA
constexpr int kMinOneWaveSplits = 4;  // plan_ragged_attention: fewer, and two waves win
constexpr float kLog2e = 1.4426950408889634f;

// A (sequence, KV head)'s split length over num_splits splits of its kv_len entries: the planned
// chunk, or an even share of kv_len (whole 64-entry tiles, at least kMinChunk) when that is
// shorter. A graph captured with a plan for the model's longest context then still spreads a short
// sequence over its splits instead of leaving all of it to the first one. Any chunk >=
// ceil(kv_len / num_splits) covers every entry. Ragged heads plan no batch-wide chunk (INT_MAX):
// each (sequence, group) shares its own length out.
__device__ __forceinline__ int split_chunk(int planned, int kv_len, int num_splits) {
  int chunk = planned;
  if (num_splits > 1) {
    const int share = (kv_len + num_splits - 1) / num_splits;
    chunk = min(chunk, max(kMinChunk, (share + kTileKV - 1) / kTileKV * kTileKV));
  }
  return chunk;
}

// Splits that start before kv_len (the rest hold nothing: a plan made for a longer context).
__device__ __forceinline__ int splits_started(int kv_len, int chunk, int num_splits) {
  return num_splits == 1 ? 1 : min(num_splits, (kv_len + chunk - 1) / chunk);
}

// Two kernels share this code (`kNarrow`):
// - wide (64 query rows a CTA, prefill and mixed batches): each warp owns 16 rows and reads
//   every entry of each KV tile;
// - narrow (16 query rows a CTA, decode: a GQA group of 4-16 heads is one tile): every warp
//   holds the same 16 rows and owns 16 entries of each 64-entry KV tile, with its own online
//   softmax, and the four warps' (max, sum, output) merge once at the end. In decode a wide CTA
//   has one warp with rows and three idle; the narrow one runs the tile's MMAs on all four.
//
// Shared memory: the Q tile, then
// - bf16 cache: two stages of (K, V) bf16 tiles, filled by cp.async;
// - FP8 cache, wide: one (K, V) pair of f16 tiles that the MMAs read (converted from the codes
//   after they land, all warps sharing the work: every warp needs every entry), the converted
//   tile's scales, and one stage of (K, V) code tiles and their per-entry scales, where the next
//   tile lands while the MMAs read the f16 tiles (TileGeom: three CTAs an SM);
// - FP8 cache, narrow: the three stages of codes only. Each warp builds its MMA fragments from
//   its own 16 entries' codes in registers (one 32-bit load and two hardware conversions per
//   four codes, fp8_narrow_tile): no f16 tiles, no second barrier per tile. K: the head dimension is permuted identically in
//   Q and K (a dot product does not care) so that lane (g, t)'s B fragment of k-step kk,
//   dims {2t, 2t+1, 2t+8, 2t+9}, is the four consecutive codes at kk*16 + 4t. V: output column
//   n of n-tile j is head dim 32 (j / 4) + 4 n + j % 4, so one 32-bit load of an entry's row
//   gives four n-tiles' codes and four loads (entries 2t, 2t+1, 2t+8, 2t+9) give a lane's B
//   fragments of four n-tiles after a byte transpose; the output is un-permuted when stored.
// The codes' rows are padded by 16 bytes so those loads hit 32 distinct banks.
// The codes become f16 exactly (wide: times 2^-8; kNarrowOScale), the MMAs run in f16 (Q converted once per CTA,
// exact for |q| in [2^-14, 65504], saturated beyond), K scales multiply the fp32 scores, V
// scales the probabilities. The narrow kernel's three stages of codes keep two tiles in flight
// per CTA.
// FP8 decode batches with a group of at most kStreamRows take paged_decode_fp8_stream_kernel
// (below), which runs this narrow kernel's tile math over a stream of work items per CTA.
template <int D, bool kFp8, bool kNarrow>
struct TileGeom {
  static constexpr int kRows = kNarrow ? kNarrowRows : kTileRows;  // query rows per CTA
  static constexpr int kStride = D + 8;  // +16 B per row: the 8 rows of an ldmatrix hit distinct banks
  static constexpr int kTileElems = kTileKV * kStride;
  static constexpr int kQElems = kRows * kStride;
  static constexpr int kKvTiles = kFp8 ? (kNarrow ? 0 : 2) : 4;  // bf16/f16 K, V tiles after Q
  static constexpr int kBf16Bytes =
      (kQElems + kKvTiles * kTileElems) * static_cast<int>(sizeof(__nv_bfloat16));
  static constexpr int kCodeStride = D + 16;                     // bytes per row of codes
  static constexpr int kCodeTileBytes = kTileKV * kCodeStride;   // one K (or V) tile of codes
  static constexpr int kStageBytes = 2 * kCodeTileBytes + 2 * kTileKV * static_cast<int>(sizeof(float));
  // FP8 wide: one stage of codes beside the f16 tiles, and the converted tile's scales kept apart
  // from it, so the next tile's codes land in the one stage while the MMAs read the f16 tiles.
  // That fits three CTAs an SM (71.6 KB at D 128, 168 registers) where three stages fitted two:
  // prefill is latency-bound at two CTAs (ncu: 1.96 warps a scheduler, 0.6 eligible), and its KV
  // tiles mostly come from L2 (each prompt's tiles are read by all its query tiles), so one tile
  // in flight covers the load. FP8 narrow: three stages of codes (two tiles in flight).
  static constexpr int kCodeStages = kFp8 && !kNarrow ? 1 : 3;
  static constexpr int kWideScaleBytes = kFp8 && !kNarrow ? 2 * kTileKV * static_cast<int>(sizeof(float)) : 0;
  static constexpr int kCodesOffset = kBf16Bytes + kWideScaleBytes;
  static constexpr int kSmemBytes = kCodesOffset + (kFp8 ? kCodeStages * kStageBytes : 0);
  // Narrow: each warp's (max, sum) per row and unnormalised output, after the KV loop, in the
  // space the KV tiles used.
  static constexpr int kMergeBytes = kWarps * kNarrowRows * (D + 2) * static_cast<int>(sizeof(float));
  static_assert(!kNarrow || kSmemBytes - kQElems * static_cast<int>(sizeof(__nv_bfloat16)) >= kMergeBytes,
                "the narrow merge must fit in the KV tiles' space");
};

struct KernelParams {
  AttentionArgs a;
  int group;          // query heads per KV head
  int num_splits;
  int kv_chunk;       // KV entries per split
  float scale_log2;   // softmax_scale * log2(e): the softmax runs on exp2
  float* part_o;      // [num_splits, num_tokens * num_heads, D] (split mode)
  float* part_lse;    // [num_splits, num_tokens * num_heads], log2 domain
  // The decode kernels' merge in the last CTA of a unit (AttentionArgs::split_counters): one
  // arrival counter per (query tile or sequence, KV head), zero before and after each launch;
  // null: the merge pass merges.
  int* split_counters;
  int unit_cost;      // the balanced kernel's fixed cost of a unit, in tiles (AttentionPlan::stream_unit_cost)
  InvariantDivider page_divider;  // entry -> page without a branch or a division (core/invariant_divider.h)
};

__device__ __forceinline__ int tile_start(const int32_t* q_indptr, int seq, int group, int rows) {
  return static_cast<int>((static_cast<long long>(q_indptr[seq]) * group) / rows) + seq;
}

// Stores one element of a finished row: bf16 to `out`, or the normalised partial and the row's
// log-sum-exp (log2 domain, written with head dim 0) to the split workspace.
template <int D>
__device__ __forceinline__ void store_out_element(const KernelParams& p, long long row, int d, float l,
                                                  float unnormalised) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  p.a.out[row * D + d] = __float2bfloat16_rn(unnormalised * inv);
}

// One element of a partial: row prow_idx of the workspace's [rows, D] outputs and its lse.
template <int D>
__device__ __forceinline__ void store_partial_element(const KernelParams& p, long long prow_idx, int d, float m,
                                                      float l, float unnormalised) {
  const float inv = l > 0.f ? 1.f / l : 0.f;
  if (d == 0) p.part_lse[prow_idx] = l > 0.f ? m + log2f(l) : -INFINITY;
  if (l > 0.f) p.part_o[prow_idx * D + d] = unnormalised * inv;  // the merge skips empty splits
}

template <int D>
__device__ __forceinline__ void store_row_element(const KernelParams& p, long long row, int split, int d, float m,
                                                  float l, float unnormalised) {
  if (p.num_splits == 1) {
    store_out_element<D>(p, row, d, l, unnormalised);
  } else {
    const long long num_rows = static_cast<long long>(p.a.shape.num_tokens) * p.a.shape.num_heads;
    store_partial_element<D>(p, split * num_rows + row, d, m, l, unnormalised);
  }
}

// The narrow kernels convert codes with the hardware instruction (exact values, not times 2^-8
// as e4m3x4_to_f16x4's), so q.k needs only the K scale; P keeps the factor 2^8 (p scale_v 2^8
// stays clear of f16's subnormals), hence their outputs carry 2^8 and are scaled back by this
// exact power of two where the warps merge: bit for bit what the integer conversion gave.
constexpr float kNarrowOScale = 1.f / kE4M3ToF16Scale;

// The fused merge (KernelParams::split_counters). Each CTA of a unit (the splits of one query
// tile's rows of one KV head) has stored its partials; it makes them visible device-wide, then
// counts itself in. The CTA that arrives last finds every other split's partials written and
// merges the unit's rows itself, so no merge pass is launched: one launch a layer instead of two,
// which at batch 1 and in short decode steps is a few microseconds of a ~50-100 us layer. It also
// resets the counter, which leaves the counters zero for the next launch (stream order, and the
// programmatic wait, keep launches apart). Every CTA of a unit must call this (all threads).
__device__ __forceinline__ bool arrive_last_of_unit(int* counter, int num_splits) {
  __shared__ int last;
  __threadfence();  // this thread's partials, before the count that publishes them
  __syncthreads();
  if (threadIdx.x == 0) {
    const int before = atomicAdd(counter, 1);
    last = before == num_splits - 1;
    if (last) *counter = 0;  // every split has arrived: nobody else touches it in this launch
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();  // the other CTAs' partials, read after their arrivals
  return true;
}

// Merges one row's splits, a warp per row and kPer = D / 32 elements a lane: out = sum_s w_s o_s /
// sum_s w_s, w_s = 2^(lse_s - max lse), empty splits (lse -inf) skipped, the sum taken in split
// order. The lanes share out the max over splits (order-free), and the sum's loads do not depend
// on each other, so a row's merge costs about one round trip to L2, not one per split. The
// partials are read through L2 (__ldcg): other CTAs wrote them. Both the merge kernel and the
// fused merge (the last CTA of a unit) call it, so their bits are the same.
template <int D>
__device__ __forceinline__ void merge_split_row(const float* part_o, const float* part_lse, long long num_rows,
                                                int num_splits, long long row, __nv_bfloat16* out) {
  constexpr int kPer = D / 32;
  const int lane = threadIdx.x & 31;
  float max_lse = -INFINITY;
  for (int s = lane; s < num_splits; s += 32) max_lse = fmaxf(max_lse, __ldcg(part_lse + s * num_rows + row));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, o));
  float acc[kPer] = {};
  float wsum = 0.f;
  if (max_lse != -INFINITY) {
#pragma unroll 4
    for (int s = 0; s < num_splits; ++s) {
      const float lse = __ldcg(part_lse + s * num_rows + row);
      if (lse == -INFINITY) continue;
      const float w = exp2f(lse - max_lse);
      wsum += w;
      const float* src = part_o + (s * num_rows + row) * D + lane * kPer;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += w * __ldcg(src + i);
    }
  }
  const float inv = wsum > 0.f ? 1.f / wsum : 0.f;
  __nv_bfloat16* dst = out + row * D + lane * kPer;
#pragma unroll
  for (int i = 0; i < kPer; i += 2)
    *reinterpret_cast<__nv_bfloat162*>(dst + i) = __floats2bfloat162_rn(acc[i] * inv, acc[i + 1] * inv);
}

// Merges the unit's rows (row_of(r) for r < num_unit_rows), a warp a row.
template <int D, typename RowOf>
__device__ __forceinline__ void merge_unit_rows(const KernelParams& p, int num_unit_rows, int num_splits, RowOf row_of) {
  const long long num_rows = static_cast<long long>(p.a.shape.num_tokens) * p.a.shape.num_heads;
  for (int r = threadIdx.x >> 5; r < num_unit_rows; r += kWarps)
    merge_split_row<D>(p.part_o, p.part_lse, num_rows, num_splits, row_of(r), p.a.out);
}

// One 64-entry KV tile of the narrow FP8 kernel for one warp: its 16 entries (warp_kv0 on) of
// the stage's codes and scales against the 16 query rows in `qf`, folded into the warp's online
// softmax (m, l: this lane's rows g and g + 8, l the lane's partial sum) and unnormalised output
// `o` (head dims permuted: o[j][i] is dim 32 (j / 4) + 4 (2 t + i % 2) + j % 4).
// `first_entry`: the KV index of the warp's first entry; entries at or past row_limit[h] are masked.
// K: lane (g, t)'s B fragment of k-step kk, dims {2t, 2t+1, 2t+8, 2t+9} in the permuted order,
// is the four consecutive codes at kk*16 + 4t (Q's A fragment is permuted alike). V: one 32-bit
// load of an entry's row holds four n-tiles' codes; four loads (entries 2t, 2t+1, 2t+8, 2t+9)
// and a byte permute per pair of codes give the B fragments. The conversions are the hardware
// cvt.rn.f16x2.e4m3x2 (one instruction per two codes): with the integer bit trick (four
// instructions per two codes) the narrow kernel was issue-bound (ncu: issue slots 55-58% busy,
// DRAM 68% at batch 1024 x 640 entries) and read FP8 at 74-85% of the copy bandwidth against
// 82-94% now.
// One tile's step of the online softmax, for the two rows (g, g + 8) a lane holds (kHalves 1:
// row g alone, the rows 8..15 of the fragments holding no query): the tile's row maxima (over the
// 4 lanes of a quad) join the running maxima m, the running sums l are rescaled, and corr / m_use
// give each row's rescale of its output and the maximum its probabilities subtract.
template <int kHalves = 2>
__device__ __forceinline__ void online_softmax_rescale(float (&row_max)[2], float (&m)[2], float (&l)[2],
                                                       float (&corr)[2], float (&m_use)[2]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 1));
    row_max[h] = fmaxf(row_max[h], __shfl_xor_sync(0xffffffffu, row_max[h], 2));
    const float m_new = fmaxf(m[h], row_max[h]);
    m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // a fully masked row stays at zero, not NaN
    corr[h] = exp2_ftz(m[h] - m_use[h]);
    m[h] = m_new;
    l[h] *= corr[h];
  }
}

// The output rows a lane holds (o[j][0..1]: row g, o[j][2..3]: row g + 8; the first kHalves of
// them) times their rescale. A row whose running maximum did not move has corr exactly 1 (2^0):
// it is skipped, which leaves o bit for bit as the multiply would. After a sequence's first
// tiles that is most tiles, and the multiplies were a quarter of the decode tile's FP32 work.
template <int kHalves = 2, int N>
__device__ __forceinline__ void rescale_output(float (&o)[N][4], const float (&corr)[2]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    if (corr[h] == 1.f) continue;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      o[j][2 * h] *= corr[h];
      o[j][2 * h + 1] *= corr[h];
    }
  }
}

// kUpperRows false (the streamed kernel: a group of at most 8 heads, so the fragments' rows 8..15
// hold no query): the softmax, rescale and V scaling of those rows are skipped and their P rows
// are zero (their output rows stay zero and are never stored); rows 0..7 get the same bits.
template <int D, int kCodeStride, bool kUpperRows = true>
__device__ __forceinline__ void fp8_narrow_tile(const KernelParams& p, const uint32_t (&qf)[D / 16][4],
                                                const unsigned char* k_codes, const float* k_scale,
                                                const float* v_scale, int warp_kv0, int first_entry,
                                                const int (&row_limit)[2], float (&o)[D / 8][4], float (&m)[2],
                                                float (&l)[2]) {
  constexpr int kCodeTileBytes = kTileKV * kCodeStride;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  float s[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(k_codes + (warp_kv0 + 8 * j + g) * kCodeStride + kk * 16 + 4 * t4);
      uint32_t b0, b1;
      e4m3x4_to_f16x2x2(w, b0, b1);
      mma_f16_16816(s[j], qf[kk], b0, b1);
    }
  // Scale (q.k = scale (q.codes)), mask, online softmax (rows are shared by the 4 lanes of a quad).
  // Element i of a lane's accumulator is row g (i < 2) or g + 8; kRowElems: the elements in use.
  constexpr int kHalves = kUpperRows ? 2 : 1;
  constexpr int kRowElems = 2 * kHalves;
  float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kRowElems; ++i) {
      const int c = n * 8 + 2 * t4 + (i & 1);
      const float x = s[n][i] * k_scale[warp_kv0 + c];
      const float v = first_entry + c < row_limit[i >> 1] ? x * p.scale_log2 : -INFINITY;
      s[n][i] = v;
      row_max[i >> 1] = fmaxf(row_max[i >> 1], v);
    }
  float corr[2], m_use[2];
  online_softmax_rescale<kHalves>(row_max, m, l, corr, m_use);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < kRowElems; ++i) {
      const float pv = exp2_ftz(s[n][i] - m_use[i >> 1]);
      s[n][i] = pv;
      l[i >> 1] += pv;
    }
  rescale_output<kHalves>(o, corr);
  // P scaled by each entry's V scale (sum_e p_e v_e = sum_e (p_e scale_e) codes_e); the row
  // sums l above took the unscaled p.
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      s[n][i] = i < kRowElems ? s[n][i] * (v_scale[warp_kv0 + n * 8 + 2 * t4 + (i & 1)] * kE4M3ToF16Scale) : 0.f;
  // O += P V: the two S accumulator tiles (16 entries) form one A fragment.
  uint32_t pa[4];
  pa[0] = pack_f16x2(s[0][0], s[0][1]);
  pa[1] = pack_f16x2(s[0][2], s[0][3]);
  pa[2] = pack_f16x2(s[1][0], s[1][1]);
  pa[3] = pack_f16x2(s[1][2], s[1][3]);
  // Entries 2t, 2t+1, 2t+8, 2t+9 of this warp's 16, head dims 32 jj + 4 g .. + 3.
  const unsigned char* v_codes = k_codes + kCodeTileBytes + (warp_kv0 + 2 * t4) * kCodeStride + 4 * g;
#pragma unroll
  for (int jj = 0; jj < D / 32; ++jj) {
    const uint32_t r0 = *reinterpret_cast<const uint32_t*>(v_codes + 32 * jj);
    const uint32_t r1 = *reinterpret_cast<const uint32_t*>(v_codes + kCodeStride + 32 * jj);
    const uint32_t r2 = *reinterpret_cast<const uint32_t*>(v_codes + 8 * kCodeStride + 32 * jj);
    const uint32_t r3 = *reinterpret_cast<const uint32_t*>(v_codes + 9 * kCodeStride + 32 * jj);
    // Bytes c and c + 1 of r0 and r1 in one word (r0.c, r1.c, r0.c+1, r1.c+1), so one permute
    // feeds two n-tiles' conversions; likewise r2 and r3.
#pragma unroll
    for (int c = 0; c < 4; c += 2) {
      const int sel = c | ((4 + c) << 4) | ((c + 1) << 8) | ((5 + c) << 12);
      uint32_t lo0, lo1, hi0, hi1;
      e4m3x4_to_f16x2x2(__byte_perm(r0, r1, sel), lo0, lo1);
      e4m3x4_to_f16x2x2(__byte_perm(r2, r3, sel), hi0, hi1);
      mma_f16_16816(o[4 * jj + c], pa, lo0, hi0);
      mma_f16_16816(o[4 * jj + c + 1], pa, lo1, hi1);
    }
  }
}

template <int D, bool kFp8, bool kNarrow>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(const KernelParams p) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  using G = TileGeom<D, kFp8, kNarrow>;
  constexpr int kRows = G::kRows;
  constexpr int kChunksPerRow = D / 8;  // 16-byte pieces of a row
  const AttentionArgs& a = p.a;
  const int slot = blockIdx.x;
  const int group = p.group;
  const RaggedHeads& rg = a.ragged;
  const bool ragged = rg.num_tables > 0;
  // This CTA's KV head, split and the head's split count; its table and slot in the page.
  int kv_head = blockIdx.y, split = blockIdx.z, num_splits = p.num_splits, table = 0;
  long long head_off = kv_head;  // head slot within a page
  if (ragged) {
    kv_head = 0;
    for (int h = 1; h < a.shape.num_kv_heads; ++h)
      if (rg.head_split0[h] <= static_cast<int>(blockIdx.y)) kv_head = h;
    split = blockIdx.y - rg.head_split0[kv_head];
    num_splits = rg.head_splits[kv_head];
    table = rg.head_table[kv_head];
    head_off = rg.head_slot[kv_head];
  }

  // Sequence owning this slot: the last one whose first slot is <= slot.
  int lo = 0, hi = a.shape.num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_start(a.q_indptr, mid, group, kRows) <= slot) lo = mid; else hi = mid - 1;
  }
  const int seq = lo;
  const int tile = slot - tile_start(a.q_indptr, seq, group, kRows);
  const int q_begin = a.q_indptr[seq];
  const int q_len = a.q_indptr[seq + 1] - q_begin;
  const int rows_total = q_len * group;
  const int row0 = tile * kRows;
  if (row0 >= rows_total) return;  // a spare slot

  const int kv_len = a.kv_len[table * a.shape.num_seqs + seq];
  const int chunk = split_chunk(ragged ? INT_MAX : p.kv_chunk, kv_len, num_splits);
  const int kv_begin = split * chunk;
  // Splits that start at or past kv_len hold nothing. With the fused merge they neither store nor
  // count in: the unit's last CTA merges the splits that start before kv_len, whose count every
  // CTA of the unit computes alike; the merge kernel skips the others' (-inf) partials anyway, so
  // the bits are the same.
  const int active_splits = splits_started(kv_len, chunk, num_splits);
  if (kNarrow && p.split_counters != nullptr && split >= active_splits) return;
  // The last split also takes anything beyond the planned length, so an under-estimated
  // max_kv_len costs speed, not correctness.
  const int split_end = (split == num_splits - 1) ? kv_len : min(kv_len, kv_begin + chunk);
  const int last_row = min(row0 + kRows, rows_total) - 1;
  const int causal_end = kv_len - q_len + last_row / group + 1;  // exclusive, for the tile's last row
  const int tile_kv_end = min(split_end, causal_end);
  const int num_kv_tiles = tile_kv_end > kv_begin ? (tile_kv_end - kv_begin + kTileKV - 1) / kTileKV : 0;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* sQ = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  // Stage st (bf16) holds K at sQ + kQElems + 2 st tiles and V right after it (arithmetic, not a
  // pointer array: a run-time index into an array would put it in local memory). FP8 wide: the
  // f16 K, V tiles are "stage 0".
  auto stage_k = [&](int st) { return sQ + G::kQElems + 2 * st * G::kTileElems; };
  // FP8: stage st's K codes, V codes (kCodeTileBytes on), K scales and V scales (kTileKV on).
  auto stage_codes = [&](int st) { return smem_raw + G::kCodesOffset + st * G::kStageBytes; };
  // FP8 wide: the converted tile's K scales, then its V scales (kTileKV each).
  float* const wide_scales = reinterpret_cast<float*>(smem_raw + G::kBf16Bytes);
  auto stage_scales = [&](int st) { return reinterpret_cast<float*>(stage_codes(st) + 2 * G::kCodeTileBytes); };

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int num_heads = a.shape.num_heads;
  const int num_kv_heads = a.shape.num_kv_heads;
  const int block_size = a.shape.block_size;
  const int32_t* pages = a.page_indices + a.page_indptr[table * a.shape.num_seqs + seq];
  // Elements from one page to the next, and from a page's start to this head's first entry.
  const long long page_stride =
      ragged ? rg.page_stride : static_cast<long long>(num_kv_heads) * block_size * D;
  const long long head_base = head_off * block_size * D;

  // Q tile: rows past the sequence's rows are zero.
  for (int c = tid; c < kRows * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const int prow = row0 + r;
    const bool valid = prow < rows_total;
    const __nv_bfloat16* src = a.q;
    if (valid) {
      const long long token = q_begin + prow / group;
      const int head = kv_head * group + prow % group;
      src = a.q + (token * num_heads + head) * D + col;
    }
    cp_async_16(sQ + r * G::kStride + col, src, valid);
  }

  // Element offset of entry e's row of this head (page lookup). The page division is a multiply-
  // high, an add and a shift for any page size (InvariantDivider), with no branch between a shift
  // and a division (the streamed kernel's measured gain: docs/kernels.md, "A branch-free load path").
  auto entry_offset = [&](int e) {
    const int page = p.page_divider.divide(e);
    const int in_page = e - page * block_size;
    return pages[page] * page_stride + head_base + static_cast<long long>(in_page) * D;
  };

  // Each thread copies one fixed 16-byte column of every (kThreads / pieces)-th row of the tile,
  // so the row's page lookup is done once per row and thread.
  auto load_kv_tile = [&](int t, int stage) {
    const int base = kv_begin + t * kTileKV;
    if constexpr (kFp8) {
      // Codes sit at the element offsets of the bf16 layout, a row's scale at offset / D (copied
      // by the thread of column 0).
      constexpr int kPieces = D / 16;  // 16-byte pieces of a row of codes
      unsigned char* codes = stage_codes(stage);
      float* scales = stage_scales(stage);
      const int col = (tid % kPieces) * 16;
      // A fixed count of rows a thread, and rows past the tile's end look up its last entry
      // (copied as zeros): no branch before the copies (as the streamed kernel's load path).
      constexpr int kRowsPerPass = kThreads / kPieces;
      static_assert(kTileKV % kRowsPerPass == 0);
#pragma unroll
      for (int i = 0; i < kTileKV / kRowsPerPass; ++i) {
        const int r = tid / kPieces + i * kRowsPerPass;
        const int e = base + r;
        const bool valid = e < tile_kv_end;
        const long long off = entry_offset(valid ? e : tile_kv_end - 1);
        cp_async_16(codes + r * G::kCodeStride + col, a.k_codes + off + col, valid);
        cp_async_16(codes + G::kCodeTileBytes + r * G::kCodeStride + col, a.v_codes + off + col, valid);
        if (col == 0) {
          cp_async_4(scales + r, a.k_scales + off / D, valid);
          cp_async_4(scales + kTileKV + r, a.v_scales + off / D, valid);
        }
      }
    } else {
      const int col = (tid % kChunksPerRow) * 8;
      constexpr int kRowsPerPass = kThreads / kChunksPerRow;
      static_assert(kThreads % kChunksPerRow == 0 && kTileKV % kRowsPerPass == 0);
#pragma unroll
      for (int i = 0; i < kTileKV / kRowsPerPass; ++i) {
        const int r = tid / kChunksPerRow + i * kRowsPerPass;
        const int e = base + r;
        const bool valid = e < tile_kv_end;
        const long long off = entry_offset(valid ? e : tile_kv_end - 1) + col;
        __nv_bfloat16* k_dst = stage_k(stage) + r * G::kStride + col;
        cp_async_16(k_dst, a.k_cache + off, valid);
        cp_async_16(k_dst + G::kTileElems, a.v_cache + off, valid);
      }
    }
  };

  if (num_kv_tiles > 0) load_kv_tile(0, 0);
  cp_async_commit();
  if constexpr (kFp8 && kNarrow) {
    if (num_kv_tiles > 1) load_kv_tile(1, 1);
    cp_async_commit();
  }

  // This lane's two rows (g and g + 8 of its warp's 16) and the first KV entry each may not see.
  // Narrow: every warp holds rows 0..15; wide: warp w holds rows 16 w ...
  const int g = lane >> 2, t4 = lane & 3;
  const int warp_row0 = kNarrow ? 0 : warp * 16;
  int row_limit[2];
  for (int h = 0; h < 2; ++h) {
    const int prow = row0 + warp_row0 + g + 8 * h;
    row_limit[h] = min(split_end, kv_len - q_len + prow / group + 1);
  }
  const bool warp_active = row0 + warp_row0 < rows_total;
  // Entries of each tile this warp reads: all 64 (wide) or its own 16 (narrow).
  constexpr int kWarpKV = kNarrow ? kTileKV / kWarps : kTileKV;
  const int warp_kv0 = kNarrow ? warp * kWarpKV : 0;

  float o[D / 8][4];
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
  // Narrow: this warp's Q fragments for every k-step, loaded once (FP8: in the permuted head
  // dimension, see above).
  uint32_t qf[kNarrow ? D / 16 : 1][4];

  for (int t = 0; t < num_kv_tiles; ++t) {
    if constexpr (kFp8 && kNarrow) {
      if (t + 2 < num_kv_tiles) load_kv_tile(t + 2, (t + 2) % G::kCodeStages);
      cp_async_commit();
      cp_async_wait<2>();
    } else if constexpr (kFp8) {
      cp_async_wait<0>();  // tile t in the one stage (loaded during tile t - 1's MMAs)
    } else {
      if (t + 1 < num_kv_tiles) load_kv_tile(t + 1, (t + 1) & 1);
      cp_async_commit();
      cp_async_wait<1>();
    }
    __syncthreads();
    if (t == 0) {
      if constexpr (kFp8) {
        // The Q tile (landed with tile 0) in f16, in place.
        for (int c = tid; c < kRows * D / 2; c += kThreads) {
          __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(sQ + (c / (D / 2)) * G::kStride + (c % (D / 2)) * 2);
          const float2 f = __bfloat1622float2(*x);
          constexpr float kF16Max = 65504.f;
          *reinterpret_cast<uint32_t*>(x) =
              pack_f16x2(fminf(fmaxf(f.x, -kF16Max), kF16Max), fminf(fmaxf(f.y, -kF16Max), kF16Max));
        }
        __syncthreads();
      }
      if constexpr (kNarrow) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          if constexpr (kFp8) {
            // A fragment of k-step kk in the permuted order: logical columns 2t, 2t+1 and
            // 2t+8, 2t+9 are head dims kk*16 + 4t .. 4t+3.
            const uint2 r0 = *reinterpret_cast<const uint2*>(sQ + g * G::kStride + kk * 16 + 4 * t4);
            const uint2 r1 = *reinterpret_cast<const uint2*>(sQ + (g + 8) * G::kStride + kk * 16 + 4 * t4);
            qf[kk][0] = r0.x; qf[kk][1] = r1.x; qf[kk][2] = r0.y; qf[kk][3] = r1.y;
          } else {
            ldmatrix_x4(qf[kk], sQ + ((lane & 7) + ((lane >> 3) & 1) * 8) * G::kStride + kk * 16 + (lane >> 4) * 8);
          }
        }
      }
    }
    const float* k_scale = nullptr;  // FP8: this tile's per-entry scales
    const float* v_scale = nullptr;
    const unsigned char* k_codes = nullptr;  // FP8 narrow: this tile's codes
    if constexpr (kFp8) {
      k_codes = stage_codes(t % G::kCodeStages);
      k_scale = stage_scales(t % G::kCodeStages);
      v_scale = k_scale + kTileKV;
      if constexpr (!kNarrow) {
        // Every warp converts its share of the stage's codes into the f16 tiles, eight codes a
        // thread at a time: eight neighbouring threads store 128 contiguous bytes of a row, which
        // hit distinct banks (sixteen codes a thread stored two 16-byte pieces 32 bytes apart, a
        // two-way conflict each: ncu counted half the stores' wavefronts as conflicts).
        constexpr int kPieces = D / 8;
        for (int c = tid; c < 2 * kTileKV * kPieces; c += kThreads) {
          const int kv = c / (kTileKV * kPieces), rem = c % (kTileKV * kPieces);
          const int r = rem / kPieces, col = (rem % kPieces) * 8;
          const uint2 raw = *reinterpret_cast<const uint2*>(k_codes + kv * G::kCodeTileBytes + r * G::kCodeStride + col);
          uint4 out;
          e4m3x4_to_f16x4(raw.x, out.x, out.y);
          e4m3x4_to_f16x4(raw.y, out.z, out.w);
          *reinterpret_cast<uint4*>(stage_k(0) + kv * G::kTileElems + r * G::kStride + col) = out;
        }
        // The scales move out of the stage with their codes.
        for (int c = tid; c < 2 * kTileKV; c += kThreads) wide_scales[c] = k_scale[c];
        __syncthreads();
        // The one stage is free: the next tile's codes land while this one's MMAs run.
        if (t + 1 < num_kv_tiles) load_kv_tile(t + 1, 0);
        cp_async_commit();
        k_scale = wide_scales;
        v_scale = wide_scales + kTileKV;
      }
    }
    if constexpr (kNarrow && kFp8) {
      fp8_narrow_tile<D, G::kCodeStride>(p, qf, k_codes, k_scale, v_scale, warp_kv0, kv_begin + t * kTileKV + warp_kv0,
                                         row_limit, o, m, l);
    } else if (warp_active) {
      const __nv_bfloat16* k_tile = kFp8 ? stage_k(0) : stage_k(t & 1);
      const __nv_bfloat16* v_tile = k_tile + G::kTileElems;
      // S = Q Kᵀ for 16 rows x this warp's entries.
      float s[kWarpKV / 8][4];
      for (int n = 0; n < kWarpKV / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      if constexpr (kNarrow) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t kb[4];
          ldmatrix_x4(kb, k_tile + (warp_kv0 + (lane & 7) + (lane >> 4) * 8) * G::kStride + kk * 16 + ((lane >> 3) & 1) * 8);
          mma_bf16_16816(s[0], qf[kk], kb[0], kb[1]);
          mma_bf16_16816(s[1], qf[kk], kb[2], kb[3]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint32_t qa[4];
          ldmatrix_x4(qa, sQ + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * G::kStride + kk * 16 + (lane >> 4) * 8);
#pragma unroll
          for (int n2 = 0; n2 < kTileKV / 16; ++n2) {
            uint32_t kb[4];
            ldmatrix_x4(kb, k_tile + (n2 * 16 + (lane & 7) + (lane >> 4) * 8) * G::kStride + kk * 16 + ((lane >> 3) & 1) * 8);
            if constexpr (kFp8) {
              mma_f16_16816(s[2 * n2], qa, kb[0], kb[1]);
              mma_f16_16816(s[2 * n2 + 1], qa, kb[2], kb[3]);
            } else {
              mma_bf16_16816(s[2 * n2], qa, kb[0], kb[1]);
              mma_bf16_16816(s[2 * n2 + 1], qa, kb[2], kb[3]);
            }
          }
        }
      }
      // Scale, mask, online softmax (rows are shared by the 4 lanes of a quad).
      const int base = kv_begin + t * kTileKV + warp_kv0;
      float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kWarpKV / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = base + n * 8 + 2 * t4 + (i & 1);
          float x = s[n][i];
          if constexpr (kFp8) x *= k_scale[warp_kv0 + n * 8 + 2 * t4 + (i & 1)] * kE4M3ToF16Scale;  // q.k = scale (q.codes)
          const float v = e < row_limit[i >> 1] ? x * p.scale_log2 : -INFINITY;
          s[n][i] = v;
          row_max[i >> 1] = fmaxf(row_max[i >> 1], v);
        }
      }
      float corr[2], m_use[2];
      online_softmax_rescale(row_max, m, l, corr, m_use);
#pragma unroll
      for (int n = 0; n < kWarpKV / 8; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float pv = exp2_ftz(s[n][i] - m_use[i >> 1]);
          s[n][i] = pv;
          l[i >> 1] += pv;
        }
      }
      rescale_output(o, corr);
      // FP8: P scaled by each entry's V scale (sum_e p_e v_e = sum_e (p_e scale_e) codes_e); the
      // row sums l above took the unscaled p.
      if constexpr (kFp8) {
#pragma unroll
        for (int n = 0; n < kWarpKV / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) s[n][i] *= v_scale[warp_kv0 + n * 8 + 2 * t4 + (i & 1)] * kE4M3ToF16Scale;
      }
      // O += P V: two S accumulator tiles (16 entries) form one A fragment.
#pragma unroll
      for (int kk = 0; kk < kWarpKV / 16; ++kk) {
        uint32_t pa[4];
        auto pack = [](float lo, float hi) { return kFp8 ? pack_f16x2(lo, hi) : pack_bf16x2(lo, hi); };
        pa[0] = pack(s[2 * kk][0], s[2 * kk][1]);
        pa[1] = pack(s[2 * kk][2], s[2 * kk][3]);
        pa[2] = pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[3] = pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
        const int v_row0 = kNarrow ? warp_kv0 : kk * 16;
#pragma unroll
        for (int j2 = 0; j2 < D / 16; ++j2) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_tile + (v_row0 + (lane & 7) + ((lane >> 3) & 1) * 8) * G::kStride + j2 * 16 + (lane >> 4) * 8);
          if constexpr (kFp8) {
            mma_f16_16816(o[2 * j2], pa, vb[0], vb[1]);
            mma_f16_16816(o[2 * j2 + 1], pa, vb[2], vb[3]);
          } else {
            mma_bf16_16816(o[2 * j2], pa, vb[0], vb[1]);
            mma_bf16_16816(o[2 * j2 + 1], pa, vb[2], vb[3]);
          }
        }
      }
    }
    __syncthreads();  // the next iteration refills the stage just read
  }
  cp_async_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }
  // Head dim of accumulator o[j][i]: n-tile j, column 2 t + (i & 1) (FP8 narrow: permuted).
  auto dim_of = [&](int j, int i) {
    const int n = 2 * t4 + (i & 1);
    return (kNarrow && kFp8) ? 32 * (j / 4) + 4 * n + j % 4 : 8 * j + n;
  };

  if constexpr (kNarrow) {
    // Merge the four warps' partial softmaxes of the same rows: m = max_w m_w, each warp's sum
    // and output weighted by 2^(m_w - m). The KV tiles' space holds them (every warp is past
    // its last read: the loop ends on a barrier, or never ran).
    __syncthreads();
    float* merge_o = reinterpret_cast<float*>(sQ + G::kQElems);      // [warp][row][D]
    float* merge_ml = merge_o + kWarps * kNarrowRows * D;               // [warp][row][2]
    const int rows = min(kNarrowRows, rows_total - row0);  // a decode tile holds `group` rows
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (r >= rows) continue;
      if (t4 == 0) {
        merge_ml[(warp * kNarrowRows + r) * 2] = m[h];
        merge_ml[(warp * kNarrowRows + r) * 2 + 1] = l[h];
      }
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
#pragma unroll
        for (int i = 0; i < 2; ++i)
          merge_o[(warp * kNarrowRows + r) * D + dim_of(j, i)] = kFp8 ? o[j][2 * h + i] * kNarrowOScale : o[j][2 * h + i];
    }
    __syncthreads();
    for (int c = tid; c < rows * D; c += kThreads) {
      const int r = c / D, d = c % D;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, merge_ml[(w * kNarrowRows + r) * 2]);
      float wsum = 0.f, acc = 0.f;
      if (mx != -INFINITY) {
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float lw = merge_ml[(w * kNarrowRows + r) * 2 + 1];
          if (lw <= 0.f) continue;
          const float f = exp2f(merge_ml[(w * kNarrowRows + r) * 2] - mx);
          wsum += lw * f;
          acc += merge_o[(w * kNarrowRows + r) * D + d] * f;
        }
      }
      const int prow = row0 + r;
      const long long row = (q_begin + prow / group) * static_cast<long long>(num_heads) + kv_head * group + prow % group;
      store_row_element<D>(p, row, split, d, mx, wsum, acc);
    }
    if (p.num_splits > 1 && p.split_counters != nullptr &&
        arrive_last_of_unit(p.split_counters + static_cast<long long>(slot) * num_kv_heads + kv_head, active_splits)) {
      merge_unit_rows<D>(p, rows, active_splits, [&](int r) {
        const int prow = row0 + r;
        return (q_begin + prow / group) * static_cast<long long>(num_heads) + kv_head * group + prow % group;
      });
    }
    return;
  }

  if (!warp_active) return;
  const long long num_rows = static_cast<long long>(a.shape.num_tokens) * num_heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int prow = row0 + warp * 16 + g + 8 * h;
    if (prow >= rows_total) continue;
    const long long token = q_begin + prow / group;
    const int head = kv_head * group + prow % group;
    const long long row = token * num_heads + head;
    const float inv = l[h] > 0.f ? 1.f / l[h] : 0.f;
    if (p.num_splits == 1) {
      __nv_bfloat16* dst = a.out + row * D + 2 * t4;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<__nv_bfloat162*>(dst + j * 8) = __floats2bfloat162_rn(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
    } else {
      const long long prow_idx = split * num_rows + row;
      if (t4 == 0) p.part_lse[prow_idx] = l[h] > 0.f ? m[h] + log2f(l[h]) : -INFINITY;
      if (l[h] > 0.f) {  // the merge skips empty splits without reading their output
        float* dst = p.part_o + prow_idx * D + 2 * t4;
#pragma unroll
        for (int j = 0; j < D / 8; ++j)
          *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * h] * inv, o[j][2 * h + 1] * inv);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// FP8 decode, streamed: one CTA runs `items` consecutive work items (sequence, KV head, split),
// its cp.async pipeline running on across them (the next item's Q rows and first tiles load while
// the current one finishes). Decode batches only (one query token per sequence: an item is a
// sequence, so no tile slots and no spare CTAs) with a GQA group of at most kStreamRows heads; the
// math per tile is the narrow kernel's (fp8_narrow_tile). Against paged_attention_kernel's narrow
// FP8 variant it saves the spare CTAs (a fifth of the grid at group 4) and the Q tile's in-place
// conversion pass (Q is staged with the item's first tile and converted into registers). More
// than one item per CTA measured slower at every shape tried, so the planner asks for one
// (docs/kernels.md, "Decode: the streamed FP8 kernel"); the tests run 1 and 3.
//
// Balanced (kBalanced, AttentionPlan::stream_ctas): a fixed grid of G CTAs (one resident wave)
// shares the batch's KV tiles out evenly, stream-K style. The units (sequence, KV head), sequence
// major, each ceil(kv_len / 64) tiles plus a fixed cost long (next_segment), are laid end to end: T
// positions; CTA c runs positions [c L, (c + 1) L) with L = max(ceil(T / G), kMinBalancedTiles +
// the fixed cost), as segments of one unit each. A
// unit inside one CTA is written out directly; a unit cut by CTA boundaries leaves one partial per
// segment, in workspace slot unit + c (unique: along the tiles both numbers only grow), so a
// unit's partials are consecutive slots, and the CTA that arrives last merges them. Every CTA then
// ends together: no tail of a last partial wave, and lengths that differ between sequences or
// heads (ragged per-head pages) are shared out by tiles rather than by splits.
constexpr int kMinBalancedTiles = 2;  // a CTA's share is at least this many tiles (bounds the segments)
constexpr int kBalancedMaxChunk = 512;  // balanced_decode_pays: split plans of chunks up to this
constexpr int kStreamRows = 8;  // query heads per KV head (group) this kernel serves
constexpr int kStreamQBufs = 3; // Q rows of the items in flight: at most 3 (issue_next_tile)
// KV tiles of codes in shared memory (kStreamStages - 1 in flight), and the resident CTAs a
// multiprocessor must fit (a register cap). ncu at the max-load step (Llama-3.1-8B, batch 472 x
// 1088): 3 CTAs an SM (163 registers and 67 KB each), 12 warps, DRAM at 65% of its peak, so more
// CTAs looked like the lever; measured (decode step, batch 472 / 256 / 64): 3 stages, 3 CTAs 23.75 /
// 14.00 / 7.55 ms; 2 and 4 (128 registers) 25.46 / 14.31 / 7.72; 2 and 3 23.78 / 13.96 / 7.49; 4
// and 2 26.62 / 15.14 / 7.71. The register cap costs more than the fourth CTA gains.
// ORIGAMI_STREAM_STAGES / ORIGAMI_STREAM_MIN_BLOCKS override both for variant builds of the bench
// (bench/attention_profile.sh): the balance measured on the H100 need not hold on another GPU.
#ifndef ORIGAMI_STREAM_STAGES
#define ORIGAMI_STREAM_STAGES 3
#endif
#ifndef ORIGAMI_STREAM_MIN_BLOCKS
#define ORIGAMI_STREAM_MIN_BLOCKS 3
#endif
constexpr int kStreamStages = ORIGAMI_STREAM_STAGES;
constexpr int kStreamMinBlocks = ORIGAMI_STREAM_MIN_BLOCKS;

template <int D>
struct StreamGeom {
  using N = TileGeom<D, true, true>;
  static constexpr int kCodeStride = N::kCodeStride;
  static constexpr int kCodeTileBytes = N::kCodeTileBytes;
  static constexpr int kStageBytes = N::kStageBytes;
  static constexpr int kStages = kStreamStages;
  static constexpr int kQBytes = kStreamRows * D * static_cast<int>(sizeof(__nv_bfloat16));
  static constexpr int kQOffset = kStages * kStageBytes;
  static constexpr int kMergeOffset = kQOffset + kStreamQBufs * kQBytes;
  // The running merge sum [kStreamRows][D] and every warp's (max, sum) per row.
  static constexpr int kMergeBytes = (kStreamRows * D + kWarps * kStreamRows * 2) * static_cast<int>(sizeof(float));
  static constexpr int kSmemBytes = kMergeOffset + kMergeBytes;
};

// One work item's range and where its entries live.
struct StreamItem {
  int seq = 0, kv_head = 0, split = 0;
  int active_splits = 1;  // splits of its (sequence, KV head) that start before kv_len
  int kv_begin = 0, kv_end = 0, num_tiles = 0;  // entries [kv_begin, kv_end) of this split
  const int32_t* pages = nullptr;
  unsigned head_row = 0;  // D-code rows from a page's start to this head's first entry
  // Balanced: the unit (seq * num_kv_heads + kv_head), whether this segment is all of it (written
  // out directly), its own partial slot, and the unit's first slot and segment count.
  int unit = 0;
  bool whole = true;
  int slot = 0, first_slot = 0, num_segments = 1;
};

// A unit's table (ragged: its head's group), entries and the D-code row of its head in a page.
struct UnitSource {
  int table = 0, kv_len = 0;
  long long head_off = 0;
};

__device__ __forceinline__ UnitSource unit_source(const AttentionArgs& a, int seq, int kv_head) {
  UnitSource u;
  if (a.ragged.num_tables > 0) {
    u.table = a.ragged.head_table[kv_head];
    u.head_off = a.ragged.head_slot[kv_head];
  } else {
    u.head_off = kv_head;
  }
  u.kv_len = a.kv_len[u.table * a.shape.num_seqs + seq];
  return u;
}

__device__ __forceinline__ int tiles_of(int kv_len) { return kv_len > 0 ? (kv_len + kTileKV - 1) / kTileKV : 0; }

// The share-out runs over a cost order rather than bare tiles: each unit (sequence, KV head) with
// entries costs `unit_cost` (AttentionPlan::stream_unit_cost) plus its tiles, the unit's fixed work
// (its Q rows, page lookups, the warps' merge and its store) counted as tiles before its first
// one. Without it a CTA whose share holds many one-tile units (a graph bucket's padding rows,
// short sequences) runs far longer than its neighbours.
__device__ __forceinline__ int unit_cost_of(int tiles, int unit_cost) { return tiles > 0 ? tiles + unit_cost : 0; }

// Where a balanced CTA stands: the unit its next segment comes from, that unit's first position in
// the cost order, and the CTA's next position and end (positions: cost units).
struct SegmentCursor {
  int unit = 0, unit_start = 0, pos = 0, end = 0;
};

// The next segment of a balanced CTA's range (false when the range is done): the tiles of the
// current unit whose positions lie in [pos, end), skipping units whose tiles lie outside it (the
// range may end inside a unit's fixed cost). `share`: L; `unit_cost` as above.
__device__ __forceinline__ bool next_segment(const AttentionArgs& a, SegmentCursor& c, int share, int unit_cost,
                                             StreamItem& s) {
  const int num_kv_heads = a.shape.num_kv_heads;
  const int num_units = a.shape.num_seqs * num_kv_heads;
  while (c.pos < c.end && c.unit < num_units) {
    const int seq = c.unit / num_kv_heads, kv_head = c.unit - seq * num_kv_heads;
    const UnitSource u = unit_source(a, seq, kv_head);
    const int tiles = tiles_of(u.kv_len);
    const int first_tile_pos = c.unit_start + unit_cost;  // position of tile 0 (if the unit has tiles)
    const int lo = max(c.pos, first_tile_pos), hi = min(c.end, first_tile_pos + tiles);
    const int unit_end = c.unit_start + unit_cost_of(tiles, unit_cost);
    // Step past this unit when the range goes beyond it; else the range ends inside it.
    if (unit_end <= c.end) {
      ++c.unit;
      c.unit_start = unit_end;
      c.pos = unit_end;
    } else {
      c.pos = c.end;
    }
    if (tiles == 0 || lo >= hi) continue;  // no entries, or none of its tiles in this range
    s.seq = seq;
    s.kv_head = kv_head;
    s.split = 0;
    s.kv_begin = (lo - first_tile_pos) * kTileKV;
    s.kv_end = min(u.kv_len, (hi - first_tile_pos) * kTileKV);
    s.num_tiles = hi - lo;
    s.pages = a.page_indices + a.page_indptr[u.table * a.shape.num_seqs + seq];
    s.head_row = static_cast<unsigned>(u.head_off * a.shape.block_size);
    s.unit = seq * num_kv_heads + kv_head;
    s.whole = s.num_tiles == tiles;
    // The CTAs holding the unit's tiles: those whose ranges meet [first_tile_pos, + tiles).
    const int first_cta = first_tile_pos / share, last_cta = (first_tile_pos + tiles - 1) / share;
    s.slot = s.unit + static_cast<int>(blockIdx.x);
    s.first_slot = s.unit + first_cta;
    s.num_segments = last_cta - first_cta + 1;
    return true;
  }
  return false;
}

// A balanced CTA's range: every thread sums the costs of a run of sequences, a block scan gives the
// total, L and each run's first position, and the run holding position c L finds its unit and that
// unit's first position. Returns false when the CTA's range is empty. All threads must call it (it
// synchronises the block).
__device__ __forceinline__ bool balanced_range(const AttentionArgs& a, int num_ctas, int unit_cost,
                                               SegmentCursor& cursor, int& share) {
  __shared__ int warp_sums[kWarps];
  __shared__ int found[2];
  const int num_seqs = a.shape.num_seqs, num_kv_heads = a.shape.num_kv_heads;
  const bool ragged = a.ragged.num_tables > 0;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per_thread = (num_seqs + kThreads - 1) / kThreads;
  const int s_lo = min(num_seqs, tid * per_thread), s_hi = min(num_seqs, s_lo + per_thread);
  auto head_cost = [&](int seq, int h) { return unit_cost_of(tiles_of(unit_source(a, seq, h).kv_len), unit_cost); };
  auto seq_cost = [&](int seq) {
    if (!ragged) return num_kv_heads * unit_cost_of(tiles_of(a.kv_len[seq]), unit_cost);
    int t = 0;
    for (int h = 0; h < num_kv_heads; ++h) t += head_cost(seq, h);
    return t;
  };
  int mine = 0;
  for (int seq = s_lo; seq < s_hi; ++seq) mine += seq_cost(seq);
  // Block-wide exclusive scan of `mine` (threads in order = runs of sequences in order).
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_sums[warp] = incl;
  if (tid == 0) found[0] = found[1] = 0;
  __syncthreads();
  int before = 0, total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    before += w < warp ? warp_sums[w] : 0;
    total += warp_sums[w];
  }
  const int excl = before + incl - mine;
  share = max((total + num_ctas - 1) / num_ctas, kMinBalancedTiles + unit_cost);
  const long long begin = static_cast<long long>(blockIdx.x) * share;
  if (begin >= total) return false;  // the same for every thread
  if (begin >= excl && begin < excl + mine) {
    int acc = excl;
    for (int seq = s_lo; seq < s_hi; ++seq) {
      const int sc = seq_cost(seq);
      if (begin < acc + sc) {
        int h = 0;
        if (!ragged) {
          h = (static_cast<int>(begin) - acc) / (sc / num_kv_heads);
          acc += h * (sc / num_kv_heads);
        } else {
          for (;; ++h) {
            const int hc = head_cost(seq, h);
            if (begin < acc + hc) break;
            acc += hc;
          }
        }
        found[0] = seq * num_kv_heads + h;
        found[1] = acc;
        break;
      }
      acc += sc;
    }
  }
  __syncthreads();
  cursor.unit = found[0];
  cursor.unit_start = found[1];
  cursor.pos = static_cast<int>(begin);
  cursor.end = static_cast<int>(min(begin + share, static_cast<long long>(total)));
  return true;
}

template <int D>
__device__ __forceinline__ StreamItem resolve_stream_item(const KernelParams& p, int item) {
  const AttentionArgs& a = p.a;
  const RaggedHeads& rg = a.ragged;
  const int num_seqs = a.shape.num_seqs;
  StreamItem s;
  s.seq = item % num_seqs;
  const int y = item / num_seqs;
  int num_splits = p.num_splits, table = 0;
  long long head_off;
  if (rg.num_tables > 0) {
    int h = 0;
    for (int k = 1; k < a.shape.num_kv_heads; ++k)
      if (rg.head_split0[k] <= y) h = k;
    s.kv_head = h;
    s.split = y - rg.head_split0[h];
    num_splits = rg.head_splits[h];
    table = rg.head_table[h];
    head_off = rg.head_slot[h];
  } else {
    s.kv_head = y % a.shape.num_kv_heads;
    s.split = y / a.shape.num_kv_heads;
    head_off = s.kv_head;
  }
  const int kv_len = a.kv_len[table * num_seqs + s.seq];
  // The split's share as in paged_attention_kernel (one query row: no causal cut inside it).
  const int chunk = split_chunk(rg.num_tables > 0 ? INT_MAX : p.kv_chunk, kv_len, num_splits);
  s.kv_begin = s.split * chunk;
  s.active_splits = splits_started(kv_len, chunk, num_splits);
  s.kv_end = (s.split == num_splits - 1) ? kv_len : min(kv_len, s.kv_begin + chunk);
  s.num_tiles = s.kv_end > s.kv_begin ? (s.kv_end - s.kv_begin + kTileKV - 1) / kTileKV : 0;
  s.pages = a.page_indices + a.page_indptr[table * num_seqs + s.seq];
  s.head_row = static_cast<unsigned>(head_off * a.shape.block_size);
  return s;
}

template <int D, bool kBalanced>
__global__ void __launch_bounds__(kThreads, kStreamMinBlocks) paged_decode_fp8_stream_kernel(const KernelParams p, int items_per_cta,
                                                                            int num_items) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  // Balanced: this CTA's tiles (num_items is the grid's CTA count); none, nothing to do.
  SegmentCursor range;
  int share = 0;
  if constexpr (kBalanced) {
    if (!balanced_range(p.a, num_items, p.unit_cost, range, share)) return;
  }
  using G = StreamGeom<D>;
  const AttentionArgs& a = p.a;
  const int group = p.group;
  const int num_heads = a.shape.num_heads;
  const int block_size = a.shape.block_size;
  // Entries are addressed by their row of D codes in the pool (row * D: the codes' offset; row:
  // the scale's index), a page being page_rows rows. 32 bits hold it: 2^32 rows are at least
  // 256 GiB of K codes (D >= 64), more than any one GPU's memory. (64-bit element offsets took
  // ~45 instructions a row a thread, a fifth of the kernel's issue slots at max load.)
  const unsigned page_rows = static_cast<unsigned>(
      (a.ragged.num_tables > 0 ? a.ragged.page_stride : static_cast<long long>(a.shape.num_kv_heads) * block_size * D) / D);
  // Scales four entries at a time (one 16-byte copy of four consecutive rows' scales) where four
  // entries never straddle a page and every such run starts 16-byte aligned: pages of a multiple
  // of 4 entries, rows of a page and of each head's slot counts multiples of 4, aligned bases.
  // Otherwise one 4-byte copy per entry, as the codes' rows are copied.
  const bool scale_runs = block_size % 4 == 0 && page_rows % 4 == 0 &&
                          ((reinterpret_cast<uintptr_t>(a.k_scales) | reinterpret_cast<uintptr_t>(a.v_scales)) & 15) == 0;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto stage_codes = [&](int st) { return smem_raw + st * G::kStageBytes; };
  auto stage_scales = [&](int st) { return reinterpret_cast<float*>(stage_codes(st) + 2 * G::kCodeTileBytes); };
  auto q_buf = [&](int b) { return reinterpret_cast<__nv_bfloat16*>(smem_raw + G::kQOffset + b * G::kQBytes); };
  float* merge_acc = reinterpret_cast<float*>(smem_raw + G::kMergeOffset);  // [row][D]
  float* merge_ml = merge_acc + kStreamRows * D;                             // [warp][row][2]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int item_begin = blockIdx.x * items_per_cta;
  const int item_end = min(num_items, item_begin + items_per_cta);

  // The load cursor: item, its next tile, the stage and Q buffer it fills next. It runs
  // kStages - 1 tiles ahead of the compute loop, across items; items without entries are
  // skipped (they need no Q and no tiles).
  int l_item = item_begin, l_tile = 0, l_stage = 0, l_qbuf = 0;
  StreamItem li;
  SegmentCursor l_range = range;
  bool l_live;
  if constexpr (kBalanced) {
    l_live = next_segment(a, l_range, share, p.unit_cost, li);
  } else {
    l_live = l_item < item_end;
    if (l_live) li = resolve_stream_item<D>(p, l_item);
  }
  // This thread's 16-byte column of every row of K and V codes it copies: a row's address is then
  // one wide multiply-add (row * D + column base) rather than a multiply and two 64-bit adds.
  const unsigned char* k_col = a.k_codes + (tid % (D / 16)) * 16;
  const unsigned char* v_col = a.v_codes + (tid % (D / 16)) * 16;
  // Entry e of the item being loaded: its row of D codes in the pool.
  auto entry_row = [&](int e) {
    const int page = p.page_divider.divide(e);
    const int in_page = e - page * block_size;
    return static_cast<unsigned>(li.pages[page]) * page_rows + li.head_row + static_cast<unsigned>(in_page);
  };
  auto issue_next_tile = [&]() {
    while (l_live && l_tile >= li.num_tiles) {
      l_tile = 0;
      if constexpr (kBalanced) {
        l_live = next_segment(a, l_range, share, p.unit_cost, li);
      } else {
        ++l_item;
        l_live = l_item < item_end;
        if (l_live) li = resolve_stream_item<D>(p, l_item);
      }
    }
    if (l_live) {
      if (l_tile == 0) {
        // The item's query rows (head kv_head * group + r of token seq), 16 bytes a thread.
        constexpr int kPieces = D / 8;
        if (tid < group * kPieces) {
          const int r = tid / kPieces, col = (tid % kPieces) * 8;
          cp_async_16(q_buf(l_qbuf) + r * D + col,
                      a.q + (static_cast<long long>(li.seq) * num_heads + li.kv_head * group + r) * D + col, true);
        }
        l_qbuf = l_qbuf == kStreamQBufs - 1 ? 0 : l_qbuf + 1;
      }
      constexpr int kPieces = D / 16;
      unsigned char* codes = stage_codes(l_stage);
      float* scales = stage_scales(l_stage);
      const int col = (tid % kPieces) * 16;
      const int base = li.kv_begin + l_tile * kTileKV;
      // A fixed count of rows a thread (no remainder loop), and rows past the item's end look up
      // its last entry (copied as zeros): no branch on the way to the copies, so the lookups of
      // all the thread's rows are issued before the first copy waits on one.
      // The per-row scale copies are a version of the loop of their own (a uniform branch), so
      // the usual case, scales in runs of four, issues none of their predicated instructions.
      constexpr int kRowsPerPass = kThreads / kPieces;
      auto copy_rows = [&](auto with_row_scales) {
#pragma unroll
        for (int i = 0; i < kTileKV / kRowsPerPass; ++i) {
          const int r = tid / kPieces + i * kRowsPerPass;
          const int e = base + r;
          const bool valid = e < li.kv_end;
          const unsigned row = entry_row(valid ? e : li.kv_end - 1);
          cp_async_16(codes + r * G::kCodeStride + col, k_col + static_cast<size_t>(row) * D, valid);
          cp_async_16(codes + G::kCodeTileBytes + r * G::kCodeStride + col, v_col + static_cast<size_t>(row) * D, valid);
          if constexpr (decltype(with_row_scales)::value) {
            if (col == 0) {
              cp_async_4(scales + r, a.k_scales + row, valid);
              cp_async_4(scales + kTileKV + r, a.v_scales + row, valid);
            }
          }
        }
      };
      if (scale_runs)
        copy_rows(std::false_type{});
      else
        copy_rows(std::true_type{});
      if (scale_runs && tid < 2 * (kTileKV / 4)) {
        // Thread i copies the scales of entries 4 (i % 16) .. + 3, of K (i < 16) or V; past
        // kv_end the copy reads fewer bytes and zero-fills the rest.
        const int r = 4 * (tid % (kTileKV / 4));
        const int e = base + r;
        const int live = min(4, max(0, li.kv_end - e));
        // With nothing to copy the address must still be 16-byte aligned: the item's first entry
        // starts a run of four (as every e here does), its last need not.
        const unsigned row = entry_row(live > 0 ? e : li.kv_begin);
        const bool is_v = tid >= kTileKV / 4;
        cp_async_16_bytes(scales + (is_v ? kTileKV : 0) + r, (is_v ? a.v_scales : a.k_scales) + row, 4 * live);
      }
      l_stage = l_stage == G::kStages - 1 ? 0 : l_stage + 1;
      ++l_tile;
    }
    cp_async_commit();
  };
#pragma unroll
  for (int st = 0; st < G::kStages - 1; ++st) issue_next_tile();

  constexpr int kWarpKV = kTileKV / kWarps;  // entries of each tile this warp owns
  const int warp_kv0 = warp * kWarpKV;
  int c_stage = 0, c_qbuf = 0;
  SegmentCursor c_range = range;
  for (int item = item_begin;; ++item) {
    StreamItem ci;
    if constexpr (kBalanced) {
      if (!next_segment(a, c_range, share, p.unit_cost, ci)) break;
    } else {
      if (item >= item_end) break;
      ci = resolve_stream_item<D>(p, item);
      // A split past kv_len under the fused merge: nothing to store or count (paged_attention_kernel).
      // It has no tiles, so the load cursor skipped it too.
      if (p.split_counters != nullptr && ci.split >= ci.active_splits) continue;
    }
    float o[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};
    uint32_t qf[D / 16][4];
    for (int t = 0; t < ci.num_tiles; ++t) {
      issue_next_tile();
      cp_async_wait<G::kStages - 1>();
      __syncthreads();
      if (t == 0) {
        // A fragments of every k-step in the permuted head order (paged_attention_kernel), in
        // f16 (exact for |q| in [2^-14, 65504], saturated beyond); rows >= group and the
        // fragments' rows 8..15 are zero.
        const __nv_bfloat16* qs = q_buf(c_qbuf) + g * D + 4 * t4;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
          uint2 r = g < group ? *reinterpret_cast<const uint2*>(qs + kk * 16) : make_uint2(0u, 0u);
          constexpr float kF16Max = 65504.f;
          const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.x));
          const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r.y));
          qf[kk][0] = pack_f16x2(fminf(fmaxf(f0.x, -kF16Max), kF16Max), fminf(fmaxf(f0.y, -kF16Max), kF16Max));
          qf[kk][2] = pack_f16x2(fminf(fmaxf(f1.x, -kF16Max), kF16Max), fminf(fmaxf(f1.y, -kF16Max), kF16Max));
          qf[kk][1] = qf[kk][3] = 0u;
        }
        c_qbuf = c_qbuf == kStreamQBufs - 1 ? 0 : c_qbuf + 1;
      }
      const unsigned char* k_codes = stage_codes(c_stage);
      const float* k_scale = stage_scales(c_stage);
      const float* v_scale = k_scale + kTileKV;
      c_stage = c_stage == G::kStages - 1 ? 0 : c_stage + 1;
      const int row_limit[2] = {ci.kv_end, ci.kv_end};
      fp8_narrow_tile<D, G::kCodeStride, false>(p, qf, k_codes, k_scale, v_scale, warp_kv0, ci.kv_begin + t * kTileKV + warp_kv0,
                                         row_limit, o, m, l);
      __syncthreads();  // the next iteration refills the stage just read
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
      l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    // Merge the four warps' partial softmaxes of the item's rows (g < group; the fragments'
    // rows 8..15 are empty) in paged_attention_kernel's order: m = max_w m_w, then for w = 0..3
    // the running sum += o_w 2^(m_w - m) and l += l_w 2^(m_w - m), skipping empty warps; warp w
    // adds its share to the running sum in shared memory after warp w - 1, and warp 3 stores.
    __syncthreads();  // the last item's merge is done with merge_acc / merge_ml
    const bool row_ok = g < group;
    if (row_ok && t4 == 0) {
      merge_ml[(warp * kStreamRows + g) * 2] = m[0];
      merge_ml[(warp * kStreamRows + g) * 2 + 1] = l[0];
    }
    __syncthreads();
    float mx = -INFINITY;
    if (row_ok) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, merge_ml[(w * kStreamRows + g) * 2]);
    }
    const bool contributes = mx != -INFINITY && l[0] > 0.f;
    const float f = contributes ? exp2f(m[0] - mx) : 0.f;
    auto dim_of = [&](int j, int i) { return 32 * (j / 4) + 4 * (2 * t4 + (i & 1)) + j % 4; };
    for (int w = 0; w < kWarps; ++w) {
      if (warp == w && row_ok) {
        float* acc_row = merge_acc + g * D;
        if (w < kWarps - 1) {
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              float acc = w == 0 ? 0.f : acc_row[dim_of(j, i)];
              if (contributes) acc = fmaf(o[j][i] * kNarrowOScale, f, acc);  // paged_attention_kernel's fma
              acc_row[dim_of(j, i)] = acc;
            }
        } else {
          float wsum = 0.f;
          if (mx != -INFINITY) {
#pragma unroll
            for (int v = 0; v < kWarps; ++v) {
              const float lw = merge_ml[(v * kStreamRows + g) * 2 + 1];
              if (lw <= 0.f) continue;
              wsum += lw * exp2f(merge_ml[(v * kStreamRows + g) * 2] - mx);
            }
          }
          const long long row = static_cast<long long>(ci.seq) * num_heads + ci.kv_head * group + g;
#pragma unroll
          for (int j = 0; j < D / 8; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              float acc = acc_row[dim_of(j, i)];
              if (contributes) acc = fmaf(o[j][i] * kNarrowOScale, f, acc);  // paged_attention_kernel's fma
              if constexpr (kBalanced) {
                if (ci.whole) store_out_element<D>(p, row, dim_of(j, i), wsum, acc);
                else store_partial_element<D>(p, static_cast<long long>(ci.slot) * group + g, dim_of(j, i), mx, wsum, acc);
              } else {
                store_row_element<D>(p, row, ci.split, dim_of(j, i), mx, wsum, acc);
              }
            }
        }
      }
      if (w < kWarps - 1) __syncthreads();
    }
    if constexpr (kBalanced) {
      // A cut unit: the last of its segments to arrive merges its slots (consecutive, first_slot on).
      if (!ci.whole && arrive_last_of_unit(p.split_counters + ci.unit, ci.num_segments)) {
        const long long first = static_cast<long long>(ci.first_slot) * group;
        const long long row0 = static_cast<long long>(ci.seq) * num_heads + ci.kv_head * group;
        for (int r = warp; r < group; r += kWarps)
          merge_split_row<D>(p.part_o + first * D, p.part_lse + first, group, ci.num_segments, r, a.out + row0 * D);
      }
    } else if (p.num_splits > 1 && p.split_counters != nullptr) {
      if (arrive_last_of_unit(p.split_counters + static_cast<long long>(ci.seq) * a.shape.num_kv_heads + ci.kv_head,
                              ci.active_splits)) {
        merge_unit_rows<D>(p, group, ci.active_splits, [&](int r) {
          return static_cast<long long>(ci.seq) * num_heads + ci.kv_head * group + r;
        });
      }
    }
  }
  cp_async_wait<0>();
}

// One warp per (token, head) row: out = sum_s w_s o_s / sum_s w_s with w_s = 2^(lse_s - max lse).
// head_splits (ragged paging): the splits of each KV head, which its query heads (num_heads per
// token, `group` per KV head) merge; null: num_splits for every row.
template <int D>
__global__ void __launch_bounds__(256) merge_splits_kernel(const float* part_o, const float* part_lse, int num_splits,
                                                           long long num_rows, __nv_bfloat16* out,
                                                           const int32_t* head_splits, int num_heads, int group) {
  wait_for_previous_grid();  // programmatic_launch.h: before any memory of the step
  allow_next_grid();
  const long long row = static_cast<long long>(blockIdx.x) * 8 + (threadIdx.x >> 5);
  if (row >= num_rows) return;
  if (head_splits != nullptr) num_splits = head_splits[static_cast<int>(row % num_heads) / group];
  merge_split_row<D>(part_o, part_lse, num_rows, num_splits, row, out);
}

int num_tile_slots(const AttentionShape& s, int query_rows) {
  const int group = s.num_heads / s.num_kv_heads;
  return static_cast<int>((static_cast<long long>(s.num_tokens) * group) / query_rows) + s.num_seqs;
}

bool shape_ok(const AttentionShape& s) {
  return s.num_seqs > 0 && s.num_tokens >= s.num_seqs && s.num_kv_heads > 0 && s.num_heads > 0 &&
         s.num_heads % s.num_kv_heads == 0 && s.block_size > 0 && paged_attention_supported(s.head_dim);
}

// The kernel's dynamic shared memory exceeds the 48 KiB default: raise the limit once per device.
template <int D, bool kFp8, bool kNarrow>
cudaError_t ensure_smem_limit() {
  static DynamicSmemLimit limit;
  return limit.ensure(paged_attention_kernel<D, kFp8, kNarrow>, TileGeom<D, kFp8, kNarrow>::kSmemBytes);
}

// The parameters every attention launch passes: the arguments, the plan's splits and the split
// partials' place in the workspace.
template <int D>
KernelParams kernel_params(const AttentionArgs& args, const AttentionPlan& plan, void* workspace) {
  const AttentionShape& s = args.shape;
  KernelParams p;
  p.a = args;
  p.group = s.num_heads / s.num_kv_heads;
  p.num_splits = plan.num_splits;
  p.kv_chunk = plan.kv_chunk_size;
  p.scale_log2 = args.softmax_scale * kLog2e;
  const long long num_rows = static_cast<long long>(s.num_tokens) * s.num_heads;
  p.part_o = static_cast<float*>(workspace);
  p.part_lse = p.part_o ? p.part_o + plan.num_splits * num_rows * D : nullptr;
  p.split_counters = nullptr;  // the decode launches set it (fused merge)
  p.unit_cost = plan.stream_unit_cost;
  p.page_divider = InvariantDivider::make(s.block_size);
  return p;
}

// The arrival counters a decode launch merges its splits with (fused merge), or null: the merge
// kernel merges them (fewer than kFusedMergeMinSplits splits, or no counters given).
int* fused_merge_counters(const AttentionArgs& args, const AttentionPlan& plan) {
  return plan.num_splits >= kFusedMergeMinSplits ? args.split_counters : nullptr;
}

// After an attention launch: its error, or with several splits the merge of their partials.
template <int D>
cudaError_t merge_after(const KernelParams& p, const AttentionArgs& args, const AttentionPlan& plan,
                        cudaStream_t stream) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || plan.num_splits == 1 || p.split_counters != nullptr) return err;  // merged in the kernel
  const AttentionShape& s = args.shape;
  const long long num_rows = static_cast<long long>(s.num_tokens) * s.num_heads;
  const unsigned merge_blocks = static_cast<unsigned>((num_rows + 7) / 8);
  return launch_programmatic(merge_splits_kernel<D>, merge_blocks, 256, 0, stream, p.part_o, p.part_lse,
                             plan.num_splits, num_rows, args.out,
                             args.ragged.num_tables > 0 ? args.ragged.head_splits : nullptr, s.num_heads, p.group);
}

// The streamed kernel's shared-memory limit, raised once per device (per variant).
template <int D, bool kBalanced>
cudaError_t ensure_stream_smem_limit() {
  static DynamicSmemLimit limit;
  return limit.ensure(paged_decode_fp8_stream_kernel<D, kBalanced>, StreamGeom<D>::kSmemBytes);
}

template <int D>
cudaError_t launch_fp8_stream(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                              cudaStream_t stream) {
  if (cudaError_t err = ensure_stream_smem_limit<D, false>(); err != cudaSuccess) return err;
  const AttentionShape& s = args.shape;
  KernelParams p = kernel_params<D>(args, plan, workspace);
  p.split_counters = fused_merge_counters(args, plan);
  const bool ragged = args.ragged.num_tables > 0;
  const long long items =
      static_cast<long long>(s.num_seqs) * (ragged ? args.ragged.num_work : s.num_kv_heads * plan.num_splits);
  const int per_cta = plan.items_per_cta;
  const long long ctas = (items + per_cta - 1) / per_cta;
  if (items > INT_MAX || ctas > INT_MAX) return cudaErrorInvalidValue;
  const cudaError_t err = launch_programmatic(paged_decode_fp8_stream_kernel<D, false>, static_cast<unsigned>(ctas), kThreads,
                                              StreamGeom<D>::kSmemBytes, stream, p, per_cta, static_cast<int>(items));
  if (err != cudaSuccess) return err;
  return merge_after<D>(p, args, plan, stream);
}

// Partial rows a balanced launch may write: one a query head of every unit, plus one a query
// head per CTA (slot unit + c < units + CTAs).
long long balanced_partial_rows(const AttentionPlan& plan, const AttentionShape& s) {
  const long long group = s.num_heads / s.num_kv_heads;
  return (static_cast<long long>(s.num_seqs) * s.num_kv_heads + plan.stream_ctas) * group;
}

// The balanced FP8 decode kernel: plan.stream_ctas CTAs; it merges cut units itself (split
// counters required), so no merge pass follows.
template <int D>
cudaError_t launch_fp8_balanced(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                                cudaStream_t stream) {
  if (cudaError_t err = ensure_stream_smem_limit<D, true>(); err != cudaSuccess) return err;
  KernelParams p = kernel_params<D>(args, plan, nullptr);
  p.part_o = static_cast<float*>(workspace);
  p.part_lse = p.part_o + balanced_partial_rows(plan, args.shape) * D;
  p.split_counters = args.split_counters;
  return launch_programmatic(paged_decode_fp8_stream_kernel<D, true>, static_cast<unsigned>(plan.stream_ctas), kThreads,
                             StreamGeom<D>::kSmemBytes, stream, p, 0, plan.stream_ctas);
}

// Resident CTAs per SM of `kernel` (kThreads threads, `smem` bytes of dynamic shared memory, its
// limit raised by `raise_limit` first), queried once into `cache`; `fallback` where the query fails.
template <typename Kernel>
int resident_ctas_once(std::atomic<int>& cache, cudaError_t (*raise_limit)(), Kernel kernel, int smem, int fallback) {
  if (const int v = cache.load(std::memory_order_acquire); v > 0) return v;
  int n = 0;
  if (raise_limit() != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem) != cudaSuccess || n < 1) {
    cudaGetLastError();
    return fallback;
  }
  cache.store(n, std::memory_order_release);
  return n;
}

// Resident CTAs per SM of the balanced kernel (its grid is one wave of them), once per head_dim;
// where the query fails, what its launch bounds ask for.
template <int D>
int balanced_ctas_per_sm() {
  static std::atomic<int> cached{0};
  return resident_ctas_once(cached, ensure_stream_smem_limit<D, true>, paged_decode_fp8_stream_kernel<D, true>,
                            StreamGeom<D>::kSmemBytes, kStreamMinBlocks);
}

template <int D, bool kFp8, bool kNarrow>
cudaError_t launch(const AttentionArgs& args, const AttentionPlan& plan, void* workspace, cudaStream_t stream) {
  if (cudaError_t attr_status = ensure_smem_limit<D, kFp8, kNarrow>(); attr_status != cudaSuccess) return attr_status;
  const AttentionShape& s = args.shape;
  KernelParams p = kernel_params<D>(args, plan, workspace);
  // The wide kernel keeps the merge pass.
  if constexpr (kNarrow) p.split_counters = fused_merge_counters(args, plan);
  const bool ragged = args.ragged.num_tables > 0;
  const dim3 grid(plan.num_tile_slots, ragged ? args.ragged.num_work : s.num_kv_heads, ragged ? 1 : plan.num_splits);
  const cudaError_t err = launch_programmatic(paged_attention_kernel<D, kFp8, kNarrow>, grid, kThreads,
                                              TileGeom<D, kFp8, kNarrow>::kSmemBytes, stream, p);
  if (err != cudaSuccess) return err;
  return merge_after<D>(p, args, plan, stream);
}

}  // namespace

bool paged_attention_supported(int head_dim) { return head_dim == 64 || head_dim == 128; }

AttentionPlan plan_paged_attention(const AttentionShape& shape, int max_kv_len, int num_sms) {
  AttentionPlan plan;
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0) return plan;
  const int group = shape.num_heads / shape.num_kv_heads;
  // Decode batches (one new token a sequence) whose GQA group fits 16 rows take the narrow
  // kernel: all four warps on each KV tile instead of one.
  plan.query_rows = shape.num_tokens == shape.num_seqs && group <= kNarrowRows ? kNarrowRows : kTileRows;
  plan.num_tile_slots = num_tile_slots(shape, plan.query_rows);
  max_kv_len = std::max(max_kv_len, 1);
  const long long real_tiles = std::max<long long>(
      shape.num_seqs, (static_cast<long long>(shape.num_tokens) * group + plan.query_rows - 1) / plan.query_rows);
  const long long units = real_tiles * shape.num_kv_heads;
  const long long target = 4LL * std::max(num_sms, 1);
  long long splits = 1;
  if (units < target) splits = (target + units - 1) / units;
  splits = std::min<long long>(splits, (max_kv_len + kMinChunk - 1) / kMinChunk);
  plan = with_kv_splits(plan, max_kv_len, static_cast<int>(std::max<long long>(splits, 1)));
  // FP8 decode (the launch ignores this for bf16): the streamed kernel, one item per CTA. More
  // lost at every measured shape (H100, batch 64-1024 x context 640-4096, page 16 and 256: 2
  // items 0-6% slower than 1 at batch 1024 and up to 25% at batch 64, 4 and 8 slower still): the
  // hardware already overlaps one CTA's pipeline fill with its neighbours' streaming, while
  // longer CTAs leave a longer tail and each item change stalls the loads on its page lookups.
  if (plan.query_rows == kNarrowRows && shape.num_tokens == shape.num_seqs && group <= kStreamRows) {
    plan.items_per_cta = 1;
    if (balanced_decode_pays(plan, shape, num_sms, false)) plan.stream_ctas = balanced_decode_ctas(shape.head_dim, num_sms);
  }
  return plan;
}

int balanced_decode_ctas(int head_dim, int num_sms) {
  if (!paged_attention_supported(head_dim)) return 0;
  return std::max(num_sms, 1) * (head_dim == 64 ? balanced_ctas_per_sm<64>() : balanced_ctas_per_sm<128>());
}

bool balanced_decode_pays(const AttentionPlan& split_plan, const AttentionShape& shape, int num_sms, bool per_head) {
  if (split_plan.items_per_cta != 1 || split_plan.num_splits < 2) return false;
  // Measured on the H100 (bench/attention_bench.cu --balanced 0,1 and ragged_attention_bench
  // --per-head, docs/kernels.md "Balanced decode attention"): the balanced kernel wins where the
  // split plan fills at least one resident wave with splits of at most kBalancedMaxChunk entries
  // (batch 8-64 at 1K, 2-4 at 4K: 1.08-1.25x), whose CTAs' fixed cost (Q, page lookups, partials,
  // merge) is a large share of their work; and on per-head tables whenever the plan splits (their
  // heads' lengths differ, the split count does not follow them: per-head 64 x 4K, spread lengths,
  // 75% -> 85% of the floor). Where every CTA has a long split or the batch fills several waves
  // with whole sequences (batch >= 96) it loses 2-5%: an item change inside a CTA stalls it on the
  // next unit's lookups, which the hardware's CTA switch hides; with less than a wave (batch 1-4 at
  // 1K) it loses to the plain splits' fewer, shorter launches.
  const long long units = static_cast<long long>(shape.num_seqs) * shape.num_kv_heads;
  if (units * split_plan.num_splits < balanced_decode_ctas(shape.head_dim, num_sms)) return false;
  return per_head || split_plan.kv_chunk_size <= kBalancedMaxChunk;
}

int balanced_step_ctas(const AttentionShape& shape, int max_kv_len, int num_sms, bool per_head) {
  return balanced_decode_pays(plan_paged_attention(shape, max_kv_len, num_sms), shape, num_sms, per_head)
             ? balanced_decode_ctas(shape.head_dim, num_sms)
             : 0;
}

namespace {

// Resident CTAs per SM of the attention kernel (shared memory bounds it), once per head_dim; where
// the query fails, what 87 KB (D 128) per CTA allows on an H100.
template <int D>
int resident_ctas_per_sm() {
  static std::atomic<int> cached{0};
  return resident_ctas_once(cached, ensure_smem_limit<D, false, false>, paged_attention_kernel<D, false, false>,
                            TileGeom<D, false, false>::kSmemBytes, 2);
}
int resident_ctas_per_sm(int head_dim) { return head_dim == 64 ? resident_ctas_per_sm<64>() : resident_ctas_per_sm<128>(); }

}  // namespace

AttentionPlan plan_ragged_attention(const AttentionShape& shape, int planning_len, int num_sms) {
  AttentionPlan plan = plan_paged_attention(shape, planning_len, num_sms);
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0 || !paged_attention_supported(shape.head_dim)) return plan;
  const int group = shape.num_heads / shape.num_kv_heads;
  const long long real_tiles = std::max<long long>(
      shape.num_seqs, (static_cast<long long>(shape.num_tokens) * group + plan.query_rows - 1) / plan.query_rows);
  const long long units = real_tiles * shape.num_kv_heads;
  const long long resident = static_cast<long long>(resident_ctas_per_sm(shape.head_dim)) * std::max(num_sms, 1);
  long long splits = resident / units;
  // Few splits per head in one wave lose to two waves of more splits (H100, Qwen3-8B shape, 36
  // layers: batch 16, 2 vs 5 splits, 14.8 vs 13.9 ms; batch 64, 1 vs 2, 56.1 vs 48.0 ms), and
  // there the hardware scheduler already evens the groups out: keep the one-group plan.
  if (splits < kMinOneWaveSplits) return plan;
  splits = std::min<long long>(splits, (std::max(planning_len, 1) + kMinChunk - 1) / kMinChunk);
  plan.num_splits = static_cast<int>(std::max<long long>(splits, 1));
  // The chunk is not used by ragged launches (each group shares out its own length).
  return plan;
}

AttentionPlan with_kv_splits(const AttentionPlan& plan, int max_kv_len, int splits) {
  AttentionPlan out = plan;
  max_kv_len = std::max(max_kv_len, 1);
  splits = std::max(splits, 1);
  int chunk = (max_kv_len + splits - 1) / splits;
  chunk = (chunk + kTileKV - 1) / kTileKV * kTileKV;
  out.num_splits = (max_kv_len + chunk - 1) / chunk;
  out.kv_chunk_size = chunk;
  return out;
}

AttentionPlan with_query_rows(const AttentionPlan& plan, const AttentionShape& shape, int query_rows) {
  AttentionPlan out = plan;
  out.query_rows = query_rows;
  if (shape.num_kv_heads > 0 && shape.num_heads > 0) out.num_tile_slots = num_tile_slots(shape, query_rows);
  return out;
}

AttentionPlan ragged_plan(const AttentionPlan& uniform, const RaggedHeads& ragged) {
  AttentionPlan plan = uniform;
  plan.num_splits = std::max(ragged.max_splits, 1);
  return plan;
}

long long split_counter_count(const AttentionShape& shape) {
  if (shape.num_kv_heads <= 0 || shape.num_heads <= 0) return 0;
  return static_cast<long long>(num_tile_slots(shape, kNarrowRows)) * shape.num_kv_heads;
}

size_t paged_attention_workspace_bytes(const AttentionPlan& plan, const AttentionShape& shape) {
  size_t bytes = 0;
  if (plan.num_splits > 1)
    bytes = static_cast<size_t>(plan.num_splits) * shape.num_tokens * shape.num_heads * (shape.head_dim + 1) * sizeof(float);
  if (plan.stream_ctas > 0 && shape.num_kv_heads > 0 && shape.num_heads > 0)
    bytes = std::max(bytes, static_cast<size_t>(balanced_partial_rows(plan, shape)) * (shape.head_dim + 1) * sizeof(float));
  return bytes;
}

cudaError_t paged_attention(const AttentionArgs& args, const AttentionPlan& plan, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream) {
  const AttentionShape& s = args.shape;
  if (!shape_ok(s) || plan.num_splits < 1 || plan.kv_chunk_size <= 0 || plan.items_per_cta < 0 ||
      (plan.query_rows != kNarrowRows && plan.query_rows != kTileRows) ||
      plan.num_tile_slots != num_tile_slots(s, plan.query_rows))
    return cudaErrorInvalidValue;
  if (plan.num_splits > 1 && (workspace == nullptr || workspace_bytes < paged_attention_workspace_bytes(plan, s)))
    return cudaErrorInvalidValue;
  if (plan.num_splits > 65535 || plan.stream_ctas < 0 || plan.stream_unit_cost < 0 || plan.stream_unit_cost > 64)
    return cudaErrorInvalidValue;
  const RaggedHeads& rg = args.ragged;
  if (rg.num_tables > 0 && (rg.head_table == nullptr || rg.head_slot == nullptr || rg.head_splits == nullptr ||
                            rg.head_split0 == nullptr || rg.page_stride <= 0 || rg.num_work < s.num_kv_heads ||
                            rg.num_work > 65535 || rg.max_splits != plan.num_splits))
    return cudaErrorInvalidValue;
  const bool fp8 = args.k_codes != nullptr;
  if (fp8 && (args.v_codes == nullptr || args.k_scales == nullptr || args.v_scales == nullptr))
    return cudaErrorInvalidValue;
  void* ws = plan.num_splits > 1 ? workspace : nullptr;
  const bool narrow = plan.query_rows == kNarrowRows;
  // FP8 decode with split counters and a balanced plan: the balanced kernel, which merges with
  // them (without counters the streamed kernel below runs the plan's splits).
  if (fp8 && narrow && plan.stream_ctas > 0 && args.split_counters != nullptr && s.num_tokens == s.num_seqs &&
      s.num_heads / s.num_kv_heads <= kStreamRows) {
    if (workspace == nullptr || workspace_bytes < paged_attention_workspace_bytes(plan, s)) return cudaErrorInvalidValue;
    return s.head_dim == 64 ? launch_fp8_balanced<64>(args, plan, workspace, stream)
                            : launch_fp8_balanced<128>(args, plan, workspace, stream);
  }
  // FP8 decode batches with a GQA group of at most kStreamRows: the streamed kernel.
  if (fp8 && narrow && plan.items_per_cta > 0 && s.num_tokens == s.num_seqs &&
      s.num_heads / s.num_kv_heads <= kStreamRows)
    return s.head_dim == 64 ? launch_fp8_stream<64>(args, plan, ws, stream) : launch_fp8_stream<128>(args, plan, ws, stream);
  if (s.head_dim == 64) {
    if (narrow) return fp8 ? launch<64, true, true>(args, plan, ws, stream) : launch<64, false, true>(args, plan, ws, stream);
    return fp8 ? launch<64, true, false>(args, plan, ws, stream) : launch<64, false, false>(args, plan, ws, stream);
  }
  if (narrow) return fp8 ? launch<128, true, true>(args, plan, ws, stream) : launch<128, false, true>(args, plan, ws, stream);
  return fp8 ? launch<128, true, false>(args, plan, ws, stream) : launch<128, false, false>(args, plan, ws, stream);
}

AttentionShape mixed_decode_shape(const AttentionShape& shape, int decode_seqs) {
  AttentionShape d = shape;
  d.num_seqs = d.num_tokens = decode_seqs;
  return d;
}

AttentionShape mixed_rest_shape(const AttentionShape& shape, int decode_seqs) {
  AttentionShape r = shape;
  r.num_seqs -= decode_seqs;
  r.num_tokens -= decode_seqs;
  return r;
}

MixedAttentionPlan plan_mixed_attention(const AttentionShape& shape, int decode_seqs, int decode_max_kv_len,
                                        int rest_max_kv_len, bool fp8, int num_sms) {
  MixedAttentionPlan plan;
  const int group = shape.num_kv_heads > 0 ? shape.num_heads / shape.num_kv_heads : 0;
  const bool split = fp8 && decode_seqs >= kMixedDecodeMinSeqs && decode_seqs < shape.num_seqs &&
                     shape.num_tokens - decode_seqs > shape.num_seqs - decode_seqs && group >= 1 &&
                     group <= kNarrowRows;
  if (!split) {
    plan.rest = plan_paged_attention(shape, std::max(decode_max_kv_len, rest_max_kv_len), num_sms);
    return plan;
  }
  plan.decode_seqs = decode_seqs;
  plan.decode = plan_paged_attention(mixed_decode_shape(shape, decode_seqs), decode_max_kv_len, num_sms);
  plan.rest = plan_paged_attention(mixed_rest_shape(shape, decode_seqs), rest_max_kv_len, num_sms);
  return plan;
}

size_t mixed_attention_workspace_bytes(const MixedAttentionPlan& plan, const AttentionShape& shape) {
  if (plan.decode_seqs == 0) return paged_attention_workspace_bytes(plan.rest, shape);
  return std::max(paged_attention_workspace_bytes(plan.decode, mixed_decode_shape(shape, plan.decode_seqs)),
                  paged_attention_workspace_bytes(plan.rest, mixed_rest_shape(shape, plan.decode_seqs)));
}

cudaError_t paged_attention_mixed(const AttentionArgs& args, const MixedAttentionPlan& plan,
                                  const int32_t* rest_q_indptr, void* workspace, size_t workspace_bytes,
                                  cudaStream_t stream) {
  const int k = plan.decode_seqs;
  if (k == 0) return paged_attention(args, plan.rest, workspace, workspace_bytes, stream);
  const AttentionShape& s = args.shape;
  if (k < 0 || k >= s.num_seqs || s.num_tokens - k < s.num_seqs - k || rest_q_indptr == nullptr ||
      args.ragged.num_tables > 0)
    return cudaErrorInvalidValue;
  // The decode rows: sequences 0 .. k-1, tokens 0 .. k-1 (q_indptr[i] = i there), the arrays as given.
  AttentionArgs decode = args;
  decode.shape = mixed_decode_shape(s, k);
  cudaError_t err = paged_attention(decode, plan.decode, workspace, workspace_bytes, stream);
  if (err != cudaSuccess) return err;
  // The rest: a batch of its own whose first token is the batch's token k. page_indptr keeps its
  // values (offsets into page_indices, which is shared).
  AttentionArgs rest = args;
  rest.shape = mixed_rest_shape(s, k);
  const long long row_elems = static_cast<long long>(s.num_heads) * s.head_dim;
  rest.q = args.q + k * row_elems;
  rest.out = args.out + k * row_elems;
  rest.q_indptr = rest_q_indptr;
  rest.page_indptr = args.page_indptr + k;
  rest.kv_len = args.kv_len + k;
  return paged_attention(rest, plan.rest, workspace, workspace_bytes, stream);
}

}  // namespace origami::cuda
