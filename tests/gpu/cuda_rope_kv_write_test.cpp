// The KV write fused into the QK-norm + RoPE kernel (RopeArgs::kv) against the two kernels it
// replaces (launch_qk_norm_rope into k_out / v_out, then write_kv_cache or write_kv_cache_fp8):
// q_out and the whole cache (bf16 rows, or FP8 codes and scales) equal bit for bit, the poison of
// untouched rows included, on the one-group layout (block 16 and 256) and on ragged head groups
// (non-adjacent heads per group, a group's K and V heads in one page as the backend lays them
// out), with padding rows (negative slots), head_dim 64 and 128, q/k norm on and off, 1, 7 and
// 300 tokens; and the fused launch replayed from a CUDA graph after its slot table changed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/elementwise_kernels.h"
#include "backend/cuda/kv_cache_write.h"
#include "cuda_test_util.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::random_bf16_values;
using testing::to_device_bf16;

constexpr int kHeads = 12, kKVHeads = 4;  // 20 heads: the last block of 8 warps is part idle

struct Layout {
  int block_size;
  bool ragged;  // two groups of two non-adjacent KV heads, {0, 2} and {1, 3}
};

// One layer's cache layout and a step's slot tables, on the host. One group: K's pages
// [num_blocks, kKVHeads, block_size, head_dim], then V's. Ragged: pages of page_stride elements
// holding the group's K heads then its V heads (the backend's shared pool). Slots: shuffled from
// page 1 on, each group's disjoint from the other's; every fifth token from the third is a
// padding row (slot -1).
struct Paging {
  int block_size = 0, groups = 1;
  long long elems = 0, v_offset = 0, page_stride = 0;
  std::vector<int32_t> slots;  // [groups, num_tokens]
  std::vector<int32_t> head_table, head_slot;
};

Paging make_paging(int num_tokens, int head_dim, const Layout& l, std::mt19937& rng) {
  Paging p;
  p.block_size = l.block_size;
  p.groups = l.ragged ? 2 : 1;
  const int num_blocks = 2 + (2 * num_tokens * p.groups + l.block_size - 1) / l.block_size;
  const long long head_page = static_cast<long long>(l.block_size) * head_dim;
  p.elems = 2LL * num_blocks * kKVHeads * head_page;
  const int heads_per_page = kKVHeads / p.groups;
  p.v_offset = l.ragged ? heads_per_page * head_page : p.elems / 2;
  p.page_stride = l.ragged ? 2 * heads_per_page * head_page : 0;
  // Ragged pages are half as many heads, so the same bytes hold twice the pages.
  const int pages = l.ragged ? num_blocks * p.groups : num_blocks;
  std::vector<int32_t> pool(static_cast<size_t>(pages - 1) * l.block_size);
  std::iota(pool.begin(), pool.end(), l.block_size);
  std::shuffle(pool.begin(), pool.end(), rng);
  for (int g = 0; g < p.groups; ++g)
    for (int t = 0; t < num_tokens; ++t)
      p.slots.push_back(t % 5 == 2 ? -1 : pool[static_cast<size_t>(g) * num_tokens + t]);
  for (int h = 0; h < kKVHeads; ++h) {
    p.head_table.push_back(h % p.groups);
    p.head_slot.push_back(h / p.groups);
  }
  return p;
}

// The cache on the device (bf16 values, FP8 codes and scales), every byte poisoned.
struct DeviceCache {
  DeviceBuffer<bf16> values;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  DeviceCache(const Paging& p, int head_dim) : values(p.elems), codes(p.elems), scales(p.elems / head_dim) {
    poison();
  }
  void poison() {
    values.poison();
    codes.poison();
    scales.poison();
  }
  KVWriteFp8Out fp8_out(const Paging& p, int head_dim) const {
    return {codes.get(), codes.get() + p.v_offset, scales.get(), scales.get() + p.v_offset / head_dim};
  }
};

// The device side of one step: inputs, slot tables, the separate path's k / v and both caches.
struct Step {
  int num_tokens, head_dim;
  bool qk_norm, fp8;
  Paging paging;
  DeviceBuffer<bf16> qkv, q_norm, k_norm;
  DeviceBuffer<int32_t> positions, slots, head_table, head_slot;
  DeviceBuffer<float> inv_freq;

  Step(int n, int d, const Layout& l, bool norm, bool use_fp8, std::mt19937& rng)
      : num_tokens(n),
        head_dim(d),
        qk_norm(norm),
        fp8(use_fp8),
        paging(make_paging(n, d, l, rng)),
        qkv(to_device_bf16(random_bf16_values(static_cast<size_t>(n) * (kHeads + 2 * kKVHeads) * d, rng))),
        q_norm(to_device_bf16(random_bf16_values(d, rng))),
        k_norm(to_device_bf16(random_bf16_values(d, rng))),
        positions(random_positions(n, rng)),
        slots(paging.slots),
        head_table(paging.head_table),
        head_slot(paging.head_slot),
        inv_freq(cpu::rope_inv_freq(RopeConfig{}, d)) {}

  static std::vector<int32_t> random_positions(int n, std::mt19937& rng) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int32_t& x : p) x = static_cast<int32_t>(rng() % 4097);
    return p;
  }

  RopeArgs rope_args(bf16* q_out) const {
    RopeArgs a;
    a.qkv = qkv.get();
    a.qkv_stride = (kHeads + 2 * kKVHeads) * head_dim;
    a.positions = positions.get();
    a.inv_freq = inv_freq.get();
    a.q_norm = qk_norm ? q_norm.get() : nullptr;
    a.k_norm = qk_norm ? k_norm.get() : nullptr;
    a.eps = 1e-6f;
    a.num_tokens = num_tokens;
    a.num_heads = kHeads;
    a.num_kv_heads = kKVHeads;
    a.head_dim = head_dim;
    a.q_out = q_out;
    return a;
  }

  KVWriteArgs write_args(const DeviceCache& cache) const {
    KVWriteArgs w;
    w.slot_mapping = slots.get();
    w.k_cache = cache.values.get();
    w.v_cache = cache.values.get() + paging.v_offset;
    w.num_tokens = num_tokens;
    w.num_kv_heads = kKVHeads;
    w.head_dim = head_dim;
    w.block_size = paging.block_size;
    if (paging.groups > 1) {
      w.head_table = head_table.get();
      w.head_slot = head_slot.get();
      w.page_stride = paging.page_stride;
    }
    return w;
  }

  // The two kernels the fusion replaces: RoPE into k / v, then the scatter.
  void run_separate(bf16* q_out, bf16* k, bf16* v, const DeviceCache& cache, cudaStream_t stream) const {
    RopeArgs a = rope_args(q_out);
    a.k_out = k;
    a.v_out = v;
    launch_qk_norm_rope(a, stream);
    KVWriteArgs w = write_args(cache);
    w.k = k;
    w.v = v;
    ORIGAMI_CUDA_CHECK(fp8 ? write_kv_cache_fp8(w, cache.fp8_out(paging, head_dim), stream) : write_kv_cache(w, stream));
  }

  // The fused launch; k / v null: not written.
  void run_fused(bf16* q_out, bf16* k, bf16* v, const DeviceCache& cache, cudaStream_t stream) const {
    RopeArgs a = rope_args(q_out);
    a.k_out = k;
    a.v_out = v;
    a.kv = write_args(cache);
    if (fp8) a.kv_fp8 = cache.fp8_out(paging, head_dim);
    launch_qk_norm_rope(a, stream);
  }
};

template <typename T>
void expect_same_bytes(const DeviceBuffer<T>& got, const DeviceBuffer<T>& want, const std::string& what) {
  const std::vector<T> g = got.download(), w = want.download();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i)
    if (std::memcmp(&g[i], &w[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": first difference at element " << i << " of " << g.size();
      return;
    }
}

// Rows the reference wrote (not all poison): what the test exercises is real, not poison == poison.
template <typename T>
long long written_rows(const DeviceBuffer<T>& buf, int row_len) {
  const std::vector<T> h = buf.download();
  std::vector<unsigned char> poison(sizeof(T) * row_len, 0xff);
  long long n = 0;
  for (size_t r = 0; r + row_len <= h.size(); r += row_len)
    n += std::memcmp(&h[r], poison.data(), poison.size()) != 0;
  return n;
}

void expect_same_cache(const DeviceCache& got, const DeviceCache& want, const Step& s) {
  if (s.fp8) {
    expect_same_bytes(got.codes, want.codes, "fp8 codes");
    expect_same_bytes(got.scales, want.scales, "fp8 scales");
  } else {
    expect_same_bytes(got.values, want.values, "bf16 cache");
  }
}

long long expected_rows(const Step& s) {  // K and V rows with a slot
  long long n = 0;
  for (int h = 0; h < kKVHeads; ++h)
    for (int t = 0; t < s.num_tokens; ++t)
      n += s.paging.slots[static_cast<size_t>(s.paging.head_table[h]) * s.num_tokens + t] >= 0;
  return 2 * n;
}

TEST(CudaRopeKVWrite, FusedWriteEqualsRopeThenScatterBitForBit) {
  std::mt19937 rng(29);
  const Layout layouts[] = {{16, false}, {256, false}, {16, true}, {256, true}};
  for (int d : {64, 128})
    for (const Layout& l : layouts)
      for (bool norm : {false, true})
        for (bool fp8 : {false, true})
          for (int n : {1, 7, 300}) {
            SCOPED_TRACE("head_dim " + std::to_string(d) + ", block " + std::to_string(l.block_size) +
                         (l.ragged ? ", ragged" : ", one group") + (norm ? ", qk norm" : "") +
                         (fp8 ? ", fp8" : ", bf16") + ", " + std::to_string(n) + " tokens");
            const Step s(n, d, l, norm, fp8, rng);
            const size_t q_elems = static_cast<size_t>(n) * kHeads * d, kv_elems = static_cast<size_t>(n) * kKVHeads * d;
            DeviceBuffer<bf16> q_ref(q_elems), k_ref(kv_elems), v_ref(kv_elems), q(q_elems), k(kv_elems), v(kv_elems);
            for (auto* b : {&q_ref, &k_ref, &v_ref, &q, &k, &v}) b->poison();
            DeviceCache ref(s.paging, d), fused(s.paging, d);
            s.run_separate(q_ref.get(), k_ref.get(), v_ref.get(), ref, nullptr);
            // k_out / v_out are optional beside the cache write: kept on 7 tokens, skipped otherwise.
            const bool keep_kv = n == 7;
            s.run_fused(q.get(), keep_kv ? k.get() : nullptr, keep_kv ? v.get() : nullptr, fused, nullptr);
            ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
            ASSERT_EQ(fp8 ? written_rows(ref.scales, 1) : written_rows(ref.values, d), expected_rows(s));
            expect_same_bytes(q, q_ref, "q_out");
            expect_same_cache(fused, ref, s);
            if (keep_kv) {
              expect_same_bytes(k, k_ref, "k_out");
              expect_same_bytes(v, v_ref, "v_out");
            }
          }
}

// The backend captures each batch size's step once and replays it with new slot tables: the
// fused launch must read them from the device at replay time.
TEST(CudaRopeKVWrite, GraphReplayFollowsNewSlots) {
  std::mt19937 rng(31);
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    Step s(7, 128, Layout{16, true}, true, fp8, rng);
    const size_t q_elems = static_cast<size_t>(s.num_tokens) * kHeads * s.head_dim;
    const size_t kv_elems = static_cast<size_t>(s.num_tokens) * kKVHeads * s.head_dim;
    DeviceBuffer<bf16> q_ref(q_elems), k_ref(kv_elems), v_ref(kv_elems), q(q_elems);
    DeviceCache ref(s.paging, s.head_dim), fused(s.paging, s.head_dim);
    cudaStream_t stream;
    ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraph_t graph;
    ORIGAMI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    s.run_fused(q.get(), nullptr, nullptr, fused, stream);
    ORIGAMI_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    ORIGAMI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    // New slots after capture: reversed (every written row moves) and one more padding row.
    std::reverse(s.paging.slots.begin(), s.paging.slots.end());
    s.paging.slots[0] = -1;
    s.slots.upload(s.paging.slots);
    ORIGAMI_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    ORIGAMI_CUDA_CHECK(cudaStreamSynchronize(stream));
    s.run_separate(q_ref.get(), k_ref.get(), v_ref.get(), ref, nullptr);
    ORIGAMI_CUDA_CHECK(cudaDeviceSynchronize());
    ASSERT_EQ(fp8 ? written_rows(ref.scales, 1) : written_rows(ref.values, s.head_dim), expected_rows(s));
    expect_same_bytes(q, q_ref, "q_out");
    expect_same_cache(fused, ref, s);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    ORIGAMI_CUDA_CHECK(cudaStreamDestroy(stream));
  }
}

}  // namespace
}  // namespace origami::cuda
