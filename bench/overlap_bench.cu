// Whether the max-load decode step could overlap its attention (memory-bound) with its GEMMs
// (compute-bound at batch 1024) by running two halves of the batch on two streams: half A's
// attention beside half B's projections, then the other way round (nano-batching). Llama-3.1-8B
// shape: 32 query / 8 KV heads of 128, FP8 KV in pages of 256, FP8 weights (cuBLASLt through
// Fp8Gemm, the engine's path; quantize kernels left out: they are the same either way).
// For each batch and context it times, in CUDA graphs of kLayers layers:
//   attention of the whole batch + the four projections of the whole batch, one stream (today);
//   two halves, each layer: [attention(A) | projections(B)] then [attention(B) | projections(A)],
//   each bracket two streams forked and joined (the nano-batched step);
//   and each part alone, full and half.
// Page tables and weights rotate over copies that together exceed L2, as in a decode step.
// Build: cmake --build build --target overlap_bench (CUDA builds). Run: overlap_bench
//        [--batches 512,1024] [--contexts 640,1024]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/paged_attention.h"
#include "bench_util.cuh"

using namespace origami::cuda;

namespace {

constexpr int kLayers = 8;
constexpr int kNumHeads = 32, kNumKvHeads = 8, kD = 128, kBlock = 256;
constexpr int kWeightCopies = 4;  // 4 x 218 MB of FP8 weights: past the 50 MB L2

struct Projection {
  int n, k;
};
constexpr Projection kProjections[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};

// GPU time of `body` captured in a graph on `s0` (which may fork onto other streams), median of 15
// replays. s0 is a blocking stream, so median_ms's events on the legacy default stream bracket it.
template <typename F>
float graph_ms(cudaStream_t s0, F&& body) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(s0, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s0));
  CK(cudaStreamSynchronize(s0));
  const float ms = median_ms([&](int) { CK(cudaGraphLaunch(exec, s0)); }, 15);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches = {512, 1024}, contexts = {640, 1024};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--batches" && i + 1 < argc) {
      batches = parse_list("--batches", argv[++i]);
    } else if (arg == "--contexts" && i + 1 < argc) {
      contexts = parse_list("--contexts", argv[++i]);
    } else {
      std::fprintf(stderr, "usage: overlap_bench [--batches 512,1024] [--contexts 640,1024]  (bad argument '%.100s')\n",
                   argv[i]);
      return 2;
    }
  }
  const int sms = print_device("OVERLAP ");
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());

  // FP8 KV pool: pages of [2 (K, V) kept apart as two arrays][8 heads][256][128] codes + scales,
  // enough for the largest case twice over (so layers rotate over two sets of pages).
  const int pages_per_seq_max = (max_ctx + kBlock - 1) / kBlock;
  const size_t pool_pages = size_t(2) * max_batch * pages_per_seq_max + 1;
  const size_t page_elems = size_t(kNumKvHeads) * kBlock * kD;
  uint8_t *k_codes, *v_codes;
  float *k_scales, *v_scales;
  CK(cudaMalloc(&k_codes, pool_pages * page_elems));
  CK(cudaMalloc(&v_codes, pool_pages * page_elems));
  CK(cudaMalloc(&k_scales, pool_pages * page_elems / kD * sizeof(float)));
  CK(cudaMalloc(&v_scales, pool_pages * page_elems / kD * sizeof(float)));
  fill_codes<<<4096, 256>>>(k_codes, pool_pages * page_elems, 1);
  fill_codes<<<4096, 256>>>(v_codes, pool_pages * page_elems, 2);
  fill_value<<<1024, 256>>>(k_scales, pool_pages * page_elems / kD, 0.01f);
  fill_value<<<1024, 256>>>(v_scales, pool_pages * page_elems / kD, 0.02f);

  // FP8 weights of one layer, kWeightCopies times; activations for the largest batch.
  std::vector<uint8_t*> weights[4];
  std::vector<float*> wscales(4);
  size_t widest_in = 0, widest_out = 0;
  for (int p = 0; p < 4; ++p) {
    const Projection pr = kProjections[p];
    widest_in = std::max<size_t>(widest_in, pr.k);
    widest_out = std::max<size_t>(widest_out, pr.n);
    for (int c = 0; c < kWeightCopies; ++c) {
      uint8_t* w;
      CK(cudaMalloc(&w, size_t(pr.n) * pr.k));
      fill_codes<<<4096, 256>>>(w, size_t(pr.n) * pr.k, 10 + p * kWeightCopies + c);
      weights[p].push_back(w);
    }
    CK(cudaMalloc(&wscales[p], pr.n * sizeof(float)));
    fill_value<<<64, 256>>>(wscales[p], pr.n, 0.01f);
  }
  uint8_t* xq;
  float *xs, *acc;
  __nv_bfloat16 *y, *q, *attn_out;
  CK(cudaMalloc(&xq, size_t(max_batch) * widest_in));
  fill_codes<<<4096, 256>>>(xq, size_t(max_batch) * widest_in, 3);
  CK(cudaMalloc(&xs, max_batch * sizeof(float)));
  fill_value<<<64, 256>>>(xs, max_batch, 0.01f);
  CK(cudaMalloc(&acc, size_t(2) * max_batch * widest_out * sizeof(float)));
  CK(cudaMalloc(&y, size_t(max_batch) * widest_out * 2));
  CK(cudaMalloc(&q, size_t(max_batch) * kNumHeads * kD * 2));
  CK(cudaMalloc(&attn_out, size_t(max_batch) * kNumHeads * kD * 2));
  fill_random<<<1024, 256>>>(q, size_t(max_batch) * kNumHeads * kD, 4);
  CK(cudaDeviceSynchronize());

  cudaStream_t s0, s1;
  CK(cudaStreamCreate(&s0));  // blocking: synchronised with the default stream median_ms times on
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  std::vector<cudaEvent_t> events(4 * kLayers + 4);
  for (cudaEvent_t& e : events) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  // One Fp8Gemm per stream: each owns the cuBLASLt workspace its calls use.
  Fp8Gemm gemm, gemm1;
  std::mt19937 rng(7);

  std::printf("OVERLAP %6s %5s | %9s %9s %9s | %9s %9s | %9s %9s %7s\n", "batch", "ctx", "attn", "gemms", "serial",
              "attn/2", "gemms/2", "nano", "nano-1s", "speedup");
  for (int batch : batches)
    for (int ctx : contexts) {
      const int half = batch / 2;
      const int pages_per_seq = (ctx + kBlock - 1) / kBlock;
      // Two sets of page tables (layers alternate), pages shuffled over the pool.
      std::vector<int32_t> ids(pool_pages - 1);
      std::iota(ids.begin(), ids.end(), 1);
      std::shuffle(ids.begin(), ids.end(), rng);
      int32_t* d_indices[2];
      for (int r = 0; r < 2; ++r) {
        CK(cudaMalloc(&d_indices[r], sizeof(int32_t) * batch * pages_per_seq));
        CK(cudaMemcpy(d_indices[r], ids.data() + size_t(r) * batch * pages_per_seq, sizeof(int32_t) * batch * pages_per_seq,
                      cudaMemcpyHostToDevice));
      }
      const DecodeRows decode_rows = upload_decode_rows(batch, ctx, pages_per_seq);
      // The attention of `n` sequences starting at sequence `first`: a view, with q and out
      // offset by its first row and its per-sequence arrays by its first sequence (q_indptr is
      // 0, 1, 2, ... for any decode batch, so the whole batch's array serves; page_indptr values
      // index page_indices absolutely).
      auto make_args = [&](int first, int n) {
        AttentionArgs a;
        a.shape = {n, n, kNumHeads, kNumKvHeads, kD, kBlock};
        a.softmax_scale = 0.08838834764f;
        a.q = q + size_t(first) * kNumHeads * kD;
        a.out = attn_out + size_t(first) * kNumHeads * kD;
        a.k_codes = k_codes;
        a.v_codes = v_codes;
        a.k_scales = k_scales;
        a.v_scales = v_scales;
        a.q_indptr = decode_rows.q_indptr;
        a.page_indptr = decode_rows.page_indptr + first;
        a.kv_len = decode_rows.kv_len + first;
        return a;
      };
      const AttentionArgs full_args = make_args(0, batch);
      const AttentionArgs half_args[2] = {make_args(0, half), make_args(half, batch - half)};
      const AttentionPlan full_plan = plan_paged_attention(full_args.shape, ctx, sms);
      const AttentionPlan half_plan = plan_paged_attention(half_args[0].shape, ctx, sms);
      const size_t ws_full = paged_attention_workspace_bytes(full_plan, full_args.shape);
      const size_t ws_half = paged_attention_workspace_bytes(half_plan, half_args[0].shape);
      void *ws0 = nullptr, *ws1 = nullptr;
      if (ws_full) CK(cudaMalloc(&ws0, ws_full));
      if (ws_half) CK(cudaMalloc(&ws1, ws_half));

      auto attention = [&](const AttentionArgs& base, const AttentionPlan& plan, void* ws, size_t ws_bytes, int layer,
                           cudaStream_t s) {
        AttentionArgs a = base;
        a.page_indices = d_indices[layer % 2];
        CK(paged_attention(a, plan, ws, ws_bytes, s));
      };
      // The four projections of `m` rows starting at row `first` (x rows and outputs offset).
      auto projections = [&](Fp8Gemm& g, int first, int m, int layer, float* scratch, cudaStream_t s) {
        for (int p = 0; p < 4; ++p) {
          const Projection pr = kProjections[p];
          g.linear(xq + size_t(first) * pr.k, xs + first, m, pr.k, weights[p][layer % kWeightCopies], wscales[p], pr.n,
                   y + size_t(first) * pr.n, scratch, s);
        }
      };
      float* acc1 = acc + size_t(max_batch) * widest_out;
      // Plan every GEMM shape outside capture.
      projections(gemm, 0, batch, 0, acc, s0);
      projections(gemm, 0, half, 0, acc, s0);
      projections(gemm1, half, batch - half, 0, acc1, s1);
      projections(gemm, half, batch - half, 0, acc, s0);
      projections(gemm1, 0, half, 0, acc1, s1);
      CK(cudaDeviceSynchronize());

      const float t_attn = graph_ms(s0, [&] {
        for (int l = 0; l < kLayers; ++l) attention(full_args, full_plan, ws0, ws_full, l, s0);
      }) / kLayers;
      const float t_gemm = graph_ms(s0, [&] {
        for (int l = 0; l < kLayers; ++l) projections(gemm, 0, batch, l, acc, s0);
      }) / kLayers;
      const float t_serial = graph_ms(s0, [&] {
        for (int l = 0; l < kLayers; ++l) {
          attention(full_args, full_plan, ws0, ws_full, l, s0);
          projections(gemm, 0, batch, l, acc, s0);
        }
      }) / kLayers;
      const float t_attn_half = graph_ms(s0, [&] {
        for (int l = 0; l < kLayers; ++l) attention(half_args[0], half_plan, ws0, ws_half, l, s0);
      }) / kLayers;
      const float t_gemm_half = graph_ms(s0, [&] {
        for (int l = 0; l < kLayers; ++l) projections(gemm, 0, half, l, acc, s0);
      }) / kLayers;
      // Nano-batched: per layer two phases, each the attention of one half on s0 beside the
      // projections of the other on s1, joined before the next phase.
      auto nano = [&](bool two_streams) {
        int e = 0;
        for (int l = 0; l < kLayers; ++l)
          for (int phase = 0; phase < 2; ++phase) {
            const int a_half = phase, g_half = 1 - phase;
            const int g_first = g_half == 0 ? 0 : half, g_rows = g_half == 0 ? half : batch - half;
            cudaStream_t gs = two_streams ? s1 : s0;
            if (two_streams) {
              CK(cudaEventRecord(events[e], s0));
              CK(cudaStreamWaitEvent(s1, events[e++], 0));
            }
            attention(half_args[a_half], half_plan, a_half == 0 ? ws0 : ws1, ws_half, l, s0);
            projections(two_streams ? gemm1 : gemm, g_first, g_rows, l, two_streams ? acc1 : acc, gs);
            if (two_streams) {
              CK(cudaEventRecord(events[e], s1));
              CK(cudaStreamWaitEvent(s0, events[e++], 0));
            }
          }
      };
      const float t_nano = graph_ms(s0, [&] { nano(true); }) / kLayers;
      const float t_nano_one = graph_ms(s0, [&] { nano(false); }) / kLayers;
      std::printf("OVERLAP %6d %5d | %9.4f %9.4f %9.4f | %9.4f %9.4f | %9.4f %9.4f %6.3fx\n", batch, ctx, t_attn, t_gemm,
                  t_serial, t_attn_half, t_gemm_half, t_nano, t_nano_one, t_serial / t_nano);
      for (int r = 0; r < 2; ++r) CK(cudaFree(d_indices[r]));
      free_decode_rows(decode_rows);
      if (ws0) CK(cudaFree(ws0));
      if (ws1) CK(cudaFree(ws1));
    }
  std::printf("OVERLAP ms per layer (median of 15 graph replays of %d layers): serial = attention + projections of "
              "the whole batch on one stream; nano = two halves, attention of one beside projections of the other "
              "on two streams; nano-1s = the same launches on one stream\n",
              kLayers);
  return 0;
}
