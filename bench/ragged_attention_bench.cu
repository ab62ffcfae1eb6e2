// Ragged decode attention (head groups, TANGRAM §4.2-4.3) on the Qwen3-8B attention shape
// (36 layers, 32 query heads, 8 KV heads, head_dim 128), one decode step's attention over all
// layers, three ways over the SAME K/V bytes:
//   ragged+map : head groups of H_p heads with their own lengths; s = plan_ragged_attention (one
//                resident wave over the mean group length), shared among groups by the split map
//   ragged     : the same kernel, tables and s, every group s splits (no map)
//   uniform    : the one-group layout, every head at the mean length of the ragged heads
//                (plan_paged_attention)
// plus, for reference, both ragged variants under plan_paged_attention's two waves of splits.
// Budgets are synthetic with a calibration's spread (each head's ratio uniform in [0.1, 0.6],
// seeded; heads clustered by budget as --kv-head-budgets does), group g of a layer holds
// ceil(ratio_g x N) entries for each of its heads. Bytes counted: K and V of every entry read once
// (plus q and out); the floor is bytes / the measured device-to-device copy bandwidth. Each row
// also prints which variant the backend's rule picks (RaggedHeadTables::use_split_map: the map
// from kv/split_map.h kSplitMapMinEntriesPerSplit entries per split of the planning length).
//
// --per-head: the production per-head layout instead (--heads-per-group 1, block 256, Fast KVzip:
// one page table per (layer, KV head), uniform group budgets), bf16 and FP8 KV, batch 1 / 64 /
// 256, N = 1024 / 4096 entries per head, every head at N ("uniform") or head lengths drawn in
// whole pages around N with each (sequence, layer) summing to 8 N ("spread", what a page-aligned
// global budget gives): the per-head launch (plan_paged_attention over the step's longest head,
// as the backend plans uniform budgets, and at the graph capture length) against the one-group
// kernel over the same bytes, each a CUDA graph of the 36 launches, next to the bandwidth floor.
// Build: cmake target ragged_attention_bench (links origami_cuda).
// Run: build/ragged_attention_bench (head groups H_p 2, 4), --long (H_p 2, batch 1-2, N 64K-128K)
// or --per-head (--fp8-only: its FP8 rows alone; ORIGAMI_BENCH_BATCHES / ORIGAMI_BENCH_CONTEXTS
// replace its batches and lengths). Decode launches of kFusedMergeMinSplits or more
// splits merge them in the last CTA of each unit, as the backend's do; ORIGAMI_BENCH_FUSED_MERGE=0
// runs the merge kernel instead, to compare. FP8 decode runs the balanced kernel
// (AttentionPlan::stream_ctas) where the launch has counters; ORIGAMI_BENCH_BALANCED=0 turns it off.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/paged_attention.h"
#include "backend/cuda/ragged_heads.h"
#include "bench_util.cuh"
#include "kv/head_grouping.h"
#include "kv/kv_layout.h"

using namespace origami;
using namespace origami::cuda;

namespace {

constexpr int kLayers = 36, kHeads = 8, kQHeads = 32, kD = 128, kBlock = 16;

int32_t* upload(const std::vector<int32_t>& v) {
  int32_t* d = nullptr;
  CK(cudaMalloc(&d, std::max<size_t>(v.size(), 1) * 4));
  CK(cudaMemcpy(d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// One layer's step inputs: tables (group-major) over shuffled pages of a pool of `pool_pages`.
struct LayerInputs {
  int32_t *page_indptr = nullptr, *pages = nullptr, *kv_len = nullptr;
};
LayerInputs make_inputs(const std::vector<int>& lens, int batch, int pool_pages, std::mt19937& rng) {
  std::vector<int32_t> indptr = {0}, pages, kv_len;
  std::vector<int32_t> ids(pool_pages - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t used = 0;
  for (int len : lens)
    for (int i = 0; i < batch; ++i) {
      const int n = (len + kBlock - 1) / kBlock;
      if (used + n > ids.size()) std::abort();
      pages.insert(pages.end(), ids.begin() + used, ids.begin() + used + n);
      used += n;
      indptr.push_back(static_cast<int32_t>(pages.size()));
      kv_len.push_back(len);
    }
  return {upload(indptr), upload(pages), upload(kv_len)};
}

// The planner's plan, without the balanced FP8 decode kernel under ORIGAMI_BENCH_BALANCED=0 (the
// streamed kernel's splits, to compare; the launches pass split counters, which it needs).
bool balanced_off() {
  const char* v = std::getenv("ORIGAMI_BENCH_BALANCED");
  return v != nullptr && std::string(v) == "0";
}
AttentionPlan with_balanced(AttentionPlan plan) {
  if (balanced_off()) plan.stream_ctas = 0;
  return plan;
}

// Split arrival counters for the fused merge (AttentionArgs::split_counters): one zeroed buffer for
// the largest shape so far (launches leave it zero), or null with ORIGAMI_BENCH_FUSED_MERGE=0 (the
// merge kernel, to compare).
int32_t* split_counters_for(const AttentionShape& shape) {
  static int32_t* counters = nullptr;
  static long long capacity = 0;
  const char* env = std::getenv("ORIGAMI_BENCH_FUSED_MERGE");
  if (env != nullptr && env[0] == '0') return nullptr;
  const long long need = split_counter_count(shape);
  if (need > capacity) {
    CK(cudaFree(counters));
    CK(cudaMalloc(&counters, need * sizeof(int32_t)));
    CK(cudaMemset(counters, 0, need * sizeof(int32_t)));
    capacity = need;
  }
  return counters;
}

// One decode step's attention arguments over `batch` sequences (one query token each) at the
// Qwen3-8B attention shape; q_indptr uploaded (the caller frees base.q_indptr).
AttentionArgs decode_args(int batch, int block, __nv_bfloat16* q, __nv_bfloat16* out) {
  std::vector<int32_t> q_indptr(batch + 1);
  std::iota(q_indptr.begin(), q_indptr.end(), 0);
  AttentionArgs base;
  base.shape = {batch, batch, kQHeads, kHeads, kD, block};
  base.softmax_scale = 0.08838834764f;  // 1 / sqrt(128)
  base.q = q;
  base.out = out;
  base.q_indptr = upload(q_indptr);
  base.split_counters = split_counters_for(base.shape);
  return base;
}

void free_inputs(std::vector<LayerInputs>& layers) {
  for (LayerInputs& in : layers) {
    CK(cudaFree(in.page_indptr));
    CK(cudaFree(in.pages));
    CK(cudaFree(in.kv_len));
  }
}

// Head groups at block 16, calibration-like budgets: split map, no map, one group. The default
// table: H_p 2 and 4, batch 1-64, N 8K and 32K in a 6 GiB pool; `long_groups` (--long): H_p 2 at
// batch 1 and 2 with N 64K and 128K (the rule's long-group rows at small batch) in a 40 GiB pool.
int grouped_table(int sms, double copy_gbs, bool long_groups) {
  // Synthetic calibration: [layer][head] ratios in [0.1, 0.6].
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> ratio(0.1, 0.6);
  std::vector<std::vector<double>> ratios(kLayers, std::vector<double>(kHeads));
  for (auto& layer : ratios)
    for (double& r : layer) r = ratio(rng);

  // One pool for the largest case, shared by every layer's tables (each layer its own shuffle).
  const size_t pool_bytes = size_t(long_groups ? 40 : 6) << 30;
  const std::vector<int> hps = long_groups ? std::vector<int>{2} : std::vector<int>{2, 4};
  const std::vector<int> batches = long_groups ? std::vector<int>{1, 2} : std::vector<int>{1, 4, 16, 64};
  const std::vector<int> lengths = long_groups ? std::vector<int>{65536, 131072} : std::vector<int>{8192, 32768};
  __nv_bfloat16* pool = nullptr;
  CK(cudaMalloc(&pool, pool_bytes));
  fill_random<<<4096, 256>>>(pool, pool_bytes / 2, 1);
  __nv_bfloat16 *q, *out;
  const int max_batch = 64;
  CK(cudaMalloc(&q, size_t(max_batch) * kQHeads * kD * 2));
  CK(cudaMalloc(&out, size_t(max_batch) * kQHeads * kD * 2));
  fill_random<<<256, 256>>>(q, size_t(max_batch) * kQHeads * kD, 3);
  void* ws = nullptr;
  const size_t ws_cap = size_t(512) << 20;
  CK(cudaMalloc(&ws, ws_cap));

  std::printf("%3s %5s %6s | %9s %8s | %9s %8s | %9s %8s | %8s %9s %9s\n", "H_p", "batch", "N", "map_us", "GB/s",
              "nomap_us", "GB/s", "unif_us", "GB/s", "map/unif", "nomap/map", "floor_us");
  for (int hp : hps)
    for (int batch : batches)
      for (int N : lengths) {
        auto grouping = cluster_heads(ratios, hp);
        if (!grouping) { std::fprintf(stderr, "%s\n", grouping.status().to_string().c_str()); return 1; }
        const int T = kHeads / hp;
        const long long page_elems = 2LL * hp * kBlock * kD;
        const int pool_pages = static_cast<int>(pool_bytes / 2 / page_elems);
        auto layout = KVLayout::grouped(kLayers, kHeads, kD, kBlock, pool_pages, DType::kBF16, grouping->groups);
        if (!layout) { std::fprintf(stderr, "%s\n", layout.status().to_string().c_str()); return 1; }
        for (int l = 0; l < kLayers; ++l)
          for (int j = 0; j < T; ++j) layout->groups[l * T + j].budget = grouping->group_ratio[l][j];
        const int max_s = (4 * sms + kHeads - 1) / kHeads;
        RaggedHeadTables with_map, without_map;
        if (!with_map.build(*layout, max_s, true).is_ok() || !without_map.build(*layout, max_s, false).is_ok()) return 1;
        // Per layer: group lengths, ragged inputs, and the uniform layout's mean length.
        std::vector<LayerInputs> ragged_in, uniform_in;
        std::vector<int> uniform_len(kLayers);
        double kv_bytes = 0;
        int max_len = 0;
        for (int l = 0; l < kLayers; ++l) {
          std::vector<int> lens(T);
          long long entries = 0;  // per sequence, all heads
          for (int j = 0; j < T; ++j) {
            lens[j] = grouping->group_token_budget(l, j, N);
            entries += static_cast<long long>(lens[j]) * hp;
            max_len = std::max(max_len, lens[j]);
          }
          uniform_len[l] = static_cast<int>((entries + kHeads - 1) / kHeads);
          kv_bytes += 2.0 * entries * kD * 2 * batch;
          ragged_in.push_back(make_inputs(lens, batch, pool_pages, rng));
          // The one-group layout: K in the pool's first half, V in its second, pages of
          // [8 heads, block, D].
          const int full_pages = static_cast<int>(pool_bytes / 2 / 2 / (size_t(kHeads) * kBlock * kD));
          uniform_in.push_back(make_inputs({uniform_len[l]}, batch, full_pages, rng));
        }
        AttentionArgs base = decode_args(batch, kBlock, q, out);
        // The backend's plan: the uniform split count of the mean group length (planning_length).
        // The backend's plan for non-uniform budgets: one resident wave over the mean group length.
        AttentionPlan uniform_plan = with_balanced(plan_ragged_attention(base.shape, with_map.planning_length(max_len), sms));
        auto ragged_step = [&](const RaggedHeadTables& tables) {
          for (int l = 0; l < kLayers; ++l) {
            AttentionArgs a = base;
            a.k_cache = pool;
            a.v_cache = pool + size_t(hp) * kBlock * kD;
            a.page_indptr = ragged_in[l].page_indptr;
            a.page_indices = ragged_in[l].pages;
            a.kv_len = ragged_in[l].kv_len;
            a.ragged = tables.layer(l, uniform_plan.num_splits, page_elems);
            const AttentionPlan plan = ragged_plan(uniform_plan, a.ragged);
            const size_t bytes = paged_attention_workspace_bytes(plan, a.shape);
            if (bytes > ws_cap) std::abort();
            CK(paged_attention(a, plan, ws, bytes, nullptr));
          }
        };
        const int max_uniform = *std::max_element(uniform_len.begin(), uniform_len.end());
        const AttentionPlan full_plan = with_balanced(plan_paged_attention(base.shape, max_uniform, sms));
        auto uniform_step = [&] {
          for (int l = 0; l < kLayers; ++l) {
            AttentionArgs a = base;
            a.k_cache = pool;
            a.v_cache = pool + pool_bytes / 4;  // second half of the pool
            a.page_indptr = uniform_in[l].page_indptr;
            a.page_indices = uniform_in[l].pages;
            a.kv_len = uniform_in[l].kv_len;
            const size_t bytes = paged_attention_workspace_bytes(full_plan, a.shape);
            CK(paged_attention(a, full_plan, ws, bytes, nullptr));
          }
        };
        for (int w = 0; w < 3; ++w) { ragged_step(with_map); ragged_step(without_map); uniform_step(); }
        CK(cudaDeviceSynchronize());
        const float map_ms = median_ms([&](int) { ragged_step(with_map); }, 15);
        const float nomap_ms = median_ms([&](int) { ragged_step(without_map); }, 15);
        // For reference: the one-group planner's two waves of splits (4 CTAs per SM, 2 resident).
        const AttentionPlan one_wave = uniform_plan;
        uniform_plan = with_balanced(plan_paged_attention(base.shape, with_map.planning_length(max_len), sms));
        const int s_wave = uniform_plan.num_splits;
        const float map1_ms = median_ms([&](int) { ragged_step(with_map); }, 15);
        const float nomap1_ms = median_ms([&](int) { ragged_step(without_map); }, 15);
        uniform_plan = one_wave;
        const float unif_ms = median_ms([&](int) { uniform_step(); }, 15);
        const double bytes = kv_bytes + kLayers * 2.0 * batch * kQHeads * kD * 2;
        auto gbs = [&](float ms) { return bytes / ms / 1e6; };
        // The backend's choice for this plan (decided when the budgets loaded): map or plain splits.
        const int plan_len = with_map.planning_length(max_len);
        auto rule = [&](int s) { return with_map.use_split_map(s, plan_len) ? "map" : "plain"; };
        std::printf("%3d %5d %6d | %9.1f %8.0f | %9.1f %8.0f | %9.1f %8.0f | %7.0f%% %8.2fx %9.1f   (s=%d, max splits %d,"
                    " %d entries/split, rule: %s, faster: %s)\n",
                    hp, batch, N, map_ms * 1e3, gbs(map_ms), nomap_ms * 1e3, gbs(nomap_ms), unif_ms * 1e3, gbs(unif_ms),
                    100.0 * unif_ms / map_ms, nomap_ms / map_ms, bytes / copy_gbs / 1e3, uniform_plan.num_splits,
                    with_map.max_splits(uniform_plan.num_splits), plan_len / uniform_plan.num_splits,
                    rule(uniform_plan.num_splits), map_ms <= nomap_ms ? "map" : "plain");
        std::printf("    two waves (s=%d): map %.1f us, no map %.1f us, no map / map %.2fx (rule: %s, not the backend's plan)\n",
                    s_wave, map1_ms * 1e3, nomap1_ms * 1e3, nomap1_ms / map1_ms, rule(s_wave));
        for (auto* v : {&ragged_in, &uniform_in}) free_inputs(*v);
        CK(cudaFree(const_cast<int32_t*>(base.q_indptr)));
      }
  CK(cudaFree(pool));
  CK(cudaFree(q));
  CK(cudaFree(out));
  CK(cudaFree(ws));
  return 0;
}

// ------------------------------------------------------------------ per-head section (--per-head)

constexpr int kHeadBlock = 256;       // Fast KVzip's page-aligned budgets: block 256
constexpr int kGraphLen = 40960;      // Qwen3-8B max_position_embeddings: the backend's graph plan length

// A pool of pages of `page_elems` elements (K and V of one page; bf16, or FP8 codes followed by
// one fp32 scale per head_dim elements, 256-byte aligned, as cuda_backend.cu lays it out) in a
// buffer of `bytes`.
struct PoolView {
  int pages = 0;
  size_t codes_bytes = 0;  // FP8: where the scales start
};
PoolView pool_view(size_t bytes, long long page_elems, bool fp8) {
  PoolView v;
  const double per_elem = fp8 ? 1.0 + 4.0 / kD : 2.0;
  v.pages = static_cast<int>(std::min<double>((bytes - 4096) / (per_elem * page_elems), 2e9));
  const size_t elems = static_cast<size_t>(v.pages) * page_elems;
  v.codes_bytes = fp8 ? (elems + 255) / 256 * 256 : elems * 2;
  return v;
}

// Page ids 1 .. pages - 1 in a seeded shuffle, handed out in order and from the start again once
// all are used: when a step reads more bytes than the pool holds (batch 256 x 4096 x 36 layers x
// 8 heads: 155 GB bf16, 80 GB FP8), a page is read again only after every other page of the pool
// (tens of GB later, far beyond the 50 MB L2), so each launch still reads from DRAM.
struct PageSource {
  std::vector<int32_t> ids;
  size_t next = 0;
  size_t handed = 0;
  PageSource(int pages, std::mt19937& rng) : ids(pages - 1) {
    std::iota(ids.begin(), ids.end(), 1);
    std::shuffle(ids.begin(), ids.end(), rng);
  }
  int32_t take() {
    ++handed;
    const int32_t id = ids[next];
    next = (next + 1) % ids.size();
    return id;
  }
};

// Device step inputs of one layer: lens[t][i] entries of table t (0 .. T-1) for sequence i,
// tables group-major as the backend uploads them.
LayerInputs per_head_inputs(const std::vector<std::vector<int>>& lens, PageSource& src) {
  std::vector<int32_t> indptr = {0}, pages, kv_len;
  for (const std::vector<int>& table : lens)
    for (int len : table) {
      for (int p = 0; p < (len + kHeadBlock - 1) / kHeadBlock; ++p) pages.push_back(src.take());
      indptr.push_back(static_cast<int32_t>(pages.size()));
      kv_len.push_back(len);
    }
  return {upload(indptr), upload(pages), upload(kv_len)};
}

// Head lengths of one (sequence, layer): every head N, or whole pages drawn uniformly in
// [1, 2P - 1] (P = N / block, the mean) and then moved one page at a time between random heads
// until they sum to H x P: the bytes of the uniform row, spread as a global budget spreads them.
std::vector<int> head_lengths(int N, bool spread, std::mt19937& rng) {
  std::vector<int> len(kHeads, N);
  if (!spread) return len;
  const int P = N / kHeadBlock, hi = 2 * P - 1;
  std::uniform_int_distribution<int> draw(1, hi), head(0, kHeads - 1);
  std::vector<int> pages(kHeads);
  int sum = 0;
  for (int& p : pages) sum += (p = draw(rng));
  while (sum != kHeads * P) {
    int& p = pages[head(rng)];
    if (sum > kHeads * P && p > 1) --p, --sum;
    else if (sum < kHeads * P && p < hi) ++p, ++sum;
  }
  for (int h = 0; h < kHeads; ++h) len[h] = pages[h] * kHeadBlock;
  return len;
}

template <typename F>
cudaGraphExec_t capture(cudaStream_t st, F&& body) {
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  body(st);
  CK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t e;
  CK(cudaGraphInstantiate(&e, g, 0));
  CK(cudaGraphDestroy(g));
  return e;
}

int per_head_table(int sms, double copy_gbs, bool fp8_only) {
  // One buffer for every case, as large as fits beside q, out and the workspace (the engine's
  // pool takes what the weights leave; here the 36 layers wrap around it, see PageSource).
  size_t free_b = 0, total_b = 0;
  CK(cudaMemGetInfo(&free_b, &total_b));
  const size_t buf_bytes = std::min<size_t>(free_b - (size_t(3) << 30), size_t(64) << 30) / (2 << 20) * (2 << 20);
  uint8_t* buf = nullptr;
  CK(cudaMalloc(&buf, buf_bytes));
  // ORIGAMI_BENCH_BATCHES / ORIGAMI_BENCH_CONTEXTS: other batches and per-head lengths N (e.g. a
  // max-load run's 301 x 1024 / 1280, to set the attention's share of a per-head step apart).
  std::vector<int> ph_batches = {1, 64, 256}, ph_lengths = {1024, 4096};
  if (const char* env = std::getenv("ORIGAMI_BENCH_BATCHES")) ph_batches = parse_list("ORIGAMI_BENCH_BATCHES", env);
  if (const char* env = std::getenv("ORIGAMI_BENCH_CONTEXTS")) ph_lengths = parse_list("ORIGAMI_BENCH_CONTEXTS", env);
  // q and out for the largest batch asked (a fixed 256 let batch 301 write past out).
  const int max_batch = *std::max_element(ph_batches.begin(), ph_batches.end());
  __nv_bfloat16 *q, *out;
  CK(cudaMalloc(&q, size_t(max_batch) * kQHeads * kD * 2));
  CK(cudaMalloc(&out, size_t(max_batch) * kQHeads * kD * 2));
  fill_random<<<256, 256>>>(q, size_t(max_batch) * kQHeads * kD, 3);
  void* ws = nullptr;
  const size_t ws_cap = size_t(512) << 20;
  CK(cudaMalloc(&ws, ws_cap));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("\nPer-head pages (--heads-per-group 1, block %d, uniform group budgets), Qwen3-8B shape, %d layers, one\n"
              "CUDA graph of the %d launches each; pool %.1f GiB (steps that read more wrap around it, every page\n"
              "re-read only after the whole pool: DRAM reads); floor = bytes / copy bandwidth; ph = per-head launch\n"
              "planned like the backend's eager step (plan_paged_attention, longest head), ph@%d = the graph\n"
              "plan (capture length %d), 1grp = one-group kernel, every head at N, the same bytes, planned at N\n",
              kHeadBlock, kLayers, kLayers, buf_bytes / double(1 << 30), kGraphLen, kGraphLen);
  std::printf("%4s %7s %5s %5s | %9s %6s %6s | %9s %8s | %9s %6s | %9s | %5s %5s\n", "kv", "lengths", "batch", "N",
              "ph_us", "GB/s", "%floor", "1grp_us", "ph/1grp", "ph@cap_us", "%flr", "floor_us", "s", "s@cap");
  std::mt19937 rng(11);
  // ORIGAMI_BENCH_SPLITS=1,2,4: each row again at these KV split counts.
  std::vector<int> split_sweep;
  if (const char* env = std::getenv("ORIGAMI_BENCH_SPLITS")) split_sweep = parse_list("ORIGAMI_BENCH_SPLITS", env);
  for (bool fp8 : {false, true})
    for (bool spread : {false, true})
      if (fp8 || !fp8_only)
      for (int batch : ph_batches)
        for (int N : ph_lengths) {
          if (spread && N < 2 * kHeadBlock) continue;
          // Per-head layout: pages [2, 1, block, D]; the same buffer seen as the one-group layout
          // (pages [8, block, D] of K in the first half, of V in the second) for the comparison.
          const long long page_elems = 2LL * kHeadBlock * kD;
          const PoolView ragged_pool = pool_view(buf_bytes, page_elems, fp8);
          const long long full_page_elems = static_cast<long long>(kHeads) * kHeadBlock * kD;
          const PoolView full_pool = pool_view(buf_bytes, 2 * full_page_elems, fp8);
          if (fp8) {
            fill_codes<<<4096, 256>>>(buf, buf_bytes, 5);
            // Both views' scales: the ragged view's start is later (smaller pages per element), so fill from
            // the earlier start to the end.
            const size_t s0 = std::min(ragged_pool.codes_bytes, full_pool.codes_bytes);
            fill_value<<<4096, 256>>>(reinterpret_cast<float*>(buf + s0), (buf_bytes - s0) / 4, 1.f / 448.f);  // near amax / 448 of a unit vector
          } else {
            fill_random<<<4096, 256>>>(reinterpret_cast<__nv_bfloat16*>(buf), buf_bytes / 2, 1);
          }
          CK(cudaGetLastError());
          auto layout = KVLayout::grouped(kLayers, kHeads, kD, kHeadBlock, ragged_pool.pages, DType::kBF16,
                                          KVLayout::adjacent_heads(kLayers, kHeads, 1));
          if (!layout) { std::fprintf(stderr, "%s\n", layout.status().to_string().c_str()); return 1; }
          RaggedHeadTables tables;
          const int max_s = std::max(1, (4 * sms + kHeads - 1) / kHeads);  // as allocate_kv_cache
          if (!tables.build(*layout, max_s).is_ok()) return 1;
          // Lengths [layer][head][seq]; per layer the one-group layout holds every head at N.
          PageSource ragged_src(ragged_pool.pages, rng), full_src(full_pool.pages, rng);
          std::vector<LayerInputs> ragged_in, full_in;
          int max_len = 0;
          double entries = 0;
          for (int l = 0; l < kLayers; ++l) {
            std::vector<std::vector<int>> lens(kHeads, std::vector<int>(batch));
            for (int i = 0; i < batch; ++i) {
              const std::vector<int> h = head_lengths(N, spread, rng);
              for (int t = 0; t < kHeads; ++t) {
                lens[t][i] = h[t];
                max_len = std::max(max_len, h[t]);
                entries += h[t];
              }
            }
            ragged_in.push_back(per_head_inputs(lens, ragged_src));
            full_in.push_back(per_head_inputs({std::vector<int>(batch, N)}, full_src));
          }
          AttentionArgs base = decode_args(batch, kHeadBlock, q, out);
          // Element offsets of K and V (ragged: within a page; one group: the two halves).
          auto set_cache = [&](AttentionArgs& a, const PoolView& v, size_t k_off, size_t v_off) {
            if (fp8) {
              a.k_codes = buf + k_off;
              a.v_codes = buf + v_off;
              a.k_scales = reinterpret_cast<const float*>(buf + v.codes_bytes) + k_off / kD;
              a.v_scales = reinterpret_cast<const float*>(buf + v.codes_bytes) + v_off / kD;
            } else {
              a.k_cache = reinterpret_cast<const __nv_bfloat16*>(buf) + k_off;
              a.v_cache = reinterpret_cast<const __nv_bfloat16*>(buf) + v_off;
            }
          };
          // The backend's decode step with uniform budgets: plan_paged_attention over its plan length,
          // the tables' map for that s where the rule takes it (never, with uniform budgets).
          // forced_splits > 0: that many KV splits instead of the planner's (ORIGAMI_BENCH_SPLITS).
          auto ragged_graph = [&](int plan_len, AttentionPlan* used, int forced_splits = 0) {
            AttentionPlan uniform = plan_paged_attention(base.shape, plan_len, sms);
            if (forced_splits > 0) uniform = with_kv_splits(uniform, plan_len, forced_splits);
            // The balanced kernel as the backend decides it for per-head tables: at the step's
            // longest head (max_len), whatever length the graph was planned for.
            uniform.stream_ctas =
                !balanced_off() && forced_splits == 0 ? balanced_step_ctas(base.shape, max_len, sms, true) : 0;
            const bool map = !tables.uniform_budgets() && tables.use_split_map(uniform.num_splits, plan_len);
            const AttentionPlan plan = ragged_plan(uniform, tables.layer(0, uniform.num_splits, page_elems, map));
            *used = plan;
            const size_t bytes = paged_attention_workspace_bytes(plan, base.shape);
            if (bytes > ws_cap) std::abort();
            return capture(st, [&](cudaStream_t s) {
              for (int l = 0; l < kLayers; ++l) {
                AttentionArgs a = base;
                set_cache(a, ragged_pool, 0, size_t(kHeadBlock) * kD);
                a.page_indptr = ragged_in[l].page_indptr;
                a.page_indices = ragged_in[l].pages;
                a.kv_len = ragged_in[l].kv_len;
                a.ragged = tables.layer(l, uniform.num_splits, page_elems, map);
                CK(paged_attention(a, plan, ws, bytes, s));
              }
            });
          };
          AttentionPlan eager_plan, cap_plan;
          cudaGraphExec_t g_ph = ragged_graph(max_len, &eager_plan);
          cudaGraphExec_t g_cap = ragged_graph(kGraphLen, &cap_plan);
          auto full_graph = [&](const AttentionPlan& full_plan) {
           return capture(st, [&](cudaStream_t s) {
            const size_t region = static_cast<size_t>(full_pool.pages) * full_page_elems;
            for (int l = 0; l < kLayers; ++l) {
              AttentionArgs a = base;
              set_cache(a, full_pool, 0, region);
              a.page_indptr = full_in[l].page_indptr;
              a.page_indices = full_in[l].pages;
              a.kv_len = full_in[l].kv_len;
              const size_t bytes = paged_attention_workspace_bytes(full_plan, a.shape);
              CK(paged_attention(a, full_plan, ws, bytes, s));
            }
           });
          };
          const AttentionPlan full_plan = with_balanced(plan_paged_attention(base.shape, N, sms));
          cudaGraphExec_t g_full = full_graph(full_plan);
          for (int w = 0; w < 3; ++w)
            for (cudaGraphExec_t g : {g_ph, g_cap, g_full}) CK(cudaGraphLaunch(g, 0));
          CK(cudaDeviceSynchronize());
          const double step_gb = entries * (fp8 ? 2.0 * (kD + 4) : 2.0 * kD * 2) / 1e9;
          const int iters = step_gb > 20 ? 7 : 15;
          const float ph_ms = median_ms([&](int) { CK(cudaGraphLaunch(g_ph, 0)); }, iters);
          const float cap_ms = median_ms([&](int) { CK(cudaGraphLaunch(g_cap, 0)); }, iters);
          const float full_ms = median_ms([&](int) { CK(cudaGraphLaunch(g_full, 0)); }, iters);
          // Bytes read: K and V of every entry (FP8: codes and scales), q and out of every layer.
          const double bytes = step_gb * 1e9 + kLayers * 2.0 * batch * kQHeads * kD * 2;
          const double floor_us = bytes / copy_gbs / 1e3;
          std::printf("%4s %7s %5d %5d | %9.1f %6.0f %5.0f%% | %9.1f %7.2fx | %9.1f %5.0f%% | %9.1f | %5d %5d%s\n",
                      fp8 ? "fp8" : "bf16", spread ? "spread" : "uniform", batch, N, ph_ms * 1e3, bytes / ph_ms / 1e6,
                      100.0 * floor_us / (ph_ms * 1e3), full_ms * 1e3, ph_ms / full_ms, cap_ms * 1e3,
                      100.0 * floor_us / (cap_ms * 1e3), floor_us, eager_plan.num_splits, cap_plan.num_splits,
                      ragged_src.handed > ragged_src.ids.size() ? "  (pool wrapped)" : "");
          std::fflush(stdout);
          // The same step at other split counts, per-head (eager plan length) and one group.
          for (int s : split_sweep) {
            AttentionPlan used;
            cudaGraphExec_t g_s = ragged_graph(max_len, &used, s);
            cudaGraphExec_t g_fs = full_graph(with_kv_splits(full_plan, N, s));
            for (int w = 0; w < 2; ++w)
              for (cudaGraphExec_t g : {g_s, g_fs}) CK(cudaGraphLaunch(g, 0));
            const float s_ms = median_ms([&](int) { CK(cudaGraphLaunch(g_s, 0)); }, iters);
            const float fs_ms = median_ms([&](int) { CK(cudaGraphLaunch(g_fs, 0)); }, iters);
            std::printf("%4s %7s %5d %5d |   splits %d (planner %d): ph %9.1f us %5.0f%% | 1grp %9.1f us %5.0f%%\n",
                        fp8 ? "fp8" : "bf16", spread ? "spread" : "uniform", batch, N, used.num_splits,
                        eager_plan.num_splits, s_ms * 1e3, 100.0 * floor_us / (s_ms * 1e3), fs_ms * 1e3,
                        100.0 * floor_us / (fs_ms * 1e3));
            std::fflush(stdout);
            for (cudaGraphExec_t g : {g_s, g_fs}) CK(cudaGraphExecDestroy(g));
          }
          for (cudaGraphExec_t g : {g_ph, g_cap, g_full}) CK(cudaGraphExecDestroy(g));
          for (auto* v : {&ragged_in, &full_in}) free_inputs(*v);
          CK(cudaFree(const_cast<int32_t*>(base.q_indptr)));
        }
  CK(cudaStreamDestroy(st));
  CK(cudaFree(buf));
  CK(cudaFree(q));
  CK(cudaFree(out));
  CK(cudaFree(ws));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool per_head = false, long_groups = false, fp8_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--per-head") {
      per_head = true;
    } else if (arg == "--fp8-only") {
      fp8_only = true;
    } else if (arg == "--long") {
      long_groups = true;
    } else {
      std::fprintf(stderr, "usage: ragged_attention_bench [--per-head [--fp8-only] | --long]  (unknown argument '%.100s')\n", argv[i]);
      return 2;
    }
  }
  const int sms = print_device("");
  const double copy_gbs = measure_copy_gbs(10);
  return per_head ? per_head_table(sms, copy_gbs, fp8_only) : grouped_table(sms, copy_gbs, long_groups);
}
