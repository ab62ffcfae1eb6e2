#include "backend/cuda/fp8_gemm.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/fp8_gemv.h"
#include "backend/cuda/fp8_kernels.h"
#include "backend/cuda/fp8_small_gemm.h"
#include "core/check.h"

namespace origami::cuda {

Fp8Gemm::Fp8Gemm() {
  ORIGAMI_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = 32u << 20;  // fixed: no allocation inside graph capture
  ORIGAMI_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  int device = 0;
  ORIGAMI_CUDA_CHECK(cudaGetDevice(&device));
  ORIGAMI_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
}

Fp8Gemm::~Fp8Gemm() {
  for (auto& [key, p] : plans_) destroy(p);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
  if (workspace_ != nullptr) cudaFree(workspace_);
}

void Fp8Gemm::destroy(Plan& p) {
  if (p.desc != nullptr) cublasLtMatmulDescDestroy(p.desc);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d})
    if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  p = Plan{};
}

Fp8Gemm::Plan& Fp8Gemm::plan(int m, int n, int k, Scaling scaling, int splits) {
  if (splits > 1) scaling = Scaling::kEpilogue;  // partials are fp32 with unit scales
  const auto key = std::make_tuple(m, n, k, static_cast<int>(scaling), fast_accumulation_, splits);
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan& p = plans_[key];
  // Column-major view, as in Gemm: D^T [n, m] = op(A) [n, k] * B [k, m], A = w stored [k, n]
  // column-major (ld k) and transposed, B = x^T [k, m] (ld k). Scale of A: per row of op(A) = per
  // output channel; scale of B: per column = per token.
  const bool outer = scaling == Scaling::kOuterVector;
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
  const int8_t fast = fast_accumulation_ ? 1 : 0;
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  if (sm_count_target_ > 0) {
    const int32_t target = sm_count_target_;
    ORIGAMI_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof target));
  }
  if (outer) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
    // Placeholder pointers for the heuristic (the real ones are set per call); any device address.
    const void* any = workspace_;
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &any, sizeof any));
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &any, sizeof any));
  }
  // Split s: batch i is K range [i k / s, (i + 1) k / s) of both operands (the same leading
  // dimension k, each batch k / s codes further on) into its own fp32 [m, n] plane of acc.
  const int kk = k / splits;
  ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_8F_E4M3, kk, n, k));
  ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_8F_E4M3, kk, m, k));
  ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, outer ? CUDA_R_16BF : CUDA_R_32F, n, m, n));
  if (splits > 1) {
    const int32_t count = splits;
    const int64_t operand_stride = kk, plane = static_cast<int64_t>(m) * n;
    for (cublasLtMatrixLayout_t l : {p.a, p.b, p.d}) {
      ORIGAMI_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      const int64_t stride = l == p.d ? plane : operand_stride;
      ORIGAMI_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
    }
  }
  cublasLtMatmulPreference_t pref = nullptr;
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates]{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, kMaxCandidates, results, &found);
  if (st == CUBLAS_STATUS_SUCCESS)
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates[p.num_candidates++] = results[i].algo;
  cublasLtMatmulPreferenceDestroy(pref);
  p.ok = p.num_candidates > 0;
  if (p.ok) p.algo = p.candidates[0];
  return p;
}

int Fp8Gemm::split_k_rule(int m, int n, int k, int num_sms, bool fast_accumulation) {
  // Measured on 132-SM parts (H100 SXM; Fp8GemmBench.SplitKAtDecodeRows over Llama-3.1-8B and
  // Qwen3-8B at TP = 1 and 2, docs/kernels.md): two splits win where the unsplit GEMM has few
  // output tiles (n <= 4096) at the row counts where the heuristic's tiles leave SMs idle, by
  // 1.02-1.16x a layer; the faster fast-accumulation GEMMs gain nothing past 256 rows. Elsewhere,
  // and on parts with another SM count, no split (the H200's 132 SMs run the same kernels, not
  // measured).
  if (num_sms != 132 || !split_divides(k, 2) || m > (fast_accumulation ? 256 : 320)) return 1;
  if (n <= 3072 && k >= 4096) return m > 64 && m <= 288 ? 2 : 1;                 // q|k|v at TP = 2
  if (n <= 4096 && k >= 8192) return 2;                                          // down at TP = 1
  if (n <= 4096 && k >= 4096 && m > 64 && (m <= 192 || m > 256)) return 2;       // o at TP = 1, down at TP = 2
  if (n <= 4096 && k >= 2048 && m > 64 && m <= 160) return 2;                    // o at TP = 2
  return 1;
}

int Fp8Gemm::splits_for(int m, int n, int k) {
  const int want = forced_splits_ > 0 ? forced_splits_ : split_k_ ? split_k_rule(m, n, k, num_sms_, fast_accumulation_) : 1;
  if (want <= 1 || want > kMaxSplits || !split_divides(k, want)) return 1;
  return plan(m, n, k, Scaling::kEpilogue, want).ok ? want : 1;
}

size_t Fp8Gemm::max_scratch_floats(int max_m, int n, int k, int num_sms, bool epilogue_everywhere) {
  size_t most = static_cast<size_t>(epilogue_everywhere ? max_m : std::min(max_m, kEpilogueMaxRows)) * n;
  for (int m = 1; m <= std::min(max_m, kSplitKMaxRows); ++m) {
    const int splits = std::max(split_k_rule(m, n, k, num_sms, false), split_k_rule(m, n, k, num_sms, true));
    if (splits > 1 && split_divides(k, splits)) most = std::max(most, static_cast<size_t>(splits) * m * n);
  }
  return most;
}

int Fp8Gemm::num_candidates(int m, int n, int k) { return plan(m, n, k, scaling_for(m, n, k)).num_candidates; }

void Fp8Gemm::use_candidate(int m, int n, int k, int index) {
  Plan& p = plan(m, n, k, scaling_for(m, n, k));
  ORIGAMI_CHECK_MSG(index >= 0 && index < p.num_candidates, "no such FP8 GEMM algorithm candidate");
  p.algo = p.candidates[index];
}

bool Fp8Gemm::outer_vector_supported(int m, int n, int k) { return plan(m, n, k, Scaling::kOuterVector).ok; }

Fp8Gemm::Scaling Fp8Gemm::scaling_for(int m, int n, int k) {
  if (has_forced_) return forced_;
  if (m <= kEpilogueMaxRows) return Scaling::kEpilogue;
  return outer_vector_supported(m, n, k) ? Scaling::kOuterVector : Scaling::kEpilogue;
}

void Fp8Gemm::linear(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w, const float* w_scales,
                     int n, __nv_bfloat16* y, float* acc, cudaStream_t stream) {
  if (m == 0) return;
  if (m <= gemv_rows_ && fp8_gemv_supported(m, k, x, w)) {
    launch_fp8_gemv(x, x_scales, m, k, w, w_scales, n, y, stream);
    return;
  }
  if (m <= small_gemm_rows_ && fp8_small_gemm_supported(m, k, x, w)) {
    launch_fp8_small_gemm(x, x_scales, m, k, w, w_scales, n, y, stream);
    return;
  }
  const int splits = splits_for(m, n, k);
  if (splits > 1) {
    Plan& p = plan(m, n, k, Scaling::kEpilogue, splits);
    ORIGAMI_CHECK_MSG(acc != nullptr, "FP8 split-K GEMM without its fp32 scratch");
    const float alpha = 1.0f, beta = 0.0f;
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, acc, p.d, acc, p.d, &p.algo,
                                        workspace_, workspace_bytes_, stream));
    launch_sum_scale_fp8_partials(acc, splits, m, n, x_scales, w_scales, y, stream);
    return;
  }
  const Scaling scaling = scaling_for(m, n, k);
  Plan& p = plan(m, n, k, scaling);
  ORIGAMI_CHECK_MSG(p.ok, "cuBLASLt has no FP8 GEMM for this shape (k and n must be multiples of 16)");
  const float alpha = 1.0f, beta = 0.0f;
  if (scaling == Scaling::kOuterVector) {
    ORIGAMI_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof w_scales));
    ORIGAMI_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof x_scales));
    ORIGAMI_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo,
                                        workspace_, workspace_bytes_, stream));
    return;
  }
  ORIGAMI_CHECK_MSG(acc != nullptr, "FP8 GEMM epilogue path without its fp32 scratch");
  ORIGAMI_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, acc, p.d, acc, p.d, &p.algo,
                                      workspace_, workspace_bytes_, stream));
  launch_scale_fp8_product(acc, m, n, x_scales, w_scales, y, stream);
}

}  // namespace origami::cuda
