// Whether the max-load decode step could overlap its attention (memory-bound) with its GEMMs
// (compute-bound at batch 1024) by running two halves of the batch on two streams: half A's
// attention beside half B's projections, then the other way round (nano-batching). Llama-3.1-8B
// shape: 32 query / 8 KV heads of 128, FP8 KV in pages of --block (256), FP8 weights (cuBLASLt through
// Fp8Gemm, the engine's path; quantize kernels left out: they are the same either way).
// For each batch and context it times, in CUDA graphs of kLayers layers:
//   attention of the whole batch + the four projections of the whole batch, one stream (today);
//   two halves, each layer: [attention(A) | projections(B)] then [attention(B) | projections(A)],
//   each bracket two streams forked and joined (the nano-batched step);
//   and each part alone, full and half.
// Page tables and weights rotate over copies that together exceed L2, as in a decode step.
// With --attn-sms N[,M..], the same again with the SMs split (sm_partition.h, green contexts):
// attention on a set of N SMs (rounded up to the GPU's granularity), the projections on the rest
// (cuBLASLt told their count): each part alone on its set, full batch and half, then the
// nano-batched step with each half's attention and the other half's projections on their own
// SMs. Before the tables it reports where each set's kernels ran and whether a graph captured
// across the two sets keeps them there (else the partitioned rows are timed eagerly).
// Build: cmake --build build --target overlap_bench (CUDA builds). Run: overlap_bench
//        [--batches 512,1024] [--contexts 640,1024] [--block 256] [--attn-sms 66,80,96]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <set>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/fp8_gemm.h"
#include "backend/cuda/paged_attention.h"
#include "backend/cuda/sm_partition.h"
#include "bench_util.cuh"

using namespace origami::cuda;

namespace {

constexpr int kLayers = 8;
constexpr int kNumHeads = 32, kNumKvHeads = 8, kD = 128;
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

// GPU time of `body`, enqueued on `s` (forking onto other streams and joining back), between two
// events on `s`: captured in a graph when `graph`, else launched eagerly; median of 15.
template <typename F>
float stream_ms(cudaStream_t s, bool graph, F&& body) {
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&exec, g, 0));
    CK(cudaGraphDestroy(g));
  }
  auto run = [&] {
    if (exec != nullptr) {
      CK(cudaGraphLaunch(exec, s));
    } else {
      body();
    }
  };
  for (int i = 0; i < 3; ++i) run();
  CK(cudaStreamSynchronize(s));
  const float ms = median_ms([&](int) { run(); }, 15, s);
  if (exec != nullptr) CK(cudaGraphExecDestroy(exec));
  return ms;
}

// The SMs a kernel on `s` ran on (sms_used, three CTAs per SM of the GPU); exits on an error.
std::set<int> sms_used_or_exit(cudaStream_t s, int gpu_sms) {
  auto used = sms_used(s, 3 * gpu_sms);
  if (!used) {
    std::fprintf(stderr, "%s\n", used.status().message().c_str());
    std::exit(1);
  }
  return *used;
}

// Whether a graph captured on set 0's stream, forking to set 1's, can be built and replayed, and
// whether its kernels stay on their sets. Errors are reported, not fatal: this decides how the
// partitioned rows are timed.
bool probe_partition_graph(const SmPartition& p, int gpu_sms) {
  cudaStream_t s0 = p.stream(0), s1 = p.stream(1);
  const int ctas = 3 * gpu_sms;
  int *d0 = nullptr, *d1 = nullptr;
  CK(cudaMalloc(&d0, ctas * sizeof(int)));
  CK(cudaMalloc(&d1, ctas * sizeof(int)));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaStreamBeginCapture(s0, cudaStreamCaptureModeGlobal);
  if (err == cudaSuccess) {
    cudaError_t body = cudaEventRecord(fork, s0);
    if (body == cudaSuccess) body = cudaStreamWaitEvent(s1, fork, 0);
    if (body == cudaSuccess) body = record_sm_ids(d0, ctas, s0);
    if (body == cudaSuccess) body = record_sm_ids(d1, ctas, s1);
    if (body == cudaSuccess) body = cudaEventRecord(join, s1);
    if (body == cudaSuccess) body = cudaStreamWaitEvent(s0, join, 0);
    err = cudaStreamEndCapture(s0, &g);
    if (err == cudaSuccess) err = body;
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
  if (err == cudaSuccess) err = cudaGraphLaunch(exec, s0);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s0);
  bool kept = false;
  if (err == cudaSuccess) {
    std::vector<int> a(ctas), b(ctas);
    CK(cudaMemcpy(a.data(), d0, ctas * sizeof(int), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), d1, ctas * sizeof(int), cudaMemcpyDeviceToHost));
    const std::set<int> sa(a.begin(), a.end()), sb(b.begin(), b.end());
    kept = static_cast<int>(sa.size()) <= p.sms(0) && static_cast<int>(sb.size()) <= p.sms(1);
    for (int sm : sa) kept = kept && sb.count(sm) == 0;
    std::printf("OVERLAP-SM graph across the sets: replayed; set 0's kernel on %zu SMs, set 1's on %zu: %s\n", sa.size(),
                sb.size(), kept ? "the sets are kept" : "NOT kept (timed eagerly)");
  } else {
    std::printf("OVERLAP-SM graph across the sets: %s (timed eagerly)\n", cudaGetErrorString(err));
    cudaGetLastError();  // clear it
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (g != nullptr) cudaGraphDestroy(g);
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  CK(cudaFree(d0));
  CK(cudaFree(d1));
  return kept;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches = {512, 1024}, contexts = {640, 1024}, attn_sms;
  int block = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--batches" && i + 1 < argc) {
      batches = parse_list("--batches", argv[++i]);
    } else if (arg == "--contexts" && i + 1 < argc) {
      contexts = parse_list("--contexts", argv[++i]);
    } else if (arg == "--attn-sms" && i + 1 < argc) {
      attn_sms = parse_list("--attn-sms", argv[++i]);
    } else if (arg == "--block" && i + 1 < argc) {
      const std::vector<int> b = parse_list("--block", argv[++i]);
      block = b[0];
      if (b.size() != 1 || (block & (block - 1)) != 0 || block < 16) {
        std::fprintf(stderr, "--block: one power of two of at least 16\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "usage: overlap_bench [--batches 512,1024] [--contexts 640,1024] [--block 256] [--attn-sms 66,80]  "
                   "(bad argument '%.100s')\n",
                   argv[i]);
      return 2;
    }
  }
  const int sms = print_device("OVERLAP ");
  // The SM partitions: where each set's kernels run, and whether graphs keep them there.
  std::vector<SmPartition> parts;
  std::vector<bool> part_graphs;
  for (int want : attn_sms) {
    auto p = SmPartition::split(0, want);
    if (!p) {
      std::fprintf(stderr, "--attn-sms %d: %s\n", want, p.status().message().c_str());
      return 2;
    }
    const std::set<int> a = sms_used_or_exit(p->stream(0), sms), b = sms_used_or_exit(p->stream(1), sms);
    bool disjoint = true;
    for (int sm : a) disjoint = disjoint && b.count(sm) == 0;
    std::printf("OVERLAP-SM asked %d: sets of %d + %d SMs; a kernel on each ran on %zu and %zu SMs, %s\n", want,
                p->sms(0), p->sms(1), a.size(), b.size(), disjoint ? "disjoint" : "OVERLAPPING");
    part_graphs.push_back(probe_partition_graph(*p, sms));
    parts.push_back(std::move(p).value());
  }
  std::vector<std::unique_ptr<Fp8Gemm>> part_gemms;  // one per partition: its plans target set 1's SMs
  for (const SmPartition& p : parts) {
    part_gemms.push_back(std::make_unique<Fp8Gemm>());
    part_gemms.back()->set_sm_count_target(p.sms(1));
  }
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());

  // FP8 KV pool: pages of [2 (K, V) kept apart as two arrays][8 heads][256][128] codes + scales,
  // enough for the largest case twice over (so layers rotate over two sets of pages).
  const int pages_per_seq_max = (max_ctx + block - 1) / block;
  const size_t pool_pages = size_t(2) * max_batch * pages_per_seq_max + 1;
  const size_t page_elems = size_t(kNumKvHeads) * block * kD;
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
      const int pages_per_seq = (ctx + block - 1) / block;
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
        a.shape = {n, n, kNumHeads, kNumKvHeads, kD, block};
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

      // The same with the SMs split: attention on set 0, projections on set 1.
      for (size_t pi = 0; pi < parts.size(); ++pi) {
        const SmPartition& part = parts[pi];
        Fp8Gemm& pg = *part_gemms[pi];
        const bool graph = part_graphs[pi];
        cudaStream_t sa = part.stream(0), sg = part.stream(1);
        const AttentionPlan pfull = plan_paged_attention(full_args.shape, ctx, part.sms(0));
        const AttentionPlan phalf = plan_paged_attention(half_args[0].shape, ctx, part.sms(0));
        const size_t pws_full = paged_attention_workspace_bytes(pfull, full_args.shape);
        const size_t pws_half = paged_attention_workspace_bytes(phalf, half_args[0].shape);
        void *pws0 = nullptr, *pws1 = nullptr, *pws2 = nullptr;
        if (pws_full) CK(cudaMalloc(&pws0, pws_full));
        if (pws_half) CK(cudaMalloc(&pws1, pws_half));
        if (pws_half) CK(cudaMalloc(&pws2, pws_half));
        // Plan the set's GEMM shapes outside capture.
        projections(pg, 0, batch, 0, acc1, sg);
        projections(pg, 0, half, 0, acc1, sg);
        projections(pg, half, batch - half, 0, acc1, sg);
        CK(cudaStreamSynchronize(sg));
        const float p_attn = stream_ms(sa, graph, [&] {
          for (int l = 0; l < kLayers; ++l) attention(full_args, pfull, pws0, pws_full, l, sa);
        }) / kLayers;
        const float p_attn_half = stream_ms(sa, graph, [&] {
          for (int l = 0; l < kLayers; ++l) attention(half_args[0], phalf, pws1, pws_half, l, sa);
        }) / kLayers;
        const float p_gemm = stream_ms(sg, graph, [&] {
          for (int l = 0; l < kLayers; ++l) projections(pg, 0, batch, l, acc1, sg);
        }) / kLayers;
        const float p_gemm_half = stream_ms(sg, graph, [&] {
          for (int l = 0; l < kLayers; ++l) projections(pg, 0, half, l, acc1, sg);
        }) / kLayers;
        const float p_nano = stream_ms(sa, graph, [&] {
          int e = 0;
          for (int l = 0; l < kLayers; ++l)
            for (int phase = 0; phase < 2; ++phase) {
              const int a_half = phase, g_half = 1 - phase;
              const int g_first = g_half == 0 ? 0 : half, g_rows = g_half == 0 ? half : batch - half;
              CK(cudaEventRecord(events[e], sa));
              CK(cudaStreamWaitEvent(sg, events[e++], 0));
              attention(half_args[a_half], phalf, a_half == 0 ? pws1 : pws2, pws_half, l, sa);
              projections(pg, g_first, g_rows, l, acc1, sg);
              CK(cudaEventRecord(events[e], sg));
              CK(cudaStreamWaitEvent(sa, events[e++], 0));
            }
        }) / kLayers;
        std::printf("OVERLAP-SM %6d %5d %4d+%-4d | %9.4f %9.4f | %9.4f %9.4f | %9.4f %6.3fx %s\n", batch, ctx, part.sms(0),
                    part.sms(1), p_attn, p_attn_half, p_gemm, p_gemm_half, p_nano, t_serial / p_nano,
                    graph ? "graph" : "eager");
        if (pws0) CK(cudaFree(pws0));
        if (pws1) CK(cudaFree(pws1));
        if (pws2) CK(cudaFree(pws2));
      }
      for (int r = 0; r < 2; ++r) CK(cudaFree(d_indices[r]));
      free_decode_rows(decode_rows);
      if (ws0) CK(cudaFree(ws0));
      if (ws1) CK(cudaFree(ws1));
    }
  std::printf("OVERLAP ms per layer (median of 15 graph replays of %d layers): serial = attention + projections of "
              "the whole batch on one stream; nano = two halves, attention of one beside projections of the other "
              "on two streams; nano-1s = the same launches on one stream\n",
              kLayers);
  if (!parts.empty())
    std::printf("OVERLAP-SM batch ctx attn+gemm SMs | attention of the batch, of half, on set 0 | projections of the "
                "batch, of half, on set 1 | nano with each on its set | serial (above) / nano | timed as\n");
  return 0;
}
