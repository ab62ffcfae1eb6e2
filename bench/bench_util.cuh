#pragma once
// Helpers shared by the attention benchmarks (attention_bench.cu, ragged_attention_bench.cu,
// overlap_bench.cu): a CUDA error check that exits, random bf16 and E4M3 fills on the device, the
// median of timed runs, the device-to-device copy bandwidth their results are set against, and
// the parsing of their comma-separated list options.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CK(call)                                                                                                \
  do {                                                                                                          \
    cudaError_t e_ = (call);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
      std::exit(1);                                                                                             \
    }                                                                                                           \
  } while (0)

// Values in [-1, 1), a hash of the index and seed (no host data to copy).
static __global__ void fill_random(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.f - 0.5f) * 2.f);
  }
}

// Median over `iters` runs of body(i), each timed alone between two events on `stream` (the
// default stream unless given: body's work must be ordered after and before them there).
template <typename F>
static float median_ms(F&& body, int iters, cudaStream_t stream = 0) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a, stream));
    body(i);
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bandwidth of a 1 GiB device-to-device copy, bytes read + written (GB/s), printed as well.
inline double measure_copy_gbs(int iters) {
  const size_t n = size_t(1) << 30;
  void *src, *dst;
  CK(cudaMalloc(&src, n));
  CK(cudaMalloc(&dst, n));
  CK(cudaMemset(src, 1, n));
  for (int i = 0; i < 3; ++i) CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice));
  const float ms = median_ms([&](int) { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice)); }, iters);
  const double gbs = 2.0 * n / ms / 1e6;
  std::printf("device-to-device copy: %.0f GB/s (read+write)\n", gbs);
  CK(cudaFree(src));
  CK(cudaFree(dst));
  return gbs;
}

// Random E4M3 codes without NaN (exponent field <= 13) and one scale per head vector.
static __global__ void fill_codes(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 0x9e3779b9u;
    h ^= h >> 15;
    p[i] = static_cast<uint8_t>(h & 0xef);
  }
}
static __global__ void fill_value(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) p[i] = v;
}

// "64,256" -> {64, 256}; exits on anything but positive integers.
inline std::vector<int> parse_list(const char* flag, const std::string& text, int min_value = 1) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    char* end = nullptr;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < min_value || v > (1 << 20)) {
      std::fprintf(stderr, "%s: expected a comma-separated list of positive integers, got '%.100s'\n", flag, text.c_str());
      std::exit(2);
    }
    out.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  return out;
}

// Prints the current device's name, SM count and L2 size after `tag`; returns the SM count.
inline int print_device(const char* tag) {
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  std::printf("%sdevice: %s, %d SMs, L2 %d MB\n", tag, prop.name, sms, prop.l2CacheSize >> 20);
  return sms;
}

// A decode batch's per-sequence arrays on the device: one query token a sequence (q_indptr 0, 1,
// ...), `ctx` entries each, sequence i's pages at page_indices[i * pages_per_seq ..].
struct DecodeRows {
  int32_t* q_indptr = nullptr;     // [batch + 1]
  int32_t* page_indptr = nullptr;  // [batch + 1]
  int32_t* kv_len = nullptr;       // [batch]
};
inline DecodeRows upload_decode_rows(int batch, int ctx, int pages_per_seq) {
  std::vector<int32_t> q_indptr(batch + 1), page_indptr(batch + 1), kv_len(batch, ctx);
  for (int i = 0; i <= batch; ++i) q_indptr[i] = i, page_indptr[i] = i * pages_per_seq;
  DecodeRows r;
  CK(cudaMalloc(&r.q_indptr, sizeof(int32_t) * (batch + 1)));
  CK(cudaMalloc(&r.page_indptr, sizeof(int32_t) * (batch + 1)));
  CK(cudaMalloc(&r.kv_len, sizeof(int32_t) * batch));
  CK(cudaMemcpy(r.q_indptr, q_indptr.data(), sizeof(int32_t) * (batch + 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.page_indptr, page_indptr.data(), sizeof(int32_t) * (batch + 1), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(r.kv_len, kv_len.data(), sizeof(int32_t) * batch, cudaMemcpyHostToDevice));
  return r;
}
inline void free_decode_rows(const DecodeRows& r) {
  CK(cudaFree(r.q_indptr));
  CK(cudaFree(r.page_indptr));
  CK(cudaFree(r.kv_len));
}
