// Random weights for shapes whose checkpoints are not available (8B+ benchmarks). An 8B model is
// 16 GB in bf16, so generation must be parallel and cheap per element: every element is a pure
// function of (seed, tensor index, element index) — a counter-based generator — which also makes
// the result independent of the thread count.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "core/check.h"
#include "model/weight_layout.h"
#include "model/weights.h"

namespace origami {
namespace {

constexpr float kMatrixStd = 0.02f;
constexpr float kBiasStd = 0.01f;
constexpr size_t kAlignment = 64;  // cache line; also satisfies any SIMD load of a row start

inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer: a bijection with good avalanche
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Approximately standard normal: the sum of four 16-bit uniforms (Irwin-Hall, n = 4) has mean 2
// and variance 1/3; centred and scaled it has unit variance and is bounded by +-3.46.
inline float approx_normal(uint64_t h) {
  const uint32_t s = static_cast<uint32_t>(h & 0xffff) + static_cast<uint32_t>((h >> 16) & 0xffff) +
                     static_cast<uint32_t>((h >> 32) & 0xffff) + static_cast<uint32_t>(h >> 48);
  constexpr float kScale = 1.7320508f / 65536.0f;  // sqrt(3) / 2^16
  return (static_cast<float>(s) - 2.0f * 65535.0f) * kScale;
}

class DummyWeightStorage : public WeightStorage {
 public:
  explicit DummyWeightStorage(size_t num_bytes)
      : num_bytes_(num_bytes),
        data_(static_cast<uint8_t*>(::operator new(std::max<size_t>(num_bytes, 1), std::align_val_t(kAlignment)))) {}
  ~DummyWeightStorage() override { ::operator delete(data_, std::align_val_t(kAlignment)); }
  DummyWeightStorage(const DummyWeightStorage&) = delete;
  DummyWeightStorage& operator=(const DummyWeightStorage&) = delete;

  uint8_t* data() { return data_; }
  size_t num_bytes() const { return num_bytes_; }

 private:
  size_t num_bytes_;
  uint8_t* data_;  // left uninitialised: the generator first-touches it from all threads
};

struct Chunk {
  size_t slot;
  int64_t begin;
  int64_t count;
};

template <typename Store>
void fill(uint64_t key, WeightKind kind, int64_t begin, int64_t count, Store store) {
  if (kind == WeightKind::kNorm) {
    for (int64_t i = begin; i < begin + count; ++i) store(i, 1.0f);
    return;
  }
  const float stddev = kind == WeightKind::kBias ? kBiasStd : kMatrixStd;
  for (int64_t i = begin; i < begin + count; ++i) {
    store(i, stddev * approx_normal(mix64(key + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull)));
  }
}

}  // namespace

ModelWeights make_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed) {
  ORIGAMI_CHECK_MSG(dtype != DType::kF8E4M3, "dummy weights are generated in F32/BF16/F16, then quantized");
  ModelWeights weights;
  std::vector<WeightSlot> slots = weight_slots(config, &weights);
  const size_t elem = dtype_size(dtype);

  std::vector<size_t> offsets(slots.size());
  size_t total = 0;
  for (size_t s = 0; s < slots.size(); ++s) {
    offsets[s] = total;
    int64_t n = 1;
    for (int64_t d : slots[s].shape) n *= d;
    total += (static_cast<size_t>(n) * elem + kAlignment - 1) / kAlignment * kAlignment;
  }
  auto storage = std::make_shared<DummyWeightStorage>(total);

  // Work items of at most 256K elements so that threads stay balanced across tensor sizes.
  constexpr int64_t kChunkElems = 1 << 18;
  std::vector<Chunk> chunks;
  std::vector<uint64_t> keys(slots.size());
  for (size_t s = 0; s < slots.size(); ++s) {
    TensorView& v = *slots[s].view;
    v.name = slots[s].name;
    v.dtype = dtype;
    v.shape = slots[s].shape;
    v.data = storage->data() + offsets[s];
    keys[s] = mix64(seed * 0x9e3779b97f4a7c15ull + mix64(s + 1));
    const int64_t n = v.numel();
    for (int64_t b = 0; b < n; b += kChunkElems) chunks.push_back({s, b, std::min(kChunkElems, n - b)});
  }

#pragma omp parallel for schedule(dynamic, 4)
  for (int64_t c = 0; c < static_cast<int64_t>(chunks.size()); ++c) {
    const Chunk& ch = chunks[c];
    uint8_t* base = storage->data() + offsets[ch.slot];
    const WeightKind kind = slots[ch.slot].kind;
    switch (dtype) {
      case DType::kF32: {
        float* p = reinterpret_cast<float*>(base);
        fill(keys[ch.slot], kind, ch.begin, ch.count, [p](int64_t i, float v) { p[i] = v; });
        break;
      }
      case DType::kBF16: {
        uint16_t* p = reinterpret_cast<uint16_t*>(base);
        fill(keys[ch.slot], kind, ch.begin, ch.count, [p](int64_t i, float v) { p[i] = f32_to_bf16(v); });
        break;
      }
      case DType::kF16: {
        uint16_t* p = reinterpret_cast<uint16_t*>(base);
        fill(keys[ch.slot], kind, ch.begin, ch.count, [p](int64_t i, float v) { p[i] = f32_to_f16(v); });
        break;
      }
      case DType::kF8E4M3:  // rejected above: FP8 needs scales (quantize bf16 dummies instead)
        break;
    }
  }

  if (config.tie_word_embeddings) weights.lm_head = weights.embed_tokens;
  weights.storage.push_back(std::move(storage));
  return weights;
}

}  // namespace origami
