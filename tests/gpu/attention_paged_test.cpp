// The paged attention and KV-write kernels against a straightforward fp64 CPU twin, on random
// inputs with odd lengths, several page sizes and GQA ratios, shuffled page ids, and every plan
// shape (one split, many splits, a plan made for a longer context as a captured graph would use),
// over a bf16 cache and an FP8 one (E4M3 codes + a scale per row, the twin reading the same
// dequantized values).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kv_cache_write.h"
#include "backend/cuda/paged_attention.h"
#include "kv/kv_cache_dtype.h"

namespace origami::cuda {
namespace {

#define CK(call) ASSERT_EQ((call), cudaSuccess) << #call

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (ptr && !host.empty()) cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> h(count);
    cudaMemcpy(h.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = to_bf16(dist(rng));
  return v;
}

int num_sms() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}

struct SeqSpec {
  int kv_len;
  int q_len;
};

// A batch with its cache and page tables on host and device.
struct Case {
  AttentionShape shape;
  std::vector<SeqSpec> seqs;
  std::vector<int32_t> q_indptr, page_indptr, page_indices, kv_len;
  std::vector<uint16_t> q, k_cache, v_cache;  // bf16 bits
  float scale = 0.f;
  // FP8 cache: each row of k_cache / v_cache quantized (codes at the same element offsets, one
  // scale per row); kf / vf hold what reads see (bf16 values, or the dequantized codes).
  bool fp8 = false;
  std::vector<uint8_t> k_codes, v_codes;
  std::vector<float> k_scales, v_scales;
  std::vector<float> kf, vf;
};

// Quantizes every head_dim row of `cache` as the FP8 write kernel does (kv/kv_cache_dtype.h).
void quantize_rows(const std::vector<uint16_t>& cache, int head_dim, std::vector<uint8_t>* codes,
                   std::vector<float>* scales, std::vector<float>* values) {
  codes->resize(cache.size());
  values->resize(cache.size());
  scales->resize(cache.size() / head_dim);
  std::vector<float> row(head_dim);
  for (size_t r = 0; r < scales->size(); ++r) {
    const size_t at = r * head_dim;
    for (int d = 0; d < head_dim; ++d) row[d] = from_bf16(cache[at + d]);
    (*scales)[r] = quantize_head_vector_fp8(row.data(), head_dim, codes->data() + at);
    for (int d = 0; d < head_dim; ++d) (*values)[at + d] = kv_fp8_dequantize((*codes)[at + d], (*scales)[r]);
  }
}

Case make_case(const std::vector<SeqSpec>& seqs, int num_kv_heads, int group, int head_dim, int block_size,
               std::mt19937& rng, bool fp8 = false) {
  Case c;
  c.fp8 = fp8;
  c.seqs = seqs;
  c.shape.num_seqs = static_cast<int>(seqs.size());
  c.shape.num_kv_heads = num_kv_heads;
  c.shape.num_heads = num_kv_heads * group;
  c.shape.head_dim = head_dim;
  c.shape.block_size = block_size;
  c.q_indptr = {0};
  c.page_indptr = {0};
  int total_pages = 0;
  for (const auto& s : seqs) {
    c.q_indptr.push_back(c.q_indptr.back() + s.q_len);
    total_pages += (s.kv_len + block_size - 1) / block_size;
    c.page_indptr.push_back(total_pages);
    c.kv_len.push_back(s.kv_len);
  }
  c.shape.num_tokens = c.q_indptr.back();
  // Shuffled ids from a pool with spare pages (and block 0 unused, as the null block).
  const int num_blocks = total_pages + 5;
  std::vector<int32_t> ids(num_blocks - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.page_indices.assign(ids.begin(), ids.begin() + total_pages);
  const size_t cache_elems = static_cast<size_t>(num_blocks) * num_kv_heads * block_size * head_dim;
  c.k_cache = random_bf16(cache_elems, rng);
  c.v_cache = random_bf16(cache_elems, rng);
  c.q = random_bf16(static_cast<size_t>(c.shape.num_tokens) * c.shape.num_heads * head_dim, rng, 2.f);
  c.scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  if (fp8) {
    quantize_rows(c.k_cache, head_dim, &c.k_codes, &c.k_scales, &c.kf);
    quantize_rows(c.v_cache, head_dim, &c.v_codes, &c.v_scales, &c.vf);
  } else {
    for (uint16_t x : c.k_cache) c.kf.push_back(from_bf16(x));
    for (uint16_t x : c.v_cache) c.vf.push_back(from_bf16(x));
  }
  return c;
}

// fp64 twin: query j of sequence i sees entries 0 .. kv_len - q_len + j.
std::vector<double> reference(const Case& c) {
  const auto& s = c.shape;
  const int D = s.head_dim, group = s.num_heads / s.num_kv_heads;
  std::vector<double> out(static_cast<size_t>(s.num_tokens) * s.num_heads * D);
  std::vector<std::pair<int, int>> rows;  // (seq, token)
  for (int i = 0; i < s.num_seqs; ++i)
    for (int t = c.q_indptr[i]; t < c.q_indptr[i + 1]; ++t) rows.push_back({i, t});
  const long long num_work = static_cast<long long>(rows.size()) * s.num_heads;
#pragma omp parallel for schedule(dynamic, 4)
  for (long long w = 0; w < num_work; ++w) {
    const auto [seq, token] = rows[w / s.num_heads];
    const int head = static_cast<int>(w % s.num_heads), kv_head = head / group;
    const int q_len = c.q_indptr[seq + 1] - c.q_indptr[seq];
    const int j = token - c.q_indptr[seq];
    const int visible = c.kv_len[seq] - q_len + j + 1;
    const uint16_t* q = &c.q[(static_cast<size_t>(token) * s.num_heads + head) * D];
    std::vector<double> scores(visible);
    double mx = -INFINITY;
    auto entry = [&](const std::vector<float>& cache, int e) {
      const int page = c.page_indices[c.page_indptr[seq] + e / s.block_size];
      return &cache[((static_cast<size_t>(page) * s.num_kv_heads + kv_head) * s.block_size + e % s.block_size) * D];
    };
    for (int e = 0; e < visible; ++e) {
      const float* k = entry(c.kf, e);
      double dot = 0;
      for (int d = 0; d < D; ++d) dot += static_cast<double>(from_bf16(q[d])) * k[d];
      scores[e] = dot * c.scale;
      mx = std::max(mx, scores[e]);
    }
    double sum = 0;
    for (auto& x : scores) sum += (x = std::exp(x - mx));
    double* o = &out[(static_cast<size_t>(token) * s.num_heads + head) * D];
    for (int e = 0; e < visible; ++e) {
      const float* v = entry(c.vf, e);
      for (int d = 0; d < D; ++d) o[d] += scores[e] / sum * v[d];
    }
  }
  return out;
}

// Runs the kernel under `plan` (output poisoned first) and returns the relative L2 error;
// a NaN output (an unwritten element) returns infinity. `bits`: the output as computed.
// fused_merge: with split arrival counters (AttentionArgs::split_counters), launched twice on the
// same counters (the first launch must leave them zero for the second); they must be zero after.
// The launch run_on makes: the args of the case's buffers, a workspace of the size it asked for.
using Launch = std::function<cudaError_t(const AttentionArgs&, void* workspace, size_t workspace_bytes)>;

double run_on(const Case& c, size_t ws_bytes, const Launch& launch_fn, const std::vector<double>& ref,
              std::vector<uint16_t>* bits, bool fused_merge);

double run_and_compare(const Case& c, const AttentionPlan& plan, const std::vector<double>& ref,
                       std::vector<uint16_t>* bits = nullptr, bool fused_merge = false) {
  return run_on(
      c, paged_attention_workspace_bytes(plan, c.shape),
      [&](const AttentionArgs& args, void* ws, size_t bytes) { return paged_attention(args, plan, ws, bytes, nullptr); },
      ref, bits, fused_merge);
}

// run_and_compare's body for any launch.
double run_on(const Case& c, size_t ws_bytes, const Launch& launch_fn, const std::vector<double>& ref,
              std::vector<uint16_t>* bits, bool fused_merge) {
  DeviceBuffer<uint16_t> q(c.q), k(c.k_cache), v(c.v_cache);
  DeviceBuffer<uint8_t> k8(c.k_codes), v8(c.v_codes);
  DeviceBuffer<float> ks(c.k_scales), vs(c.v_scales);
  DeviceBuffer<int32_t> q_indptr(c.q_indptr), page_indptr(c.page_indptr), page_indices(c.page_indices), kv_len(c.kv_len);
  DeviceBuffer<uint16_t> out(ref.size());
  DeviceBuffer<unsigned char> ws(ws_bytes);
  if (cudaMemset(out.ptr, 0xff, ref.size() * 2) != cudaSuccess) return INFINITY;  // NaN poison
  if (ws_bytes && cudaMemset(ws.ptr, 0xff, ws_bytes) != cudaSuccess) return INFINITY;
  AttentionArgs args;
  args.shape = c.shape;
  args.softmax_scale = c.scale;
  args.q = reinterpret_cast<const __nv_bfloat16*>(q.ptr);
  args.out = reinterpret_cast<__nv_bfloat16*>(out.ptr);
  args.k_cache = reinterpret_cast<const __nv_bfloat16*>(k.ptr);
  args.v_cache = reinterpret_cast<const __nv_bfloat16*>(v.ptr);
  if (c.fp8) {
    args.k_cache = args.v_cache = nullptr;
    args.k_codes = k8.ptr;
    args.v_codes = v8.ptr;
    args.k_scales = ks.ptr;
    args.v_scales = vs.ptr;
  }
  args.q_indptr = q_indptr.ptr;
  args.page_indptr = page_indptr.ptr;
  args.page_indices = page_indices.ptr;
  args.kv_len = kv_len.ptr;
  const long long num_counters = split_counter_count(c.shape);
  DeviceBuffer<int32_t> counters(std::vector<int32_t>(fused_merge ? num_counters : 1, 0));
  if (fused_merge) args.split_counters = counters.ptr;
  cudaError_t launch = launch_fn(args, ws.ptr, ws_bytes);
  if (fused_merge && launch == cudaSuccess) {
    if (cudaMemset(out.ptr, 0xff, ref.size() * 2) != cudaSuccess) return INFINITY;
    launch = launch_fn(args, ws.ptr, ws_bytes);
  }
  EXPECT_EQ(launch, cudaSuccess) << cudaGetErrorString(launch);
  const cudaError_t sync = cudaDeviceSynchronize();
  EXPECT_EQ(sync, cudaSuccess) << cudaGetErrorString(sync);
  if (launch != cudaSuccess || sync != cudaSuccess) return INFINITY;
  if (fused_merge) {
    const std::vector<int32_t> left = counters.get();
    EXPECT_EQ(std::count(left.begin(), left.end(), 0), static_cast<long>(left.size()))
        << "a fused-merge launch left an arrival counter nonzero";
  }
  const auto got = out.get();
  if (bits) *bits = got;
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = from_bf16(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

int max_kv(const Case& c) { return *std::max_element(c.kv_len.begin(), c.kv_len.end()); }

// The plans every case runs under: the planner's own, a single split, many short splits, and a
// plan made for a longer context than the batch has.
std::vector<std::pair<std::string, AttentionPlan>> plans_for(const Case& c) {
  std::vector<std::pair<std::string, AttentionPlan>> plans;
  plans.push_back({"planned", plan_paged_attention(c.shape, max_kv(c), num_sms())});
  AttentionPlan single = plans.back().second;
  single.num_splits = 1;
  single.kv_chunk_size = 1 << 30;
  plans.push_back({"single", single});
  AttentionPlan many = single;
  many.kv_chunk_size = 128;
  many.num_splits = (max_kv(c) + 127) / 128;
  plans.push_back({"many", many});
  plans.push_back({"graph8192", plan_paged_attention(c.shape, 8192, num_sms())});
  // These exercise the splits: the balanced FP8 kernel (stream_ctas) is checked on its own below.
  for (auto& [name, plan] : plans) plan.stream_ctas = 0;
  // Each plan again on the other kernel (16 or 64 query rows a CTA): both are exact for any batch.
  const size_t n = plans.size();
  for (size_t i = 0; i < n; ++i) {
    const int other = plans[i].second.query_rows == 16 ? 64 : 16;
    plans.push_back({plans[i].first + "/" + std::to_string(other), with_query_rows(plans[i].second, c.shape, other)});
  }
  return plans;
}

void check_case(const std::vector<SeqSpec>& seqs, int num_kv_heads, int group, int head_dim, int block_size,
                std::mt19937& rng, bool fp8 = false) {
  const Case c = make_case(seqs, num_kv_heads, group, head_dim, block_size, rng, fp8);
  const auto ref = reference(c);
  for (const auto& [name, plan] : plans_for(c)) {
    std::vector<uint16_t> unfused;
    const double err = run_and_compare(c, plan, ref, &unfused);
    std::printf("  %s D=%3d group=%d block=%3d plan=%-18s rows=%2d splits=%3d items=%d  rel_err=%.2e\n",
                fp8 ? "fp8 " : "bf16", head_dim, group, block_size, name.c_str(), plan.query_rows, plan.num_splits,
                plan.items_per_cta, err);
    EXPECT_LT(err, 1e-2) << (fp8 ? "fp8" : "bf16") << " D=" << head_dim << " group=" << group
                         << " block=" << block_size << " plan=" << name;
    // The merge in the last CTA of each unit (the decode kernels; the wide kernel ignores the
    // counters) computes what the merge kernel does, bit for bit: the same sums in the same order.
    std::vector<uint16_t> fused;
    const double fused_err = run_and_compare(c, plan, ref, &fused, true);
    EXPECT_LT(fused_err, 1e-2) << "fused merge, plan " << name;
    EXPECT_TRUE(fused == unfused) << "the fused merge differs from the merge kernel: " << (fp8 ? "fp8" : "bf16")
                                  << " D=" << head_dim << " group=" << group << " block=" << block_size
                                  << " plan=" << name << " rows=" << plan.query_rows << " splits=" << plan.num_splits;
  }
  // FP8 decode batches: the streamed kernel (1 and 3 work items per CTA: a CTA's items then span
  // sequences, KV heads and splits) computes what the one-CTA-per-tile kernel (0) does, bit for
  // bit (the same tile math, the warps merged in the same order), under every plan.
  if (!fp8 || c.shape.num_tokens != c.shape.num_seqs) return;
  for (const auto& [name, base] : plans_for(c)) {
    if (base.query_rows != 16) continue;
    AttentionPlan one_per_tile = base;
    one_per_tile.items_per_cta = 0;
    std::vector<uint16_t> expected;
    EXPECT_LT(run_and_compare(c, one_per_tile, ref, &expected), 1e-2) << "items 0, plan " << name;
    for (int items : {1, 3}) {
      AttentionPlan plan = base;
      plan.items_per_cta = items;
      std::vector<uint16_t> got, fused;
      const double err = run_and_compare(c, plan, ref, &got);
      EXPECT_LT(run_and_compare(c, plan, ref, &fused, true), 1e-2) << "fused merge, items " << items;
      EXPECT_TRUE(fused == got) << "the streamed kernel's fused merge differs from the merge kernel: plan " << name
                                << " items=" << items;
      std::printf("  fp8  D=%3d group=%d block=%3d plan=%-12s rows=16 splits=%3d items=%d rel_err=%.2e %s\n", head_dim,
                  group, block_size, name.c_str(), plan.num_splits, items, err,
                  got == expected ? "(= items 0)" : "(DIFFERS from items 0)");
      EXPECT_LT(err, 1e-2) << "fp8 D=" << head_dim << " group=" << group << " block=" << block_size << " plan=" << name
                           << " items=" << items;
      EXPECT_TRUE(got == expected) << "streamed kernel differs from the one-CTA-per-tile kernel: D=" << head_dim
                                   << " group=" << group << " block=" << block_size << " plan=" << name
                                   << " items=" << items;
    }
  }
}

// FP8 decode batches under the balanced kernel (AttentionPlan::stream_ctas: a grid of that many
// CTAs shares the batch's tiles out, cutting units anywhere; it merges with the split counters,
// run_and_compare's fused_merge, and must leave them zero): against the reference for grids that
// cut units at many places (2, 7, 64, the planner's), and with one CTA, where every unit is whole
// and written out directly, bit for bit the streamed kernel's single-split plan.
void check_balanced(const std::vector<SeqSpec>& seqs, int num_kv_heads, int group, int head_dim, int block_size,
                    std::mt19937& rng) {
  const Case c = make_case(seqs, num_kv_heads, group, head_dim, block_size, rng, true);
  const auto ref = reference(c);
  const AttentionPlan planned = plan_paged_attention(c.shape, max_kv(c), num_sms());
  ASSERT_EQ(planned.query_rows, 16);
  const int device_ctas = balanced_decode_ctas(head_dim, num_sms());
  ASSERT_GT(device_ctas, 0);
  AttentionPlan single = planned;
  single.num_splits = 1;
  single.kv_chunk_size = 1 << 30;
  single.stream_ctas = 0;
  std::vector<uint16_t> whole;
  EXPECT_LT(run_and_compare(c, single, ref, &whole), 1e-2);
  // Unit costs 0, 1 and 3 move every cut (a range may then end inside a unit's fixed cost).
  for (int unit_cost : {0, 1, 3})
    for (int ctas : {1, 2, 7, 64, device_ctas}) {
      AttentionPlan plan = planned;
      plan.stream_ctas = ctas;
      plan.stream_unit_cost = unit_cost;
      std::vector<uint16_t> got;
      const double err = run_and_compare(c, plan, ref, &got, true);
      std::printf("  fp8  D=%3d group=%d block=%3d balanced ctas=%3d unit cost %d rel_err=%.2e %s\n", head_dim, group,
                  block_size, ctas, unit_cost, err, got == whole ? "(= single split)" : "");
      EXPECT_LT(err, 1e-2) << "balanced, D=" << head_dim << " group=" << group << " block=" << block_size
                           << " ctas=" << ctas << " unit cost " << unit_cost;
      if (ctas == 1) {
        EXPECT_TRUE(got == whole) << "one balanced CTA differs from the single-split plan";
      }
    }
}

TEST(PagedAttention, BalancedFp8DecodeMatchesCpuTwin) {
  std::mt19937 rng(4321);
  // Lengths from one entry to several thousand: units of 1 to 65 tiles, so the grids above cut
  // long units into many segments and leave CTAs with a few short units each (or none).
  const std::vector<SeqSpec> seqs = {{1, 1}, {7, 1}, {97, 1}, {1000, 1}, {4097, 1}, {64, 1}, {65, 1}, {2500, 1}};
  for (int head_dim : {64, 128})
    for (int group : {1, 4, 8})
      for (int block_size : {1, 16, 24, 256}) check_balanced(seqs, 2, group, head_dim, block_size, rng);
}

// Where the planner (and the backend, per step) takes the balanced kernel: the shapes measured on
// the H100 (Llama-3.1-8B attention, 32 / 8 heads, D 128, pages of 32; docs/kernels.md "Balanced
// decode attention"). Batch x context -> balanced?
TEST(PagedAttention, BalancedKernelWhereItMeasuredFaster) {
  if (num_sms() != 132) GTEST_SKIP() << "the rule's shapes were measured on 132 SMs";
  struct Shape {
    int batch, context;
    bool per_head, balanced;
  };
  for (const Shape& t : {Shape{1, 1024, false, false}, Shape{4, 1024, false, false}, Shape{2, 4096, false, true},
                         Shape{4, 4096, false, true}, Shape{8, 1024, false, true}, Shape{16, 1024, false, true},
                         Shape{64, 1024, false, true}, Shape{64, 4096, false, false}, Shape{96, 1024, false, false},
                         Shape{256, 1024, false, false}, Shape{472, 1088, false, false}, Shape{64, 4096, true, true},
                         Shape{256, 4096, true, false}}) {
    const AttentionShape shape{t.batch, t.batch, 32, 8, 128, 32};
    const AttentionPlan plan = plan_paged_attention(shape, t.context, num_sms());
    EXPECT_EQ(balanced_decode_pays(plan, shape, num_sms(), t.per_head), t.balanced)
        << "batch " << t.batch << " x " << t.context << (t.per_head ? " per head" : "") << ": splits "
        << plan.num_splits << " of " << plan.kv_chunk_size;
    if (!t.per_head) {
      EXPECT_EQ(plan.stream_ctas > 0, t.balanced) << "the planner applies the rule";
    }
  }
  // Prefill and mixed batches never: the streamed kernels serve decode only.
  const AttentionShape prefill{4, 512, 32, 8, 128, 32};
  EXPECT_FALSE(balanced_decode_pays(plan_paged_attention(prefill, 1024, num_sms()), prefill, num_sms(), true));
}

TEST(PagedAttention, DecodeMatchesCpuTwin) {
  std::mt19937 rng(1234);
  const std::vector<SeqSpec> seqs = {{1, 1}, {7, 1}, {97, 1}, {1000, 1}, {4097, 1}};
  for (int head_dim : {64, 128})
    for (int group : {1, 4, 8})
      for (int block_size : {1, 16, 256}) check_case(seqs, 2, group, head_dim, block_size, rng);
}

TEST(PagedAttention, PrefillAndMixedBatchMatchCpuTwin) {
  std::mt19937 rng(99);
  // Chunked prefill on cached prefixes, whole prompts, and decodes in one batch.
  const std::vector<SeqSpec> seqs = {{1, 1}, {7, 7}, {97, 33}, {1000, 1}, {1000, 130}, {4097, 77}, {300, 300}};
  for (int head_dim : {64, 128})
    for (int group : {1, 4, 8})
      for (int block_size : {1, 16, 256}) check_case(seqs, group == 1 ? 2 : 1, group, head_dim, block_size, rng);
}

// The FP8 cache: the same kernel converts codes to bf16 and applies each row's scale in fp32, so
// against the twin reading the dequantized values it errs as little as the bf16 cache does.
TEST(PagedAttention, Fp8CacheMatchesCpuTwinOfTheDequantizedEntries) {
  std::mt19937 rng(4242);
  const std::vector<SeqSpec> decode = {{1, 1}, {97, 1}, {1000, 1}, {4097, 1}};
  const std::vector<SeqSpec> mixed = {{7, 7}, {97, 33}, {1000, 130}, {300, 300}, {33, 1}};
  for (int head_dim : {64, 128})
    for (int group : {1, 4})
      for (int block_size : {1, 16, 24, 256}) {  // 24: the load path's page division off powers of two
        check_case(decode, 2, group, head_dim, block_size, rng, true);
        check_case(mixed, 2, group, head_dim, block_size, rng, true);
      }
}

// The sequences [first, last) of `c` as a batch of their own over the same cache and pages: their
// query rows, q_indptr from 0, page_indptr's values kept (offsets into the shared page_indices).
Case sub_case(const Case& c, int first, int last) {
  Case s = c;
  s.seqs.assign(c.seqs.begin() + first, c.seqs.begin() + last);
  const int t0 = c.q_indptr[first], t1 = c.q_indptr[last];
  s.shape.num_seqs = last - first;
  s.shape.num_tokens = t1 - t0;
  s.q_indptr.clear();
  for (int i = first; i <= last; ++i) s.q_indptr.push_back(c.q_indptr[i] - t0);
  s.page_indptr.assign(c.page_indptr.begin() + first, c.page_indptr.begin() + last + 1);
  s.kv_len.assign(c.kv_len.begin() + first, c.kv_len.begin() + last);
  const size_t row = static_cast<size_t>(c.shape.num_heads) * c.shape.head_dim;
  s.q.assign(c.q.begin() + t0 * row, c.q.begin() + t1 * row);
  return s;
}

// A mixed batch in two launches (MixedAttentionPlan): `decode` one-token sequences first, then
// `rest`. Against the CPU twin, and bit for bit what each part computes as a batch of its own
// (the same kernel and plan over the same rows: only the q / out offsets and q_indptr's origin
// differ), with the merge kernel and with the split counters.
void check_mixed(const std::vector<SeqSpec>& decode, const std::vector<SeqSpec>& rest, int group, int head_dim,
                 int block_size, bool fp8, std::mt19937& rng) {
  std::vector<SeqSpec> seqs = decode;
  seqs.insert(seqs.end(), rest.begin(), rest.end());
  const Case c = make_case(seqs, 2, group, head_dim, block_size, rng, fp8);
  const int k = static_cast<int>(decode.size()), n = static_cast<int>(seqs.size());
  const int decode_len = *std::max_element(c.kv_len.begin(), c.kv_len.begin() + k);
  const int rest_len = *std::max_element(c.kv_len.begin() + k, c.kv_len.end());
  // fp8 true: the planner splits only FP8 batches (where it pays); the kernels run either cache.
  const MixedAttentionPlan mixed = plan_mixed_attention(c.shape, k, decode_len, rest_len, true, num_sms());
  ASSERT_EQ(mixed.decode_seqs, k);
  ASSERT_EQ(mixed.decode.query_rows, 16) << "the decode rows take the decode kernels";
  ASSERT_EQ(mixed.rest.query_rows, 64);
  std::vector<int32_t> rest_q(c.q_indptr.begin() + k, c.q_indptr.end());
  for (int32_t& x : rest_q) x -= k;
  DeviceBuffer<int32_t> d_rest_q(rest_q);
  const Case dc = sub_case(c, 0, k), rc = sub_case(c, k, n);
  const auto ref = reference(c), dref = reference(dc), rref = reference(rc);
  const size_t row = static_cast<size_t>(c.shape.num_heads) * c.shape.head_dim;
  for (bool fused : {false, true}) {
    std::vector<uint16_t> got, dbits, rbits;
    const double err = run_on(
        c, mixed_attention_workspace_bytes(mixed, c.shape),
        [&](const AttentionArgs& args, void* ws, size_t bytes) {
          return paged_attention_mixed(args, mixed, d_rest_q.ptr, ws, bytes, nullptr);
        },
        ref, &got, fused);
    std::printf("  %s D=%3d group=%d block=%3d mixed %d decode + %d rest, decode splits %d items %d balanced %d, rest "
                "splits %d%s  rel_err=%.2e\n",
                fp8 ? "fp8 " : "bf16", head_dim, group, block_size, k, n - k, mixed.decode.num_splits,
                mixed.decode.items_per_cta, mixed.decode.stream_ctas, mixed.rest.num_splits,
                fused ? ", counters" : "", err);
    EXPECT_LT(err, 1e-2) << (fp8 ? "fp8" : "bf16") << " D=" << head_dim << " group=" << group << " block=" << block_size;
    EXPECT_LT(run_and_compare(dc, mixed.decode, dref, &dbits, fused), 1e-2);
    EXPECT_LT(run_and_compare(rc, mixed.rest, rref, &rbits, fused), 1e-2);
    ASSERT_EQ(got.size(), dbits.size() + rbits.size());
    EXPECT_TRUE(std::equal(dbits.begin(), dbits.end(), got.begin()))
        << "the decode rows differ from the decode part run alone";
    EXPECT_TRUE(std::equal(rbits.begin(), rbits.end(), got.begin() + static_cast<long>(k * row)))
        << "the rest's rows differ from the rest run alone";
  }
}

TEST(PagedAttention, MixedBatchDecodeRowsInTheDecodeKernels) {
  std::mt19937 rng(2718);
  // Decode rows of lengths 1 to 4,097 (one to 65 tiles; the longest split), then chunked prefill
  // on cached prefixes, whole prompts and a decode row after them (it stays in the 64-row launch).
  std::vector<SeqSpec> decode;
  for (int kv : {1, 7, 97, 1000, 4097, 64, 65, 2500, 300, 129}) decode.push_back({kv, 1});
  const std::vector<SeqSpec> rest = {{97, 33}, {1000, 130}, {33, 1}, {300, 300}};
  for (int head_dim : {64, 128})
    for (int group : {1, 4, 8})
      for (int block_size : {1, 16, 256})
        for (bool fp8 : {false, true}) check_mixed(decode, rest, group, head_dim, block_size, fp8, rng);
}

// Where plan_mixed_attention splits: FP8 batches with at least kMixedDecodeMinSeqs leading decode
// rows and prompt tokens after them; one launch otherwise, planned for the whole batch.
TEST(PagedAttention, MixedPlanSplitsOnlyWhereItShould) {
  const int sms = num_sms();
  const AttentionShape mixed{12, 12 + 3 * 100, 32, 8, 128, 32};  // 12 decode rows, then 3 prompts of 101
  const MixedAttentionPlan split = plan_mixed_attention(mixed, 9, 4096, 200, true, sms);
  EXPECT_EQ(split.decode_seqs, 9);
  EXPECT_EQ(split.decode.query_rows, 16);
  EXPECT_EQ(split.decode.num_tile_slots, plan_paged_attention(mixed_decode_shape(mixed, 9), 4096, sms).num_tile_slots);
  EXPECT_EQ(split.rest.num_tile_slots, plan_paged_attention(mixed_rest_shape(mixed, 9), 200, sms).num_tile_slots);
  const AttentionPlan whole = plan_paged_attention(mixed, 4096, sms);
  for (const MixedAttentionPlan& one :
       {plan_mixed_attention(mixed, kMixedDecodeMinSeqs - 1, 4096, 200, true, sms),   // too few decode rows
        plan_mixed_attention(mixed, 9, 4096, 200, false, sms),                        // bf16 cache
        plan_mixed_attention(mixed, 0, 4096, 200, true, sms)}) {
    EXPECT_EQ(one.decode_seqs, 0);
    EXPECT_EQ(one.rest.num_tile_slots, whole.num_tile_slots);
    EXPECT_EQ(one.rest.num_splits, whole.num_splits);
    EXPECT_EQ(one.rest.query_rows, whole.query_rows);
  }
  // A decode batch (every sequence one token) and a prompt-only batch: one launch.
  const AttentionShape decode{20, 20, 32, 8, 128, 32};
  EXPECT_EQ(plan_mixed_attention(decode, 20, 1024, 1, true, sms).decode_seqs, 0);
  const AttentionShape prefill{3, 300, 32, 8, 128, 32};
  EXPECT_EQ(plan_mixed_attention(prefill, 0, 1, 100, true, sms).decode_seqs, 0);
  // Ragged args and a missing rest_q_indptr are refused, not run.
  AttentionArgs args;
  args.shape = mixed;
  EXPECT_EQ(paged_attention_mixed(args, split, nullptr, nullptr, 0, nullptr), cudaErrorInvalidValue);
  args.ragged.num_tables = 2;
  int32_t dummy = 0;
  EXPECT_EQ(paged_attention_mixed(args, split, &dummy, nullptr, 0, nullptr), cudaErrorInvalidValue);
}

TEST(PagedAttention, OddGroupAndPageSize) {
  std::mt19937 rng(7);
  // Group 2 (the tiny llama's ratio) and a page size of 32; one long prefill spanning many tiles.
  check_case({{1500, 700}, {33, 1}, {2049, 1}}, 3, 2, 128, 32, rng);
  check_case({{1500, 700}, {33, 1}, {2049, 1}}, 4, 2, 64, 32, rng);
}

TEST(PagedAttention, RejectsUnsupportedShapes) {
  EXPECT_FALSE(paged_attention_supported(8));
  EXPECT_TRUE(paged_attention_supported(128));
  AttentionArgs args;
  args.shape = {1, 1, 8, 4, 8, 16};
  const AttentionPlan plan = plan_paged_attention(args.shape, 10, 132);
  EXPECT_EQ(paged_attention(args, plan, nullptr, 0, nullptr), cudaErrorInvalidValue);
  args.shape.head_dim = 128;
  args.shape.num_heads = 6;  // not a multiple of num_kv_heads
  EXPECT_EQ(paged_attention(args, plan, nullptr, 0, nullptr), cudaErrorInvalidValue);
}

TEST(KVCacheWrite, ScattersRowsToSlots) {
  std::mt19937 rng(5);
  for (int head_dim : {8, 64, 128})
    for (int block_size : {1, 16, 256}) {
      const int num_kv_heads = 3, num_tokens = 300;
      const int num_blocks = (num_tokens + block_size - 1) / block_size * 2 + 1;
      std::vector<int32_t> slots(static_cast<size_t>(num_blocks - 1) * block_size);
      std::iota(slots.begin(), slots.end(), block_size);  // every slot outside block 0
      std::shuffle(slots.begin(), slots.end(), rng);
      slots.resize(num_tokens);
      slots[17] = -1;  // a padding row: writes nothing
      const auto k = random_bf16(static_cast<size_t>(num_tokens) * num_kv_heads * head_dim, rng);
      const auto v = random_bf16(k.size(), rng);
      const size_t cache_elems = static_cast<size_t>(num_blocks) * num_kv_heads * block_size * head_dim;
      std::vector<uint16_t> k_cache = random_bf16(cache_elems, rng), v_cache = random_bf16(cache_elems, rng);
      DeviceBuffer<uint16_t> dk(k), dv(v), dkc(k_cache), dvc(v_cache);
      DeviceBuffer<int32_t> dslots(slots);
      KVWriteArgs a;
      a.k = reinterpret_cast<const __nv_bfloat16*>(dk.ptr);
      a.v = reinterpret_cast<const __nv_bfloat16*>(dv.ptr);
      a.slot_mapping = dslots.ptr;
      a.k_cache = reinterpret_cast<__nv_bfloat16*>(dkc.ptr);
      a.v_cache = reinterpret_cast<__nv_bfloat16*>(dvc.ptr);
      a.num_tokens = num_tokens;
      a.num_kv_heads = num_kv_heads;
      a.head_dim = head_dim;
      a.block_size = block_size;
      CK(write_kv_cache(a, nullptr));
      CK(cudaDeviceSynchronize());
      // CPU twin of the scatter on the host copies.
      for (int t = 0; t < num_tokens; ++t) {
        if (slots[t] < 0) continue;
        const size_t block = slots[t] / block_size, off = slots[t] % block_size;
        for (int h = 0; h < num_kv_heads; ++h)
          for (int d = 0; d < head_dim; ++d) {
            const size_t dst = ((block * num_kv_heads + h) * block_size + off) * head_dim + d;
            const size_t src = (static_cast<size_t>(t) * num_kv_heads + h) * head_dim + d;
            k_cache[dst] = k[src];
            v_cache[dst] = v[src];
          }
      }
      EXPECT_TRUE(dkc.get() == k_cache) << "K, D=" << head_dim << " block=" << block_size;
      EXPECT_TRUE(dvc.get() == v_cache) << "V, D=" << head_dim << " block=" << block_size;
    }
  KVWriteArgs bad;
  bad.num_tokens = 1;
  bad.num_kv_heads = 1;
  bad.block_size = 16;
  bad.head_dim = 12;
  EXPECT_EQ(write_kv_cache(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace origami::cuda
