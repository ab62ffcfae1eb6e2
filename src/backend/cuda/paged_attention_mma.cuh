#pragma once
// Warp-level building blocks of the attention kernel: 16-byte async copies into shared memory,
// ldmatrix fragment loads and the bf16 m16n8k16 tensor-core product with fp32 accumulators.
// Fragment layouts (PTX ISA, mma.m16n8k16): with g = lane / 4 and t = lane % 4,
//   A (16x16, row-major): {a0,a1} = (g, 2t..2t+1), {a2,a3} = (g+8, 2t..), {a4,a5} = (g, 2t+8..),
//                         {a6,a7} = (g+8, 2t+8..)
//   B (16x8, "col"):      {b0,b1} = (k 2t..2t+1, n g), {b2,b3} = (k 2t+8.., n g)
//   C (16x8, fp32):       c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace origami::cuda::attn {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies the first src_bytes (0..16) of 16 bytes global -> shared without passing through
// registers, and zero-fills the rest of the 16.
// .L2::128B: a miss fetches the whole 128-byte line into L2, not only the 32-byte sectors asked.
// The KV tiles are runs of whole lines read once, and the hint measured 0.8-1.7% faster decode
// attention on the H100 (FP8 and bf16, batch 64-472, 1K-4K entries; .L2::64B and .L2::256B no
// faster than none: docs/kernels.md).
__device__ __forceinline__ void cp_async_16_bytes(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
// All 16 bytes, or (!valid) none: the destination zero-filled (keeps padding rows finite: 0 * NaN
// would poison P·V).
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  cp_async_16_bytes(smem, gmem, valid ? 16 : 0);
}
// 4-byte variant (.ca: the only size below 16 .cg lacks), zero-filled when !valid: per-entry
// FP8 scales, whose runs are as short as a page.
__device__ __forceinline__ void cp_async_4(void* smem, const void* gmem, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a * b  (16x16 bf16 by 16x8 bf16, fp32 accumulate)
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 values as one bf16x2 register, the first in the low half (the lower column).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// c += a * b with f16 inputs (the FP8 cache's path: its codes become f16 exactly).
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Scale of e4m3x4_to_f16x4's values: each f16 is its code's value times 2^-8.
constexpr float kE4M3ToF16Scale = 256.0f;

// Four E4M3 codes (byte i of `w` is code i) as two f16x2 registers (codes 0, 1 and 2, 3, the
// lower code in the low half), each f16 exactly its code's value times 2^-8, with integer ops
// only (the conversion instructions run at a quarter of the integer rate and made the kernel
// compute-bound). E4M3 s.eeee.mmm placed as f16 s.0eeee.mmm0000000 reads as 2^(e-15) 1.mmm
// for e > 0 and 0.mmm 2^-14 for e = 0: the code's 2^(e-7) 1.mmm and 0.mmm 2^-6 times 2^-8,
// subnormals included.
// Two E4M3 codes in the high bytes of the two 16-bit halves of `a` (low bytes ignored) as f16x2.
__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t a) {
  return (a & 0x80008000u) | ((a & 0x7f007f00u) >> 1);
}
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = e4m3x2_hi_to_f16x2(__byte_perm(w, 0u, 0x1404));  // code 0 in bits 8..15, code 1 in bits 24..31
  hi = e4m3x2_hi_to_f16x2(__byte_perm(w, 0u, 0x3424));  // codes 2 and 3 likewise
}

// Four E4M3 codes (byte i of `w` is code i) as two f16x2: codes 0, 1 in `lo`, codes 2, 3 in `hi`
// (the lower code in the low half), exactly their values (sm_89+ hardware conversion: one
// instruction for two codes, against four integer ops for e4m3x4_to_f16x4's pair; it runs on a
// slower pipe, which the narrow decode kernel can afford and the wide one, converting whole tiles
// between barriers, could not). The halves are split inside the asm (mov.b32 {l, h}) so that
// ptxas can read the high half in place, where a shift (w >> 16) first cost an instruction.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// 2^x on the special-function unit with subnormals flushed (ex2.approx.ftz). exp2f compiles to
// the same instruction wrapped in a subnormal fix-up (a compare, two predicated multiplies: four
// instructions a call), identical for x >= -126; below that this gives 0 instead of a value under
// 2^-126. In the online softmax those are probabilities and rescale factors at least 2^126 below
// the row's largest term (which contributes 1), so no output moves.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace origami::cuda::attn
