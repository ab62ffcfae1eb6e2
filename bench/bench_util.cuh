#pragma once
// Helpers shared by the attention benchmarks (attention_bench.cu, ragged_attention_bench.cu):
// a CUDA error check that exits, random bf16 fill on the device, the median of timed runs, and
// the device-to-device copy bandwidth their results are set against.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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

// Median over `iters` runs of body(i), each timed alone between two events on the default stream.
template <typename F>
static float median_ms(F&& body, int iters) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a));
    body(i);
    CK(cudaEventRecord(b));
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
static double measure_copy_gbs(int iters) {
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
