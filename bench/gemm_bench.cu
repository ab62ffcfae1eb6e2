// Decode GEMMs of an 8B model (Qwen3-8B / Llama-3.1-8B shapes) at small row counts: what the
// backend's cublasGemmEx call achieves next to the cuBLASLt algorithms its heuristic offers
// (top 1 and the best of up to 16, each timed), as bandwidth over the weight bytes, next to a
// measured device-to-device copy. Tells whether choosing the GEMM algorithm is worth doing.
// Weights rotate over copies totalling >= 512 MB so nothing is served from L2.
// Build: nvcc -std=c++17 -O3 -arch=sm_90 bench/gemm_bench.cu -lcublasLt -lcublas -o gemm_bench
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(call)                                                                                    \
  do {                                                                                              \
    cudaError_t e_ = (call);                                                                        \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)
#define CB(call)                                                                                   \
  do {                                                                                             \
    cublasStatus_t s_ = (call);                                                                    \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "cuBLAS error %s at %s:%d\n", cublasGetStatusString(s_), __FILE__, __LINE__); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

static __global__ void fill(__nv_bfloat16* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned x = (unsigned)i * 2654435761u ^ seed;
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    p[i] = __float2bfloat16(((x & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

template <typename F>
static float median_us(cudaStream_t s, int iters, int reps, F&& body) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a, s));
    for (int r = 0; r < reps; ++r) body(i * reps + r);
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1e3f / reps);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  double copy_gbs;
  {
    const size_t n = size_t(1) << 30;
    void *src, *dst;
    CK(cudaMalloc(&src, n));
    CK(cudaMalloc(&dst, n));
    CK(cudaMemset(src, 1, n));
    const float us = median_us(s, 20, 1, [&](int) { CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s)); });
    copy_gbs = 2.0 * n / us / 1e3;
    CK(cudaFree(src));
    CK(cudaFree(dst));
  }
  std::printf("GEMMBENCH device %s, copy %.0f GB/s (read+write)\n", prop.name, copy_gbs);

  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetStream(h, s));
  const size_t ws_bytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  CB(cublasSetWorkspace(h, ws, ws_bytes));
  cublasLtHandle_t lt;
  CB(cublasLtCreate(&lt));

  struct Shape {
    const char* name;
    int n, k;
    bool f32_out;
  };
  // y[m, n] = x[m, k] w[n, k]^T, the backend's layout.
  const Shape shapes[] = {{"qwen3 qkv", 6144, 4096, false},   {"qwen3 o", 4096, 4096, false},
                          {"qwen3 gate_up", 24576, 4096, false}, {"qwen3 down", 4096, 12288, false},
                          {"qwen3 lm_head", 151936, 4096, true}, {"llama gate_up", 28672, 4096, false},
                          {"llama down", 4096, 14336, false}};
  const int ms_list[] = {1, 64, 256};
  std::printf("GEMMBENCH %-14s %4s %8s %10s %8s %10s %8s %10s %8s\n", "shape", "m", "MB", "gemmEx_us", "GB/s", "lt1_us",
              "GB/s", "ltbest_us", "GB/s");
  double sum_default[3] = {0, 0, 0}, sum_best[3] = {0, 0, 0};
  for (const Shape& sh : shapes) {
    const size_t w_elems = size_t(sh.n) * sh.k;
    const int copies = std::max<int>(2, int((size_t(512) << 20) / (w_elems * 2)) + 1);
    std::vector<__nv_bfloat16*> w(copies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&w[c], w_elems * 2));
      fill<<<1024, 256, 0, s>>>(w[c], w_elems, 11 + c);
    }
    __nv_bfloat16* x;
    void* y;
    CK(cudaMalloc(&x, size_t(256) * sh.k * 2));
    CK(cudaMalloc(&y, size_t(256) * sh.n * 4));
    fill<<<256, 256, 0, s>>>(x, size_t(256) * sh.k, 7);
    const cudaDataType_t yt = sh.f32_out ? CUDA_R_32F : CUDA_R_16BF;
    for (int mi = 0; mi < 3; ++mi) {
      const int m = ms_list[mi];
      const float alpha = 1.f, beta = 0.f;
      const float us_default = median_us(s, 9, 10, [&](int i) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &alpha, w[i % copies], CUDA_R_16BF, sh.k, x,
                        CUDA_R_16BF, sh.k, &beta, y, yt, sh.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      // cuBLASLt: same problem, column-major D[n, m] = op(A)[n, k] B[k, m] with A = w (k x n, ld k).
      cublasLtMatmulDesc_t op;
      CB(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
      CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
      CB(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
      cublasLtMatrixLayout_t la, lb, lc;
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, sh.k, sh.n, sh.k));
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, sh.k, m, sh.k));
      CB(cublasLtMatrixLayoutCreate(&lc, yt, sh.n, m, sh.n));
      cublasLtMatmulPreference_t pref;
      CB(cublasLtMatmulPreferenceCreate(&pref));
      CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                              sizeof(ws_bytes)));
      cublasLtMatmulHeuristicResult_t res[16];
      int found = 0;
      CB(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 16, res, &found));
      float us_top1 = -1, us_best = 1e30f;
      for (int a = 0; a < found; ++a) {
        const float us = median_us(s, 7, 10, [&](int i) {
          CB(cublasLtMatmul(lt, op, &alpha, w[i % copies], la, x, lb, &beta, y, lc, y, lc, &res[a].algo, ws, ws_bytes, s));
        });
        if (a == 0) us_top1 = us;
        us_best = std::min(us_best, us);
      }
      const double mb = w_elems * 2 / 1e6;
      std::printf("GEMMBENCH %-14s %4d %8.1f %10.1f %8.0f %10.1f %8.0f %10.1f %8.0f (%d algos)\n", sh.name, m, mb,
                  us_default, mb / us_default * 1e3, us_top1, mb / us_top1 * 1e3, us_best, mb / us_best * 1e3, found);
      if (sh.name[0] == 'q') {
        const int per_model = sh.f32_out ? 1 : 36;
        sum_default[mi] += per_model * us_default;
        sum_best[mi] += per_model * us_best;
      }
      cublasLtMatmulPreferenceDestroy(pref);
      cublasLtMatrixLayoutDestroy(la);
      cublasLtMatrixLayoutDestroy(lb);
      cublasLtMatrixLayoutDestroy(lc);
      cublasLtMatmulDescDestroy(op);
    }
    for (auto p : w) CK(cudaFree(p));
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  for (int mi = 0; mi < 3; ++mi)
    std::printf("GEMMBENCH qwen3-8b step GEMMs at m=%d (sum of shapes alone): gemmEx %.2f ms, best Lt algo %.2f ms\n",
                ms_list[mi], sum_default[mi] / 1e3, sum_best[mi] / 1e3);
  return 0;
}
