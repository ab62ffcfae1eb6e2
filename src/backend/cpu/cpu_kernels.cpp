#include "backend/cpu/cpu_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

namespace origami::cpu {
namespace {

// Lane count of the dot-product accumulators: one vector register wide. The reduction order of a
// dot product is fixed by this constant alone (per build), whatever the caller.
#if defined(__AVX512F__)
#define ORIGAMI_CPU_LANES 16
constexpr int kNR = 4;  // 32 vector registers: 4 x 4 accumulators + operands
#else
#define ORIGAMI_CPU_LANES 8
constexpr int kNR = 3;  // 16 vector registers: 4 x 3 accumulators + operands
#endif
constexpr int kLanes = ORIGAMI_CPU_LANES;
constexpr int kMR = 4;
typedef float VecF __attribute__((vector_size(ORIGAMI_CPU_LANES * sizeof(float))));

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Fixed pairwise tree over the lanes, then the k % kLanes tail in order: the one definition of a
// dot product's arithmetic, used by every code path.
inline float finish_dot(VecF acc, const float* a, const float* b, int k_vec, int k) {
  float lanes[kLanes];
  std::memcpy(lanes, &acc, sizeof(lanes));
  for (int width = kLanes / 2; width > 0; width /= 2)
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  float s = lanes[0];
  for (int p = k_vec; p < k; ++p) s += a[p] * b[p];
  return s;
}

// MR rows of A times NR rows of W, every (row, column) pair with its own accumulator.
template <int MR, int NR>
void micro_kernel(int k, const float* a, size_t lda, const float* w, size_t ldw, const float* bias, float* c,
                  size_t ldc) {
  VecF acc[MR][NR];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) acc[r][j] = VecF{};
  const int k_vec = k - k % kLanes;
  for (int p = 0; p < k_vec; p += kLanes) {
    VecF wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load(w + j * ldw + p);
    for (int r = 0; r < MR; ++r) {
      const VecF av = load(a + r * lda + p);
      for (int j = 0; j < NR; ++j) acc[r][j] += av * wv[j];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < NR; ++j) {
      float s = finish_dot(acc[r][j], a + r * lda, w + j * ldw, k_vec, k);
      if (bias) s += bias[j];
      c[r * ldc + j] = s;
    }
}

using MicroFn = void (*)(int, const float*, size_t, const float*, size_t, const float*, float*, size_t);

template <int MR, int... NRs>
constexpr auto micro_row(std::integer_sequence<int, NRs...>) {
  return std::array<MicroFn, sizeof...(NRs)>{&micro_kernel<MR, NRs + 1>...};
}
template <int... MRs>
constexpr auto micro_table(std::integer_sequence<int, MRs...>) {
  return std::array<std::array<MicroFn, kNR>, sizeof...(MRs)>{
      micro_row<MRs + 1>(std::make_integer_sequence<int, kNR>{})...};
}
// kMicro[mr - 1][nr - 1]: the kernel for an mr x nr tile (edges use the smaller ones).
constexpr auto kMicro = micro_table(std::make_integer_sequence<int, kMR>{});

}  // namespace

float dot(const float* a, const float* b, int k) {
  VecF acc = VecF{};
  const int k_vec = k - k % kLanes;
  for (int p = 0; p < k_vec; p += kLanes) acc += load(a + p) * load(b + p);
  return finish_dot(acc, a, b, k_vec, k);
}

void gemm_nt(int m, int n, int k, const float* a, size_t lda, const float* w, size_t ldw, const float* bias,
             float* c, size_t ldc, ThreadPool* pool) {
  if (m <= 0 || n <= 0) return;
  // Small products run on one thread: handing out work costs more than it saves below roughly
  // this many multiply-adds.
  constexpr double kMinParallelMacs = 128.0 * 1024;
  const int num_threads =
      pool && static_cast<double>(m) * n * k >= kMinParallelMacs ? pool->num_threads() : 1;
  // Column blocks: a block of W (nb x k) should stay in L2 while the row blocks of A pass over
  // it; also cut N finely enough that every thread gets work when m is small (decode).
  const int cache_nb = std::max(kNR, static_cast<int>((256 * 1024 / sizeof(float)) / std::max(k, 1)) / kNR * kNR);
  const int split_nb = ((n + 2 * num_threads - 1) / (2 * num_threads) + kNR - 1) / kNR * kNR;
  const int nb = std::max(kNR, std::min(cache_nb, split_nb));
  const int mb = 64;
  const int num_nblocks = (n + nb - 1) / nb;
  const int num_mblocks = (m + mb - 1) / mb;
  parallel_for(num_threads > 1 ? pool : nullptr, num_nblocks * num_mblocks, [&](int item) {
    const int n0 = (item % num_nblocks) * nb;
    const int m0 = (item / num_nblocks) * mb;
    const int n1 = std::min(n, n0 + nb);
    const int m1 = std::min(m, m0 + mb);
    for (int j = n0; j < n1; j += kNR) {
      const int nr = std::min(kNR, n1 - j);
      const float* wj = w + static_cast<size_t>(j) * ldw;
      const float* bj = bias ? bias + j : nullptr;
      for (int i = m0; i < m1; i += kMR) {
        const int mr = std::min(kMR, m1 - i);
        kMicro[mr - 1][nr - 1](k, a + static_cast<size_t>(i) * lda, lda, wj, ldw, bj,
                               c + static_cast<size_t>(i) * ldc + j, ldc);
      }
    }
  });
}

void rms_norm(int rows, int n, const float* x, size_t ldx, const float* w, float eps, float* out, size_t ldo) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * ldx;
    float* orow = out + static_cast<size_t>(r) * ldo;
    // The mean of squares in double: the reference's fp32 mean is itself a rounding of this.
    double sum_sq = 0.0;
    for (int i = 0; i < n; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float variance = static_cast<float>(sum_sq / n);
    const float inv_rms = 1.0f / std::sqrt(variance + eps);
    for (int i = 0; i < n; ++i) orow[i] = w[i] * (xr[i] * inv_rms);
  }
}

std::vector<float> rope_inv_freq(const RopeConfig& rope, int head_dim) {
  const int half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(rope.theta, exponent);
  }
  if (rope.type == "llama3") {
    // Llama 3.1: long wavelengths are slowed down by `factor`, short ones kept, and the band in
    // between interpolated smoothly (same formula as the reference configuration code).
    const double pi = 3.14159265358979323846;
    const float old_context = static_cast<float>(rope.original_max_position_embeddings);
    const float low_freq_wavelen = old_context / rope.low_freq_factor;
    const float high_freq_wavelen = old_context / rope.high_freq_factor;
    for (int i = 0; i < half; ++i) {
      const float f = inv_freq[i];
      const float wavelen = static_cast<float>(2.0 * pi) / f;
      float scaled = wavelen > low_freq_wavelen ? f / rope.factor : f;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      if (medium) {
        const float smooth =
            (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
        scaled = (1.0f - smooth) * scaled / rope.factor + smooth * scaled;
      }
      inv_freq[i] = scaled;
    }
  }
  return inv_freq;
}

void rope_cos_sin(int position, const float* inv_freq, int half_dim, float* cos_out, float* sin_out) {
  for (int i = 0; i < half_dim; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    cos_out[i] = std::cos(angle);
    sin_out[i] = std::sin(angle);
  }
}

void apply_rope(float* x, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int h = 0; h < num_heads; ++h) {
    float* xh = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float x1 = xh[i];
      const float x2 = xh[i + half];
      xh[i] = x1 * cos[i] - x2 * sin[i];
      xh[i + half] = x2 * cos[i] + x1 * sin[i];
    }
  }
}

void silu_mul(int rows, int n, const float* gate, const float* up, size_t ld_in, float* out, size_t ld_out) {
  for (int r = 0; r < rows; ++r) {
    const float* g = gate + static_cast<size_t>(r) * ld_in;
    const float* u = up + static_cast<size_t>(r) * ld_in;
    float* o = out + static_cast<size_t>(r) * ld_out;
    for (int i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void add_inplace(float* x, const float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] += y[i];
}

}  // namespace origami::cpu
