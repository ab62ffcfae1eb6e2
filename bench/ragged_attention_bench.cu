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
// (plus q and out); the floor is bytes / the measured device-to-device copy bandwidth.
// Build: cmake target ragged_attention_bench (links origami_cuda).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
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

}  // namespace

int main() {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("device: %s, %d SMs\n", prop.name, sms);
  const double copy_gbs = measure_copy_gbs(10);
  // Synthetic calibration: [layer][head] ratios in [0.1, 0.6].
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> ratio(0.1, 0.6);
  std::vector<std::vector<double>> ratios(kLayers, std::vector<double>(kHeads));
  for (auto& layer : ratios)
    for (double& r : layer) r = ratio(rng);

  // One pool for the largest case, shared by every layer's tables (each layer its own shuffle).
  const size_t pool_bytes = size_t(6) << 30;
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
  for (int hp : {2, 4})
    for (int batch : {1, 4, 16, 64})
      for (int N : {8192, 32768}) {
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
        std::vector<int32_t> q_indptr(batch + 1);
        std::iota(q_indptr.begin(), q_indptr.end(), 0);
        int32_t* d_q_indptr = upload(q_indptr);
        AttentionArgs base;
        base.shape = {batch, batch, kQHeads, kHeads, kD, kBlock};
        base.softmax_scale = 0.08838834764f;
        base.q = q;
        base.out = out;
        base.q_indptr = d_q_indptr;
        // The backend's plan: the uniform split count of the mean group length (planning_length).
        // The backend's plan for non-uniform budgets: one resident wave over the mean group length.
        AttentionPlan uniform_plan = plan_ragged_attention(base.shape, with_map.planning_length(max_len), sms);
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
        const AttentionPlan full_plan = plan_paged_attention(base.shape, max_uniform, sms);
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
        uniform_plan = plan_paged_attention(base.shape, with_map.planning_length(max_len), sms);
        const int s_wave = uniform_plan.num_splits;
        const float map1_ms = median_ms([&](int) { ragged_step(with_map); }, 15);
        const float nomap1_ms = median_ms([&](int) { ragged_step(without_map); }, 15);
        uniform_plan = one_wave;
        const float unif_ms = median_ms([&](int) { uniform_step(); }, 15);
        const double bytes = kv_bytes + kLayers * 2.0 * batch * kQHeads * kD * 2;
        auto gbs = [&](float ms) { return bytes / ms / 1e6; };
        std::printf("%3d %5d %6d | %9.1f %8.0f | %9.1f %8.0f | %9.1f %8.0f | %7.0f%% %8.2fx %9.1f   (s=%d, max splits %d)\n",
                    hp, batch, N, map_ms * 1e3, gbs(map_ms), nomap_ms * 1e3, gbs(nomap_ms), unif_ms * 1e3, gbs(unif_ms),
                    100.0 * unif_ms / map_ms, nomap_ms / map_ms, bytes / copy_gbs / 1e3, uniform_plan.num_splits,
                    with_map.max_splits(uniform_plan.num_splits));
        std::printf("    two waves (s=%d): map %.1f us, no map %.1f us, no map / map %.2fx\n", s_wave, map1_ms * 1e3,
                    nomap1_ms * 1e3, nomap1_ms / map1_ms);
        for (auto* v : {&ragged_in, &uniform_in})
          for (LayerInputs& in : *v) {
            CK(cudaFree(in.page_indptr));
            CK(cudaFree(in.pages));
            CK(cudaFree(in.kv_len));
          }
        CK(cudaFree(d_q_indptr));
      }
  CK(cudaFree(pool));
  CK(cudaFree(q));
  CK(cudaFree(out));
  CK(cudaFree(ws));
  return 0;
}
