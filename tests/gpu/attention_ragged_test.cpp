// Ragged paging on the GPU (TANGRAM §4.2-4.3): the paged attention and KV-write kernels over a
// head-group layout against an fp64 CPU twin. One layer of 8 KV heads in 4 groups of 2
// NON-adjacent heads ({3, 6}, {0, 5}, {1, 7}, {2, 4}), every (sequence, group) with its own random
// length and shuffled pages of one shared pool ([2 (K, V), H_p, block_size, head_dim] per page),
// decode and prefill rows, GQA 4; every uniform split count the planner may pick, each with the
// budget split map (ratios 0.1 .. 0.6) and with the uniform one. Plus the split maps themselves,
// and an FP8 pool (codes + a scale per row) under the decode kernels.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/kv_cache_write.h"
#include "backend/cuda/paged_attention.h"
#include "backend/cuda/ragged_heads.h"
#include "cuda_test_util.h"
#include "kv/kv_cache_dtype.h"
#include "kv/kv_layout.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;

constexpr int kHeads = 8, kHp = 2, kGroups = kHeads / kHp;
const std::vector<std::vector<int>> kGroupHeads = {{3, 6}, {0, 5}, {1, 7}, {2, 4}};
const std::vector<double> kBudgets = {0.1, 0.6, 0.25, 0.4};

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16_bits(dist(rng));
  return v;
}

KVLayout one_layer_layout(int block_size, int num_pages, bool budgets) {
  auto layout = KVLayout::grouped(1, kHeads, 128, block_size, num_pages, DType::kBF16, {kGroupHeads});
  EXPECT_TRUE(layout.has_value()) << layout.status().to_string();
  if (budgets)
    for (int g = 0; g < kGroups; ++g) layout->groups[g].budget = kBudgets[g];
  return *layout;
}

struct RaggedCase {
  int D = 128, group = 4, bs = 16, num_pages = 0;
  std::vector<int> q_len;                   // [seq]
  std::vector<std::vector<int>> kv_len;     // [group][seq]
  std::vector<int32_t> q_indptr, page_indptr, page_indices, kv_len_flat;
  std::vector<uint16_t> q, pool;
  // FP8 pool (quantize_fp8): codes at the bf16 pool's element offsets, one scale per row at
  // element offset / D, and the dequantized values the twin reads (empty: the bf16 pool).
  std::vector<uint8_t> codes;
  std::vector<float> scales, pool_values;
  long long page_elems() const { return 2LL * kHp * bs * D; }
};

RaggedCase make_case(const std::vector<int>& q_len, int bs, std::mt19937& rng) {
  RaggedCase c;
  c.bs = bs;
  c.q_len = q_len;
  const int S = static_cast<int>(q_len.size());
  std::uniform_int_distribution<int> extra(0, 3000);
  c.kv_len.assign(kGroups, std::vector<int>(S));
  int total_pages = 0;
  for (int g = 0; g < kGroups; ++g)
    for (int i = 0; i < S; ++i) {
      // Group lengths follow their budgets roughly, plus noise: every group its own length.
      c.kv_len[g][i] = q_len[i] + static_cast<int>(kBudgets[g] * extra(rng)) + (i == 0 ? 0 : g);
      total_pages += (c.kv_len[g][i] + bs - 1) / bs;
    }
  c.num_pages = total_pages + 7;
  std::vector<int32_t> ids(c.num_pages - 1);
  std::iota(ids.begin(), ids.end(), 1);
  std::shuffle(ids.begin(), ids.end(), rng);
  c.q_indptr = {0};
  for (int i = 0; i < S; ++i) c.q_indptr.push_back(c.q_indptr.back() + q_len[i]);
  c.page_indptr = {0};
  int used = 0;
  for (int g = 0; g < kGroups; ++g)
    for (int i = 0; i < S; ++i) {
      const int pages = (c.kv_len[g][i] + bs - 1) / bs;
      c.page_indices.insert(c.page_indices.end(), ids.begin() + used, ids.begin() + used + pages);
      used += pages;
      c.page_indptr.push_back(used);
      c.kv_len_flat.push_back(c.kv_len[g][i]);
    }
  c.pool = random_bf16(static_cast<size_t>(c.num_pages) * c.page_elems(), rng);
  c.q = random_bf16(static_cast<size_t>(c.q_indptr.back()) * kHeads * c.group * c.D, rng, 2.f);
  return c;
}

// Quantizes every row of the pool as the FP8 write kernel does (kv/kv_cache_dtype.h).
void quantize_fp8(RaggedCase& c) {
  const size_t rows = c.pool.size() / c.D;
  c.codes.assign(c.pool.size(), 0);
  c.scales.assign(rows, 0.f);
  c.pool_values.assign(c.pool.size(), 0.f);
  std::vector<float> row(c.D);
  for (size_t r = 0; r < rows; ++r) {
    for (int d = 0; d < c.D; ++d) row[d] = bf16_value(c.pool[r * c.D + d]);
    c.scales[r] = quantize_head_vector_fp8(row.data(), c.D, c.codes.data() + r * c.D);
    for (int d = 0; d < c.D; ++d) c.pool_values[r * c.D + d] = kv_fp8_dequantize(c.codes[r * c.D + d], c.scales[r]);
  }
}

// fp64 twin: query j of sequence i, query head qh (KV head qh / group, in group g at slot s) sees
// entries 0 .. kv_len[g][i] - q_len + j of group g's table.
std::vector<double> reference(const RaggedCase& c) {
  const int S = static_cast<int>(c.q_len.size()), D = c.D, nq = kHeads * c.group;
  std::vector<double> out(static_cast<size_t>(c.q_indptr.back()) * nq * D, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  for (int i = 0; i < S; ++i)
    for (int j = 0; j < c.q_len[i]; ++j)
      for (int qh = 0; qh < nq; ++qh) {
        const int h = qh / c.group;
        int g = 0, slot = 0;
        for (int gg = 0; gg < kGroups; ++gg)
          for (int ss = 0; ss < kHp; ++ss)
            if (kGroupHeads[gg][ss] == h) g = gg, slot = ss;
        const int row = g * S + i, len = c.kv_len[g][i], visible = len - c.q_len[i] + j + 1;
        const int token = c.q_indptr[i] + j;
        const uint16_t* q = &c.q[(static_cast<size_t>(token) * nq + qh) * D];
        auto at = [&](int e, int kv) {
          const long long page = c.page_indices[c.page_indptr[row] + e / c.bs];
          return page * c.page_elems() + (static_cast<long long>(kv * kHp + slot) * c.bs + e % c.bs) * D;
        };
        auto value = [&](long long i) {
          return c.pool_values.empty() ? static_cast<double>(bf16_value(c.pool[i])) : c.pool_values[i];
        };
        std::vector<double> p(visible);
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < visible; ++e) {
          const long long k = at(e, 0);
          double dot = 0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(bf16_value(q[d])) * value(k + d);
          mx = std::max(mx, p[e] = dot * scale);
        }
        for (double& x : p) sum += (x = std::exp(x - mx));
        double* o = &out[(static_cast<size_t>(token) * nq + qh) * D];
        for (int e = 0; e < visible; ++e) {
          const long long v = at(e, 1);
          for (int d = 0; d < D; ++d) o[d] += p[e] / sum * value(v + d);
        }
      }
  return out;
}

// Relative L2 error of a bf16 output against the fp64 reference; infinity for a non-finite element.
double rel_error(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_value(got[i]);
    if (!std::isfinite(g)) return INFINITY;
    num += (g - ref[i]) * (g - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// items_per_cta >= 0 overrides the plan's (the FP8 decode kernel's work items per CTA).
// stream_ctas > 0: the launches with split counters run the balanced FP8 decode kernel on that many
// CTAs (AttentionPlan::stream_ctas; FP8 decode batches), checked against the reference rather than
// bit for bit against the split launch; 0: off, as every other plan here.
double run_ragged(const RaggedCase& c, const RaggedHeadTables& tables, int uniform_splits,
                  const std::vector<double>& ref, bool split_map = true, int items_per_cta = -1, int stream_ctas = 0) {
  const int S = static_cast<int>(c.q_len.size());
  DeviceBuffer<uint16_t> q(c.q), pool(c.pool), out(ref.size());
  DeviceBuffer<uint8_t> codes(c.codes);
  DeviceBuffer<float> scales(c.scales);
  DeviceBuffer<int32_t> q_indptr(c.q_indptr), page_indptr(c.page_indptr), pages(c.page_indices), kv_len(c.kv_len_flat);
  AttentionArgs a;
  a.shape = AttentionShape{S, c.q_indptr.back(), kHeads * c.group, kHeads, c.D, c.bs};
  a.softmax_scale = 1.f / std::sqrt(static_cast<float>(c.D));
  a.q = reinterpret_cast<const __nv_bfloat16*>(q.get());
  a.out = reinterpret_cast<__nv_bfloat16*>(out.get());
  a.k_cache = reinterpret_cast<const __nv_bfloat16*>(pool.get());
  a.v_cache = a.k_cache + static_cast<size_t>(kHp) * c.bs * c.D;
  a.q_indptr = q_indptr.get();
  a.page_indptr = page_indptr.get();
  a.page_indices = pages.get();
  a.kv_len = kv_len.get();
  if (!c.codes.empty()) {
    a.k_cache = a.v_cache = nullptr;
    a.k_codes = codes.get();
    a.v_codes = a.k_codes + static_cast<size_t>(kHp) * c.bs * c.D;
    a.k_scales = scales.get();
    a.v_scales = a.k_scales + static_cast<size_t>(kHp) * c.bs;
  }
  a.ragged = tables.layer(0, uniform_splits, c.page_elems(), split_map);
  AttentionPlan uniform = plan_paged_attention(a.shape, 4096, 132);
  uniform.num_splits = uniform_splits;
  AttentionPlan plan = ragged_plan(uniform, a.ragged);
  if (items_per_cta >= 0) plan.items_per_cta = items_per_cta;
  plan.stream_ctas = stream_ctas;
  const size_t ws_bytes = paged_attention_workspace_bytes(plan, a.shape);
  DeviceBuffer<unsigned char> ws(std::max<size_t>(ws_bytes, 1));
  EXPECT_EQ(cudaMemset(out.get(), 0xff, ref.size() * 2), cudaSuccess);  // NaN poison
  if (ws_bytes) {
    EXPECT_EQ(cudaMemset(ws.get(), 0xff, ws_bytes), cudaSuccess);
  }
  EXPECT_EQ(paged_attention(a, plan, ws.get(), ws_bytes, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = out.download();
  // The decode kernels' merge in the last CTA of each (sequence, head) (AttentionArgs::split_counters,
  // each head with its own split count here): the same bits as the merge kernel's, and the
  // counters zero again after each of two launches.
  DeviceBuffer<int32_t> counters(std::vector<int32_t>(static_cast<size_t>(split_counter_count(a.shape)), 0));
  a.split_counters = counters.get();
  double worst = rel_error(got, ref);
  for (int launch = 0; launch < 2; ++launch) {
    EXPECT_EQ(cudaMemset(out.get(), 0xff, ref.size() * 2), cudaSuccess);
    if (ws_bytes) {
      EXPECT_EQ(cudaMemset(ws.get(), 0xff, ws_bytes), cudaSuccess);
    }
    EXPECT_EQ(paged_attention(a, plan, ws.get(), ws_bytes, nullptr), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> merged = out.download();
    if (stream_ctas > 0) {
      worst = std::max(worst, rel_error(merged, ref));
    } else {
      EXPECT_TRUE(merged == got) << "fused merge differs from the merge kernel: splits " << plan.num_splits
                                 << " items " << plan.items_per_cta << " launch " << launch;
    }
    const std::vector<int32_t> left = counters.download();
    EXPECT_EQ(std::count(left.begin(), left.end(), 0), static_cast<long>(left.size())) << "a counter left nonzero";
  }
  return worst;
}

TEST(RaggedAttention, NonAdjacentGroupsWithOwnLengthsMatchCpuTwin) {
  std::mt19937 rng(2024);
  const std::vector<std::vector<int>> batches = {{1, 1, 1, 1, 1}, {1, 37, 1, 130}};
  for (int bs : {16, 256}) {
    for (const auto& q_len : batches) {
      const RaggedCase c = make_case(q_len, bs, rng);
      const std::vector<double> ref = reference(c);
      for (bool budgets : {true, false}) {
        RaggedHeadTables tables;
        ASSERT_TRUE(tables.build(one_layer_layout(bs, c.num_pages, budgets), 24, budgets).is_ok());
        for (int s : {1, 2, 5, 24}) {
          const double err = run_ragged(c, tables, s, ref);
          std::printf("  block=%3d seqs=%zu split_map=%d s=%2d max_splits=%2d rel_err=%.2e\n", bs, q_len.size(),
                      budgets, s, tables.max_splits(s), err);
          EXPECT_LT(err, 1e-2) << "block " << bs << " s " << s << " budgets " << budgets;
          // The same tables' plain splits (what the backend launches where the map does not win).
          const double plain_err = run_ragged(c, tables, s, ref, /*split_map=*/false);
          std::printf("  block=%3d seqs=%zu plain splits  s=%2d max_splits=%2d rel_err=%.2e\n", bs, q_len.size(), s,
                      tables.max_splits(s, false), plain_err);
          EXPECT_EQ(tables.max_splits(s, false), s);
          EXPECT_LT(plain_err, 1e-2) << "plain splits, block " << bs << " s " << s << " budgets " << budgets;
        }
      }
    }
  }
}

// An FP8 pool under the decode kernels: the streamed one with the planner's items per CTA and
// with 3 (a CTA's items span sequences, heads and splits of different lengths), and the
// one-CTA-per-tile kernel (0); a mixed batch takes the prefill kernel.
TEST(RaggedAttention, Fp8PoolMatchesCpuTwinOfTheDequantizedEntries) {
  std::mt19937 rng(77);
  const std::vector<std::vector<int>> batches = {{1, 1, 1, 1, 1, 1, 1}, {1, 37, 1, 130}};
  for (int bs : {16, 256}) {
    for (const auto& q_len : batches) {
      RaggedCase c = make_case(q_len, bs, rng);
      quantize_fp8(c);
      const std::vector<double> ref = reference(c);
      RaggedHeadTables tables;
      ASSERT_TRUE(tables.build(one_layer_layout(bs, c.num_pages, true), 24, true).is_ok());
      for (int s : {1, 2, 5, 24})
        for (bool split_map : {true, false})
          for (int items : {-1, 0, 3}) {
            const double err = run_ragged(c, tables, s, ref, split_map, items);
            std::printf("  fp8 block=%3d seqs=%zu split_map=%d s=%2d items=%2d rel_err=%.2e\n", bs, q_len.size(),
                        split_map, s, items, err);
            EXPECT_LT(err, 1e-2) << "fp8 block " << bs << " s " << s << " split_map " << split_map << " items " << items;
          }
      // The balanced kernel over the groups' own lengths (units of different tile counts per
      // head), on grids that cut them at many places; it ignores the split map.
      for (int ctas : {1, 3, 17, 64, 396}) {
        const double err = run_ragged(c, tables, 2, ref, true, -1, ctas);
        std::printf("  fp8 block=%3d seqs=%zu balanced ctas=%3d rel_err=%.2e\n", bs, q_len.size(), ctas, err);
        EXPECT_LT(err, 1e-2) << "fp8 block " << bs << " balanced ctas " << ctas;
      }
    }
  }
}

TEST(RaggedAttention, SplitMapFollowsBudgets) {
  RaggedHeadTables tables;
  ASSERT_TRUE(tables.build(one_layer_layout(16, 64, true), 16).is_ok());
  for (int s = 1; s <= 16; ++s) {
    const std::vector<int>& row = tables.split_map(s)[0];
    EXPECT_EQ(std::accumulate(row.begin(), row.end(), 0), s * kGroups) << "s " << s;  // the uniform CTA count
    for (int a = 0; a < kGroups; ++a)
      for (int b = 0; b < kGroups; ++b)
        if (kBudgets[a] > kBudgets[b]) {
          EXPECT_GE(row[a], row[b]) << "s " << s;
        }
  }
  EXPECT_EQ(tables.split_map(1)[0], std::vector<int>(kGroups, 1));
  // 8 x 4 CTAs by budgets 0.1 : 0.6 : 0.25 : 0.4 (sum 1.35): quotas 2.4, 14.2, 5.9, 9.5.
  EXPECT_EQ(tables.split_map(8)[0], (std::vector<int>{2, 14, 6, 10}));
  RaggedHeadTables uniform;
  ASSERT_TRUE(uniform.build(one_layer_layout(16, 64, true), 16, /*use_budgets=*/false).is_ok());
  EXPECT_EQ(uniform.split_map(8)[0], std::vector<int>(kGroups, 8));
  // The map only where it wins (kv/split_map.h): from 512 entries per split of the planning
  // length, never where it equals plain splits (s = 1, uniform budgets).
  EXPECT_TRUE(tables.use_split_map(8, 8 * kSplitMapMinEntriesPerSplit));
  EXPECT_FALSE(tables.use_split_map(8, 8 * kSplitMapMinEntriesPerSplit - 1));
  EXPECT_FALSE(tables.use_split_map(1, 1 << 30));
  for (int s = 1; s <= 16; ++s) EXPECT_FALSE(uniform.use_split_map(s, 1 << 30)) << "s " << s;
  // Not a grouped layout: refused with a message.
  RaggedHeadTables bad;
  const Status st = bad.build(KVLayout::full(1, kHeads, 128, 16, 64, DType::kBF16), 4);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("grouped"), std::string::npos) << st.to_string();
}

TEST(RaggedKVWrite, EachHeadWritesThroughItsGroupsSlot) {
  std::mt19937 rng(3);
  const int D = 128, bs = 16, num_tokens = 50, num_pages = 80;
  const long long page_elems = 2LL * kHp * bs * D;
  RaggedHeadTables tables;
  ASSERT_TRUE(tables.build(one_layer_layout(bs, num_pages, true), 1).is_ok());
  std::vector<int32_t> slots(static_cast<size_t>(kGroups) * num_tokens);
  std::vector<int32_t> free_slots((num_pages - 1) * bs);
  std::iota(free_slots.begin(), free_slots.end(), bs);
  std::shuffle(free_slots.begin(), free_slots.end(), rng);
  std::copy_n(free_slots.begin(), slots.size(), slots.begin());
  slots[5] = -1;  // group 0 skips token 5
  const auto k = random_bf16(static_cast<size_t>(num_tokens) * kHeads * D, rng);
  const auto v = random_bf16(k.size(), rng);
  std::vector<uint16_t> pool = random_bf16(static_cast<size_t>(num_pages) * page_elems, rng);
  DeviceBuffer<uint16_t> dk(k), dv(v), dpool(pool);
  DeviceBuffer<int32_t> dslots(slots);
  KVWriteArgs a;
  a.k = reinterpret_cast<const __nv_bfloat16*>(dk.get());
  a.v = reinterpret_cast<const __nv_bfloat16*>(dv.get());
  a.slot_mapping = dslots.get();
  a.k_cache = reinterpret_cast<__nv_bfloat16*>(dpool.get());
  a.v_cache = a.k_cache + static_cast<size_t>(kHp) * bs * D;
  a.num_tokens = num_tokens;
  a.num_kv_heads = kHeads;
  a.head_dim = D;
  a.block_size = bs;
  a.head_table = tables.head_table(0);
  a.head_slot = tables.head_slot(0);
  a.page_stride = page_elems;
  ASSERT_EQ(write_kv_cache(a, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int g = 0; g < kGroups; ++g)
    for (int s = 0; s < kHp; ++s) {
      const int h = kGroupHeads[g][s];
      for (int t = 0; t < num_tokens; ++t) {
        const int slot = slots[static_cast<size_t>(g) * num_tokens + t];
        if (slot < 0) continue;
        const long long base = (slot / bs) * page_elems + (static_cast<long long>(s) * bs + slot % bs) * D;
        for (int d = 0; d < D; ++d) {
          pool[base + d] = k[(static_cast<size_t>(t) * kHeads + h) * D + d];
          pool[base + static_cast<long long>(kHp) * bs * D + d] = v[(static_cast<size_t>(t) * kHeads + h) * D + d];
        }
      }
    }
  EXPECT_TRUE(dpool.download() == pool);
  a.head_slot = nullptr;  // a head table without slots is refused
  EXPECT_EQ(write_kv_cache(a, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace origami::cuda
