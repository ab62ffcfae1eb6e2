#pragma once
// FP8 Linear layers through cuBLASLt on Hopper: y[m, n] = (x[m, k] . w[n, k]^T) * x_scale[i] *
// w_scale[j], x and w E4M3 codes, both K-major (cuBLASLt's FP8 "TN" layout, which is HF's [n, k]),
// fp32 accumulation, y bf16. The per-token and per-channel scales are applied either by
// cuBLASLt's outer-vector scaling (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F), or by an
// "epilogue": the GEMM writes fp32 with unit scales and a small kernel scales it into y (which
// needs an fp32 scratch of [m, n]). Measured on H100 (docs/kernels.md, FP8 GEMMs), the epilogue
// is faster up to kEpilogueMaxRows rows (decode) and the outer-vector kernels above; the epilogue
// also serves every shape where the library lacks outer-vector scaling. Like Gemm, a fixed workspace and a plan cache
// per shape keep every call graph-capturable once a shape has been planned.
//
// Split-K: at decode's row counts the library's 128-wide output tiles leave most SMs idle for the
// narrow projections (o and down: n / 128 = 32 tiles for 132 SMs), and cuBLASLt's FP8 kernels take
// no split-K configuration (docs/kernels.md). So Fp8Gemm splits K itself: one strided-batched
// cuBLASLt call computes `splits` fp32 partial products over consecutive K ranges (every split
// reads its own columns of w and x: the weights are still read once), and one kernel adds them in
// split order and applies the scales (launch_sum_scale_fp8_partials). split_k_rule() says where
// it measured faster; the partials need splits x m x n floats of scratch (max_scratch_floats()).
//
// Accumulation: Hopper's FP8 tensor-core instructions accumulate in fewer bits than fp32 (about
// 14 of mantissa). By default cuBLASLt promotes each short run of them into fp32 registers
// ("split" accumulation, the training-grade path). With fast accumulation
// (CUBLASLT_MATMUL_DESC_FAST_ACCUM) the whole K sum stays in the tensor cores' accumulator: fewer
// instructions, the precision of the forward passes that FP8 inference stacks run (TransformerEngine's
// forward GEMMs, fbgemm's FP8 GEMMs, CUTLASS's FP8FastAccum schedules). Chosen per Fp8Gemm
// (BackendOptions::fp8_fast_accumulation); the GPU tests bound each by its own error model.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace origami::cuda {

class Fp8Gemm {
 public:
  enum class Scaling { kOuterVector, kEpilogue };
  static constexpr int kEpilogueMaxRows = 64;
  static constexpr int kMaxSplits = 4;
  static constexpr int kSplitKMaxRows = 320;  // the rule never splits above

  Fp8Gemm();
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // Fast accumulation for every GEMM planned from now on (planned shapes keep theirs: set it
  // before the first call).
  void set_fast_accumulation(bool fast) { fast_accumulation_ = fast; }
  bool fast_accumulation() const { return fast_accumulation_; }
  // Plans made from now on target `sms` SMs (cuBLASLt's SM count target; 0: the device's), for
  // products that run beside other kernels on a part of the GPU (sm_partition.h).
  void set_sm_count_target(int sms) { sm_count_target_ = sms; }
  // Products of 1 to `rows` rows (at most kFp8GemvMaxRows; 0: none) by the FP8 GEMV (fp8_gemv.h)
  // instead of cuBLASLt, where it serves them (BackendOptions::fp8_gemv_rows).
  void set_gemv_rows(int rows) { gemv_rows_ = rows; }
  // Products of up to `rows` rows (at most kFp8SmallGemmMaxRows; 0: none) that the GEMV does not
  // take by the few-row tensor-core GEMM (fp8_small_gemm.h) instead of cuBLASLt, where it serves
  // them (BackendOptions::fp8_small_gemm_rows).
  void set_small_gemm_rows(int rows) { small_gemm_rows_ = rows; }

  // The K splits that measured fastest on the H100 for m rows of an n x k projection on
  // `num_sms` SMs (1: no split); a pure function of the shape, so scratch can be sized before any
  // plan exists. Only splits that divide k into multiples of 16 (cuBLASLt's FP8 alignment).
  static int split_k_rule(int m, int n, int k, int num_sms, bool fast_accumulation);
  static bool split_divides(int k, int splits) { return splits >= 1 && k % (16 * splits) == 0; }
  // Splits linear() uses for this shape: the forced count where it divides k, else the rule; 1
  // where cuBLASLt has no batched plan for it.
  int splits_for(int m, int n, int k);
  // Whether products split K where split_k_rule() says (BackendOptions::fp8_split_k; on).
  void set_split_k(bool on) { split_k_ = on; }
  // Benchmarks and tests: split every product of more rows than the GEMV and small GEMM take into
  // `splits` (where it divides k); 0 returns to the rule.
  void force_splits(int splits) { forced_splits_ = splits; }
  // The most scratch any product of 1 to max_m rows of an n x k projection can need, from the rule
  // alone (no plans): what a caller allocates once, before graph capture.
  static size_t max_scratch_floats(int max_m, int n, int k, int num_sms, bool epilogue_everywhere);

  // Whether cuBLASLt runs outer-vector scaled FP8 GEMMs of this shape; decided once per shape.
  bool outer_vector_supported(int m, int n, int k);
  // Forces a scaling path (tests and benchmarks compare both).
  void force_scaling(Scaling scaling) { forced_ = scaling; has_forced_ = true; }
  void clear_forced_scaling() { has_forced_ = false; }
  // The path linear() takes for this shape.
  Scaling scaling_for(int m, int n, int k);

  // Benchmarks: how many algorithms cuBLASLt's heuristic offers for this shape on the path
  // scaling_for() picks (at most kMaxCandidates, best-ranked first), and which one linear() runs
  // (0, the heuristic's first choice, unless a benchmark picks another).
  static constexpr int kMaxCandidates = 8;
  int num_candidates(int m, int n, int k);
  void use_candidate(int m, int n, int k, int index);

  // k and n multiples of 16. acc: fp32 scratch, [m, n] on the epilogue path and [splits, m, n]
  // when the product splits K (may be null when neither: m > kEpilogueMaxRows with outer-vector
  // support and no split; max_scratch_floats() sizes it).
  void linear(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w, const float* w_scales, int n,
              __nv_bfloat16* y, float* acc, cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};  // the one linear() runs
    cublasLtMatmulAlgo_t candidates[kMaxCandidates]{};
    int num_candidates = 0;
    bool ok = false;
  };
  // Plans y (bf16, outer-vector scales) or acc (fp32, unit scales) for (m, n, k); with splits > 1,
  // `splits` batched fp32 partials over consecutive K ranges (unit scales).
  Plan& plan(int m, int n, int k, Scaling scaling, int splits = 1);
  void destroy(Plan& p);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<std::tuple<int, int, int, int, bool, int>, Plan> plans_;  // (m, n, k, scaling, fast accumulation, splits)
  int num_sms_ = 0;
  int forced_splits_ = 0;
  bool split_k_ = true;
  bool fast_accumulation_ = false;
  int gemv_rows_ = 0;
  int small_gemm_rows_ = 0;
  int sm_count_target_ = 0;
  Scaling forced_ = Scaling::kOuterVector;
  bool has_forced_ = false;
};

}  // namespace origami::cuda
