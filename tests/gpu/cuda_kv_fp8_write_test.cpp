// The FP8 KV write kernel (write_kv_cache_fp8) against the CPU backend's emulation: for every
// written (token, head) row, its codes times its scale equal round_head_vector_fp8 of the same
// bf16 row bit for bit, the scale is amax / 448, skipped tokens (slot -1) and untouched slots keep
// their poison, on the full layout and on per-head (ragged) pages, head_dim 64 and 128.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cuda/kv_cache_write.h"
#include "cuda_test_util.h"
#include "kv/kv_cache_dtype.h"

namespace origami::cuda {
namespace {

using testing::DeviceBuffer;
using testing::random_bf16_values;
using testing::to_device_bf16;

struct Case {
  int head_dim;
  bool ragged;
};

TEST(CudaKVFp8Write, CodesTimesScaleEqualTheCpuEmulation) {
  for (const Case c : {Case{64, false}, Case{128, false}, Case{64, true}, Case{128, true}}) {
    SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + (c.ragged ? " ragged" : " full"));
    const int T = 37, H = 4, D = c.head_dim, bs = 16, num_blocks = 8;
    std::mt19937 rng(11 + D);
    // Rows of assorted magnitudes (tiny, ordinary, large) so subnormal codes and saturation-free
    // scaling are both exercised; one all-zero row.
    std::vector<float> k = random_bf16_values(static_cast<size_t>(T) * H * D, rng);
    std::vector<float> v = random_bf16_values(static_cast<size_t>(T) * H * D, rng);
    for (int r = 0; r < T * H; ++r) {
      const float mag = std::ldexp(1.0f, (r % 13) - 8);
      for (int i = 0; i < D; ++i) {
        k[static_cast<size_t>(r) * D + i] = bf16_to_f32(f32_to_bf16(k[static_cast<size_t>(r) * D + i] * mag));
        v[static_cast<size_t>(r) * D + i] = bf16_to_f32(f32_to_bf16(v[static_cast<size_t>(r) * D + i] / mag));
      }
    }
    std::fill(k.begin(), k.begin() + D, 0.0f);
    // Slots: a shuffled subset of the pool's (pages 1..), token 5 skipped.
    std::vector<int32_t> slots(static_cast<size_t>((num_blocks - 1) * bs));
    std::iota(slots.begin(), slots.end(), bs);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(T);
    slots[5] = -1;
    // Ragged: one group per head (H_p = 1), pages of one head from the shared pool of as many
    // pages as the full layout's bytes (num_blocks * H), each head's slots disjoint from the others'.
    std::vector<int32_t> mapping = slots, head_table(H), head_slot(H, 0);
    if (c.ragged) {
      std::vector<int32_t> pool(static_cast<size_t>((num_blocks * H - 1) * bs));
      std::iota(pool.begin(), pool.end(), bs);
      std::shuffle(pool.begin(), pool.end(), rng);
      mapping.clear();
      for (int h = 0; h < H; ++h) {
        head_table[h] = h;
        for (int t = 0; t < T; ++t) mapping.push_back(t == 5 ? -1 : pool[static_cast<size_t>(h) * T + t]);
      }
    }
    const size_t rows = static_cast<size_t>(num_blocks) * H * bs;  // the full layout's rows
    DeviceBuffer<__nv_bfloat16> dk(to_device_bf16(k)), dv(to_device_bf16(v));
    DeviceBuffer<int32_t> dmap(mapping), dtable(head_table), dslot(head_slot);
    DeviceBuffer<uint8_t> kc(rows * D), vc(rows * D);
    DeviceBuffer<float> ks(rows), vs(rows);
    kc.poison();
    vc.poison();
    ks.poison();
    vs.poison();
    KVWriteArgs a;
    a.k = dk.get();
    a.v = dv.get();
    a.slot_mapping = dmap.get();
    a.num_tokens = T;
    a.num_kv_heads = H;
    a.head_dim = D;
    a.block_size = bs;
    if (c.ragged) {
      a.head_table = dtable.get();
      a.head_slot = dslot.get();
      a.page_stride = static_cast<long long>(bs) * D;  // one head per page
    }
    ASSERT_EQ(write_kv_cache_fp8(a, {kc.get(), vc.get(), ks.get(), vs.get()}, nullptr), cudaSuccess);
    const std::vector<uint8_t> kcodes = kc.download(), vcodes = vc.download();
    const std::vector<float> kscales = ks.download(), vscales = vs.download();
    std::vector<char> written(rows, 0);
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h) {
        const int slot = mapping[c.ragged ? static_cast<size_t>(h) * T + t : t];
        if (slot < 0) continue;
        const size_t row = c.ragged ? static_cast<size_t>(slot)  // page (slot / bs) of one head, offset slot % bs
                                    : (static_cast<size_t>(slot / bs) * H + h) * bs + slot % bs;
        written[row] = 1;
        for (int kv = 0; kv < 2; ++kv) {
          const std::vector<float>& src = kv == 0 ? k : v;
          std::vector<float> want(src.begin() + (static_cast<size_t>(t) * H + h) * D,
                                  src.begin() + (static_cast<size_t>(t) * H + h + 1) * D);
          const float want_scale = head_vector_fp8_scale(want.data(), D);
          round_head_vector_fp8(want.data(), D);
          const float scale = (kv == 0 ? kscales : vscales)[row];
          ASSERT_EQ(scale, want_scale) << "token " << t << " head " << h;
          const uint8_t* codes = (kv == 0 ? kcodes : vcodes).data() + row * D;
          for (int i = 0; i < D; ++i)
            ASSERT_EQ(kv_fp8_dequantize(codes[i], scale), want[i]) << "token " << t << " head " << h << " element " << i;
        }
      }
    // Every other row keeps its poison (0xff codes, NaN scales).
    for (size_t r = 0; r < rows; ++r) {
      if (written[r]) continue;
      uint32_t bits;
      std::memcpy(&bits, &kscales[r], 4);
      ASSERT_EQ(bits, 0xffffffffu) << "row " << r << " written";
      ASSERT_EQ(kcodes[r * D], 0xff) << "row " << r << " written";
    }
  }
}

TEST(CudaKVFp8Write, RejectsBadSizes) {
  KVWriteArgs a;
  a.num_tokens = 1;
  a.num_kv_heads = 1;
  a.block_size = 16;
  a.head_dim = 48;  // not a multiple of 32
  uint8_t* p = reinterpret_cast<uint8_t*>(16);
  float* f = reinterpret_cast<float*>(16);
  EXPECT_EQ(write_kv_cache_fp8(a, {p, p, f, f}, nullptr), cudaErrorInvalidValue);
  a.head_dim = 64;
  EXPECT_EQ(write_kv_cache_fp8(a, {nullptr, p, f, f}, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace origami::cuda
