#include "backend/cuda/fp8_small_gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pointer_alignment.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

constexpr int kThreads = 256;    // 8 warps a CTA
constexpr int kTileN = 8;        // output channels of one MMA (its n)
constexpr int kTiles = 2;        // n-tiles a CTA owns: 16 channels
constexpr int kSlices = 4;       // warps per n-tile, each a quarter of K's chunks
constexpr int kChunkBytes = 64;  // codes of one row a warp's four lanes of a group read per chunk
static_assert(kTiles * kSlices * 32 == kThreads, "every warp owns one (tile, slice)");
static_assert(kTiles * kTileN * kFp8SmallGemmMaxRows == kThreads, "one thread per output of the CTA");

// d = a . b for one m16n8k32 E4M3 MMA (fp32 result, zero accumulator in).
__device__ __forceinline__ void mma_e4m3(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                         float (&d)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
#else
  d[0] = d[1] = d[2] = d[3] = 0.0f;
  __trap();  // E4M3 MMAs need sm_89 or newer (fp8_small_gemm_supported's callers run FP8 only there)
#endif
}

// One 64-code chunk: this lane's 16 bytes of its channel's row (b) and of x rows g and g + 8 (a0,
// a1). Within the chunk the codes are taken in a permuted order, the same for A and B: MMA s (0,
// 1) gives lane (g, t) the logical k 4t..4t+3 from bytes 16t + 8s + 0..3 and 16 + 4t..16 + 4t + 3
// from bytes 16t + 8s + 4..7, so the four lanes of a group cover the chunk's 64 bytes once over the
// two MMAs. Each MMA's fp32 result is added to the running sums (acc: rows g, g + 8 x columns 2t,
// 2t + 1 of the tile, the m16n8 accumulator's layout).
__device__ __forceinline__ void chunk_mma(const uint4& b, const uint4& a0, const uint4& a1, float (&acc)[4]) {
  float d[4];
  mma_e4m3(a0.x, a1.x, a0.y, a1.y, b.x, b.y, d);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += d[i];
  mma_e4m3(a0.z, a1.z, a0.w, a1.w, b.z, b.w, d);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += d[i];
}

// A CTA computes 16 output channels (two n-tiles of 8) for all m <= 16 rows of x. Warp w owns
// n-tile w % 2 and the chunks c = w / 2, w / 2 + 4, ... of K; each lane (g = lane / 4, t = lane % 4)
// reads 16 bytes of its channel's row per chunk (the weights, read once: __ldcs) and the same 16
// bytes of x rows g and g + 8 (a few KB every CTA reads: __ldg; zero past m), two chunks' loads
// issued before either is used. The four slices' sums meet in shared memory, added in slice order;
// each thread then scales one output (the epilogue's order: acc * row scale * column scale).
__global__ void __launch_bounds__(kThreads) fp8_small_gemm_kernel(const uint8_t* __restrict__ x,
                                                                  const float* __restrict__ x_scales, int m, int k,
                                                                  const uint8_t* __restrict__ w,
                                                                  const float* __restrict__ w_scales, int n,
                                                                  __nv_bfloat16* __restrict__ y) {
  __shared__ float partial[kSlices][kTiles][kFp8SmallGemmMaxRows][kTileN];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tile = warp % kTiles, slice = warp / kTiles;
  const int channel0 = blockIdx.x * (kTiles * kTileN);
  const int channel = min(channel0 + tile * kTileN + g, n - 1);  // a channel past n re-reads the last
  const int chunks = k / kChunkBytes;
  // 16-byte unit t of every chunk: unit 4c + t of the row.
  const uint4* wrow = reinterpret_cast<const uint4*>(w + static_cast<size_t>(channel) * k) + t;
  const bool has0 = g < m, has1 = g + 8 < m;
  const uint4* xrow0 = reinterpret_cast<const uint4*>(x + static_cast<size_t>(has0 ? g : 0) * k) + t;
  const uint4* xrow1 = reinterpret_cast<const uint4*>(x + static_cast<size_t>(has1 ? g + 8 : 0) * k) + t;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int c = slice;
  for (; c + kSlices < chunks; c += 2 * kSlices) {
    const size_t u0 = static_cast<size_t>(c) * 4, u1 = static_cast<size_t>(c + kSlices) * 4;
    const uint4 b0 = __ldcs(wrow + u0), b1 = __ldcs(wrow + u1);
    const uint4 a00 = has0 ? __ldg(xrow0 + u0) : zero, a10 = has1 ? __ldg(xrow1 + u0) : zero;
    const uint4 a01 = has0 ? __ldg(xrow0 + u1) : zero, a11 = has1 ? __ldg(xrow1 + u1) : zero;
    chunk_mma(b0, a00, a10, acc);
    chunk_mma(b1, a01, a11, acc);
  }
  if (c < chunks) {
    const size_t u0 = static_cast<size_t>(c) * 4;
    const uint4 b0 = __ldcs(wrow + u0);
    const uint4 a00 = has0 ? __ldg(xrow0 + u0) : zero, a10 = has1 ? __ldg(xrow1 + u0) : zero;
    chunk_mma(b0, a00, a10, acc);
  }
  partial[slice][tile][g][2 * t] = acc[0];
  partial[slice][tile][g][2 * t + 1] = acc[1];
  partial[slice][tile][g + 8][2 * t] = acc[2];
  partial[slice][tile][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  const int row = threadIdx.x / (kTiles * kTileN), col = threadIdx.x % (kTiles * kTileN);
  const int out_channel = channel0 + col;
  if (row >= m || out_channel >= n) return;
  float sum = 0.0f;
#pragma unroll
  for (int s = 0; s < kSlices; ++s) sum += partial[s][col / kTileN][row][col % kTileN];
  y[static_cast<size_t>(row) * n + out_channel] = __float2bfloat16(sum * x_scales[row] * w_scales[out_channel]);
}

}  // namespace

bool fp8_small_gemm_supported(int m, int k, const void* x, const void* w) {
  return m >= 1 && m <= kFp8SmallGemmMaxRows && k > 0 && k % kChunkBytes == 0 &&
         aligned_to(x, 16) && aligned_to(w, 16);
}

void launch_fp8_small_gemm(const uint8_t* x, const float* x_scales, int m, int k, const uint8_t* w,
                           const float* w_scales, int n, __nv_bfloat16* y, cudaStream_t stream) {
  ORIGAMI_CHECK_MSG(fp8_small_gemm_supported(m, k, x, w), "FP8 small GEMM: unsupported rows, k or alignment");
  if (n <= 0) return;
  const int blocks = (n + kTiles * kTileN - 1) / (kTiles * kTileN);
  fp8_small_gemm_kernel<<<blocks, kThreads, 0, stream>>>(x, x_scales, m, k, w, w_scales, n, y);
  ORIGAMI_CUDA_CHECK_LAUNCH();
}

}  // namespace origami::cuda
