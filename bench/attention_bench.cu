// Decode-attention bandwidth for the Qwen3-8B attention shape (32 query heads, 8 KV heads,
// head_dim 128), next to a measured device-to-device copy bandwidth, for the bf16 and the FP8
// cache and both kernels (64 query rows a CTA, and the decode planner's 16). Bytes counted: K and
// V of every cached entry read once (the floor; FP8: codes and scales), plus q and out. Random data, shuffled page ids, and
// several page-table copies rotated between iterations so small cases do not sit in L2.
// Build: nvcc -std=c++20 -O3 -arch=sm_90 -Isrc bench/attention_bench.cu src/backend/cuda/paged_attention.cu \
//        src/backend/cuda/programmatic_launch.cpp
// Run: attention_bench [--cache bf16|fp8] [--rows 16|64] [--blocks 16,256] [--batches 1,64,256]
//                      [--contexts 1024,4096] [--items 0,4] [--balanced 0,1] [--no-prefill]
//                      [--splits 0,2] [--sequential-pages | --interleaved-pages] [--pool-entries N]
// (defaults in brackets' second form: both caches, both kernels, the lists shown). The max-load
// decode shape of an 8B model with a compressed cache is --batches 1024 --contexts 640.
// Launches pass split counters, as the engine's do (the fused merge from 16 splits, and the
// balanced FP8 kernel, AttentionPlan::stream_ctas); --balanced 0 turns that kernel off, 1 keeps the
// planner's grid (the default), N > 1 runs it on N CTAs; --unit-costs sets its fixed cost of a unit
// (AttentionPlan::stream_unit_cost). --sequential-pages: each sequence's pages in pool order;
// --interleaved-pages: page k of sequence i at k x batch + i (max-load waves); --pool-entries N:
// a pool of at least N entries, so the pages spread over as many bytes as the engine's pool.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/paged_attention.h"
#include "bench_util.cuh"

using namespace origami::cuda;

int main(int argc, char** argv) {
  std::vector<bool> caches = {false, true};
  std::vector<int> rows_list = {64, 16}, blocks = {16, 256}, batches = {1, 64, 256}, contexts = {1024, 4096};
  std::vector<int> items_list = {-1};  // -1: the planner's choice
  std::vector<int> balanced_list = {1};
  std::vector<int> unit_costs = {-1};  // --unit-costs: the balanced kernel's fixed cost of a unit (-1: the plan's)
  // --splits: KV splits of every (sequence, KV head), laid out as the planner would (0: the plan's).
  // A batch's units fill whole waves of resident CTAs or leave the last one part empty; splitting
  // them trades that tail for partials and their merge.
  std::vector<int> splits_list = {0};
  bool sequential_pages = false;  // --sequential-pages: each sequence's pages in pool order, as a fresh engine allocates them
  // --interleaved-pages: page k of sequence i at pool page k * batch + i, as an engine allocates
  // them when equal-length sequences cross each page boundary in the same step (max-load waves).
  bool interleaved_pages = false;
  size_t min_pool_entries = 0;  // --pool-entries N: a pool of at least N entries (the engine's is GBs a layer)
  bool prefill = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--cache" && has_value) {
      const std::string v = argv[++i];
      if (v != "bf16" && v != "fp8") {
        std::fprintf(stderr, "--cache: expected bf16 or fp8, got '%.100s'\n", v.c_str());
        return 2;
      }
      caches = {v == "fp8"};
    } else if (arg == "--rows" && has_value) {
      rows_list = parse_list("--rows", argv[++i]);
      for (int r : rows_list)
        if (r != 16 && r != 64) {
          std::fprintf(stderr, "--rows: expected 16 or 64, got %d\n", r);
          return 2;
        }
    } else if (arg == "--blocks" && has_value) {
      blocks = parse_list("--blocks", argv[++i]);
    } else if (arg == "--batches" && has_value) {
      batches = parse_list("--batches", argv[++i]);
    } else if (arg == "--contexts" && has_value) {
      contexts = parse_list("--contexts", argv[++i]);
    } else if (arg == "--items" && has_value) {
      items_list = parse_list("--items", argv[++i], 0);
    } else if (arg == "--balanced" && has_value) {
      balanced_list = parse_list("--balanced", argv[++i], 0);
    } else if (arg == "--unit-costs" && has_value) {
      unit_costs = parse_list("--unit-costs", argv[++i], 0);
    } else if (arg == "--splits" && has_value) {
      splits_list = parse_list("--splits", argv[++i], 0);
    } else if (arg == "--sequential-pages") {
      sequential_pages = true;
    } else if (arg == "--interleaved-pages") {
      interleaved_pages = true;
    } else if (arg == "--pool-entries" && has_value) {
      // Past parse_list's bound of 2^20 (an engine's pool holds millions of entries a layer).
      const char* text = argv[++i];
      char* end = nullptr;
      min_pool_entries = std::strtoull(text, &end, 10);
      if (!std::isdigit(static_cast<unsigned char>(text[0])) || *end != '\0' || min_pool_entries > (size_t(1) << 32)) {
        std::fprintf(stderr, "--pool-entries: expected an entry count up to 2^32, got '%.100s'\n", text);
        return 2;
      }
    } else if (arg == "--no-prefill") {
      prefill = false;
    } else {
      std::fprintf(stderr,
                   "usage: attention_bench [--cache bf16|fp8] [--rows 16,64] [--blocks 16,256] [--batches 1,64,256] "
                   "[--contexts 1024,4096] [--items 0,4] [--balanced 0,1] [--splits 0,2] "
                   "[--sequential-pages | --interleaved-pages] "
                   "[--pool-entries N] [--no-prefill]  (bad argument '%.100s')\n",
                   argv[i]);
      return 2;
    }
  }
  if (sequential_pages && interleaved_pages) {
    std::fprintf(stderr, "--sequential-pages and --interleaved-pages are two page orders: give one\n");
    return 2;
  }
  const int sms = print_device("");

  // Copy ceiling: 1 GiB device-to-device, bytes read + written.
  const double copy_gbs = measure_copy_gbs(20);

  const int num_heads = 32, num_kv_heads = 8, D = 128;
  // One pool large enough for the largest case (256 x 4K entries: 4.3 GB of bf16 K+V), plus a
  // spare page of the largest page size.
  const size_t max_entries = size_t(*std::max_element(batches.begin(), batches.end())) *
                             *std::max_element(contexts.begin(), contexts.end());
  const size_t pool_entries = std::max({max_entries, size_t(256) * 4096, min_pool_entries}) +
                              size_t(*std::max_element(blocks.begin(), blocks.end())) + 4096;
  const size_t entry_bytes = size_t(num_kv_heads) * D * 2;  // one entry of K (or V), all heads
  __nv_bfloat16 *k_cache, *v_cache;
  CK(cudaMalloc(&k_cache, pool_entries * entry_bytes));
  CK(cudaMalloc(&v_cache, pool_entries * entry_bytes));
  fill_random<<<4096, 256>>>(k_cache, pool_entries * entry_bytes / 2, 1);
  fill_random<<<4096, 256>>>(v_cache, pool_entries * entry_bytes / 2, 2);
  // The FP8 pool: codes at the bf16 pool's element offsets (in the same buffers), one scale per
  // (entry, KV head).
  const size_t head_vectors = pool_entries * num_kv_heads;
  uint8_t* k_codes = reinterpret_cast<uint8_t*>(k_cache);
  uint8_t* v_codes = reinterpret_cast<uint8_t*>(v_cache);
  float *k_scales, *v_scales;
  CK(cudaMalloc(&k_scales, head_vectors * sizeof(float)));
  CK(cudaMalloc(&v_scales, head_vectors * sizeof(float)));
  fill_codes<<<4096, 256>>>(k_codes, head_vectors * D, 5);
  fill_codes<<<4096, 256>>>(v_codes, head_vectors * D, 6);
  fill_value<<<1024, 256>>>(k_scales, head_vectors, 0.01f);
  fill_value<<<1024, 256>>>(v_scales, head_vectors, 0.02f);
  CK(cudaGetLastError());
  // A launch's arguments over the pool (bf16 or FP8), with random queries and an output of its own
  // (the caller frees args.q and args.out) for `seqs` sequences of `tokens` query tokens in all.
  auto pool_args = [&](int seqs, int tokens, int block_size, bool fp8, unsigned seed) {
    __nv_bfloat16 *q, *out;
    CK(cudaMalloc(&q, size_t(tokens) * num_heads * D * 2));
    CK(cudaMalloc(&out, size_t(tokens) * num_heads * D * 2));
    fill_random<<<256, 256>>>(q, size_t(tokens) * num_heads * D, seed);
    AttentionArgs args;
    args.shape = {seqs, tokens, num_heads, num_kv_heads, D, block_size};
    args.softmax_scale = 0.08838834764f;
    args.q = q;
    args.out = out;
    if (fp8) {
      args.k_codes = k_codes;
      args.v_codes = v_codes;
      args.k_scales = k_scales;
      args.v_scales = v_scales;
    } else {
      args.k_cache = k_cache;
      args.v_cache = v_cache;
    }
    return args;
  };

  // Split counters for the largest batch (zero; every launch leaves them zero).
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const long long num_counters = split_counter_count({max_batch, max_batch, num_heads, num_kv_heads, D, 1});
  int* counters = nullptr;
  CK(cudaMalloc(&counters, sizeof(int) * num_counters));
  CK(cudaMemset(counters, 0, sizeof(int) * num_counters));
  std::printf("%5s %4s %6s %6s %6s %7s %5s %5s %4s %10s %10s %8s %10s\n", "cache", "rows", "block", "batch", "ctx",
              "splits", "items", "ctas", "unit", "time_us", "GB/s", "of_copy", "single_us");
  std::mt19937 rng(42);
  for (bool fp8 : caches)
  for (int rows : rows_list)
  for (int block_size : blocks)
    for (int batch : batches)
      for (int ctx : contexts)
      for (int items : items_list)
      for (int balanced : balanced_list)
      for (int unit_cost : unit_costs)
      for (int forced_splits : splits_list) {
        const int pages_per_seq = (ctx + block_size - 1) / block_size;
        const int pool_pages = static_cast<int>(pool_entries / block_size) - 1;
        const size_t kv_bytes =
            size_t(batch) * ctx * num_kv_heads * (fp8 ? D + sizeof(float) : D * sizeof(__nv_bfloat16)) * 2;
        // Rotate among page tables that together cover >= 400 MB (past L2), within the pool.
        int rotations = static_cast<int>(std::min<size_t>(16, (size_t(400) << 20) / kv_bytes + 1));
        rotations = std::max(1, std::min(rotations, pool_pages / (batch * pages_per_seq)));
        std::vector<int32_t> ids(pool_pages);
        std::iota(ids.begin(), ids.end(), 1);
        if (interleaved_pages) {
          // Each rotation's batch x pages_per_seq ids: sequence i's page k at k * batch + i.
          const std::vector<int32_t> pool_order(ids);
          for (size_t base = 0; base + size_t(batch) * pages_per_seq <= ids.size(); base += size_t(batch) * pages_per_seq)
            for (int i = 0; i < batch; ++i)
              for (int k = 0; k < pages_per_seq; ++k)
                ids[base + size_t(i) * pages_per_seq + k] = pool_order[base + size_t(k) * batch + i];
        } else if (!sequential_pages) {
          std::shuffle(ids.begin(), ids.end(), rng);
        }
        std::vector<int32_t*> d_indices(rotations);
        for (int r = 0; r < rotations; ++r) {
          CK(cudaMalloc(&d_indices[r], sizeof(int32_t) * batch * pages_per_seq));
          CK(cudaMemcpy(d_indices[r], ids.data() + size_t(r) * batch * pages_per_seq,
                        sizeof(int32_t) * batch * pages_per_seq, cudaMemcpyHostToDevice));
        }
        const DecodeRows decode_rows = upload_decode_rows(batch, ctx, pages_per_seq);
        AttentionArgs args = pool_args(batch, batch, block_size, fp8, 3);
        args.q_indptr = decode_rows.q_indptr;
        args.page_indptr = decode_rows.page_indptr;
        args.kv_len = decode_rows.kv_len;
        args.split_counters = counters;
        AttentionPlan plan = with_query_rows(plan_paged_attention(args.shape, ctx, sms), args.shape, rows);
        if (forced_splits > 0) {  // --splits (no balanced grid: it shares tiles out instead)
          plan = with_kv_splits(plan, ctx, forced_splits);
          plan.stream_ctas = 0;
        }
        if (items >= 0) plan.items_per_cta = items;  // --items: the FP8 decode kernel's items per CTA
        if (balanced != 1) plan.stream_ctas = balanced;  // --balanced
        if (unit_cost >= 0) plan.stream_unit_cost = unit_cost;
        const int ctas = fp8 && rows == 16 && plan.items_per_cta > 0 ? plan.stream_ctas : 0;
        const size_t ws_bytes = paged_attention_workspace_bytes(plan, args.shape);
        void* ws = nullptr;
        if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
        auto body = [&](int i) {
          args.page_indices = d_indices[i % rotations];
          CK(paged_attention(args, plan, ws, ws_bytes, nullptr));
        };
        for (int i = 0; i < 5; ++i) body(i);
        CK(cudaDeviceSynchronize());
        // GPU time: 20 calls back to back per timed region (no idle gaps between launches);
        // single: one call alone between events, host launch overhead included (no graph).
        constexpr int kBackToBack = 20;
        const float ms = median_ms([&](int i) { for (int r = 0; r < kBackToBack; ++r) body(i * kBackToBack + r); }, 15) /
                         kBackToBack;
        const float single_ms = median_ms(body, 30);
        const double bytes = double(kv_bytes) + 2.0 * batch * num_heads * D * 2;
        const double gbs = bytes / ms / 1e6;
        std::printf("%5s %4d %6d %6d %6d %7d %5d %5d %4d %10.1f %10.0f %7.0f%% %10.1f\n", fp8 ? "fp8" : "bf16", rows,
                    block_size, batch, ctx, plan.num_splits, plan.items_per_cta, ctas, plan.stream_unit_cost, ms * 1e3,
                    gbs, 100.0 * gbs / copy_gbs, single_ms * 1e3);
        for (auto p : d_indices) CK(cudaFree(p));
        free_decode_rows(decode_rows);
        CK(cudaFree(const_cast<__nv_bfloat16*>(args.q)));
        CK(cudaFree(args.out));
        if (ws) CK(cudaFree(ws));
      }

  // Prefill, for each cache: one 4096-token causal prompt, and eight of 1,000 (a max-load mixed
  // step's prompt part at 1000 -> 1000); FLOPs 4 * heads * D * n^2 / 2 a prompt.
  if (prefill) {
    const int block_size = 16;
    for (bool fp8 : caches)
      for (const auto& [prompts, n] : {std::pair{1, 4096}, std::pair{8, 1000}}) {
        const int pages_each = (n + block_size - 1) / block_size, tokens = prompts * n;
        std::vector<int32_t> ids(static_cast<size_t>(prompts) * pages_each);
        std::iota(ids.begin(), ids.end(), 1);
        std::shuffle(ids.begin(), ids.end(), rng);
        std::vector<int32_t> q_indptr{0}, page_indptr{0}, kv_len;
        for (int i = 0; i < prompts; ++i) {
          q_indptr.push_back(q_indptr.back() + n);
          page_indptr.push_back(page_indptr.back() + pages_each);
          kv_len.push_back(n);
        }
        int32_t *d_qi, *d_pi, *d_idx, *d_kv;
        CK(cudaMalloc(&d_qi, q_indptr.size() * 4)); CK(cudaMalloc(&d_pi, page_indptr.size() * 4));
        CK(cudaMalloc(&d_kv, kv_len.size() * 4)); CK(cudaMalloc(&d_idx, ids.size() * 4));
        CK(cudaMemcpy(d_qi, q_indptr.data(), q_indptr.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_pi, page_indptr.data(), page_indptr.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_kv, kv_len.data(), kv_len.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_idx, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
        AttentionArgs args = pool_args(prompts, tokens, block_size, fp8, 4);
        args.q_indptr = d_qi; args.page_indptr = d_pi; args.page_indices = d_idx; args.kv_len = d_kv;
        const AttentionPlan plan = plan_paged_attention(args.shape, n, sms);
        const size_t ws_bytes = paged_attention_workspace_bytes(plan, args.shape);
        void* ws = nullptr;
        if (ws_bytes) CK(cudaMalloc(&ws, ws_bytes));
        auto body = [&](int) { CK(paged_attention(args, plan, ws, ws_bytes, nullptr)); };
        for (int i = 0; i < 3; ++i) body(i);
        CK(cudaDeviceSynchronize());
        const float ms = median_ms(body, 20);
        const double flops = 4.0 * num_heads * D * double(n) * n / 2 * prompts;
        std::printf("prefill %s %d x %d tokens causal: %.3f ms, %.1f TFLOP/s (splits %d)\n", fp8 ? "fp8" : "bf16",
                    prompts, n, ms, flops / ms / 1e9, plan.num_splits);
        for (void* b : {static_cast<void*>(d_qi), static_cast<void*>(d_pi), static_cast<void*>(d_kv),
                        static_cast<void*>(d_idx), static_cast<void*>(const_cast<__nv_bfloat16*>(args.q)), static_cast<void*>(args.out), ws})
          if (b != nullptr) CK(cudaFree(b));
      }
  }
  CK(cudaFree(counters));
  CK(cudaDeviceSynchronize());
  return 0;
}
