#include "backend/cuda/peer_all_reduce.h"

#include <algorithm>
#include <string>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pointer_alignment.h"
#include "backend/cuda/programmatic_launch.h"
#include "core/check.h"

namespace origami::cuda {
namespace {

using bf16 = __nv_bfloat16;
// A CTA reduces kRowsPerCta rows at once, kRowThreads threads each: a decode step's rows are few
// (a CTA has at most one or two at 256 tokens), and each row waits on loads from the other GPU,
// so rows in flight together hide that latency where rows one after the other would pay it each.
constexpr int kRowsPerCta = 2;
constexpr int kRowThreads = 512;
constexpr int kThreads = kRowsPerCta * kRowThreads;

// What both kernels reduce: rows [0, num_tokens) of `hidden`, this CTA's rows (kRowsPerCta at a
// time, grid-strided); rank k's 8-element chunk c of the row at `base` comes from partial(k, base, c).
struct ReduceRows {
  int size = 0;  // ranks
  float* residual = nullptr;
  const bf16* weight = nullptr;
  float eps = 0.0f;
  int num_tokens = 0, hidden = 0;
  bf16* out = nullptr;
};

struct ReduceArgs {
  const bf16* partials[kPeerReduceMaxRanks];  // this parity's buffer of every rank
  uint32_t* flags[kPeerReduceMaxRanks];       // every rank's barrier flags
  uint32_t* counters;                         // this rank's, [kMaxBlocks]
  int rank = 0;
  ReduceRows rows;
};

// System-scope release / acquire: the flag orders what this rank wrote before it (the partials,
// by the GEMM that finished before this kernel) for the other GPUs that see it.
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Sum over the kRowThreads threads of this thread's row group (every thread of the block calls it).
__device__ __forceinline__ float row_group_sum(float v, float (*scratch)[kRowThreads / 32]) {
  const int group = threadIdx.x / kRowThreads, warp = (threadIdx.x % kRowThreads) >> 5;
  v = warp_sum(v);
  __syncthreads();  // the previous row's readers are done
  if ((threadIdx.x & 31) == 0) scratch[group][warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kRowThreads / 32; ++w) total += scratch[group][w];
  return total;
}

// residual += the ranks' partials summed in fp32 in rank order; out = rmsnorm(residual) * weight.
// The same arithmetic for both protocols, so they give the same bits.
template <typename Partial>
__device__ __forceinline__ void reduce_rows(const ReduceRows& a, Partial partial,
                                            float (*scratch)[kRowThreads / 32]) {
  const int chunks = a.hidden / 8;
  const int group = threadIdx.x / kRowThreads, lt = threadIdx.x % kRowThreads;
  // Every thread runs every iteration (row_group_sum synchronizes the block); a group past the
  // last row idles through it.
  for (int t0 = blockIdx.x * kRowsPerCta; t0 < a.num_tokens; t0 += gridDim.x * kRowsPerCta) {
    const int t = t0 + group;
    const bool active = t < a.num_tokens;
    const size_t base = static_cast<size_t>(active ? t : 0) * a.hidden;
    float sum_sq = 0.0f;
    for (int c = lt; active && c < chunks; c += kRowThreads) {
      float x[8];
      float4* r = reinterpret_cast<float4*>(a.residual + base) + 2 * c;
      const float4 r0 = r[0], r1 = r[1];
      x[0] = r0.x, x[1] = r0.y, x[2] = r0.z, x[3] = r0.w, x[4] = r1.x, x[5] = r1.y, x[6] = r1.z, x[7] = r1.w;
      float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < a.size; ++k) {
        const uint4 p = partial(k, base, c);
        const bf16* pv = reinterpret_cast<const bf16*>(&p);
#pragma unroll
        for (int j = 0; j < 8; ++j) s[j] += __bfloat162float(pv[j]);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        x[j] += s[j];
        sum_sq += x[j] * x[j];
      }
      r[0] = make_float4(x[0], x[1], x[2], x[3]);
      r[1] = make_float4(x[4], x[5], x[6], x[7]);
    }
    const float inv_rms = rsqrtf(row_group_sum(sum_sq, scratch) / a.hidden + a.eps);
    for (int c = lt; active && c < chunks; c += kRowThreads) {
      const float4* r = reinterpret_cast<const float4*>(a.residual + base) + 2 * c;
      const float4 r0 = r[0], r1 = r[1];
      const float x[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
      const uint4 w = reinterpret_cast<const uint4*>(a.weight)[c];
      const bf16* wv = reinterpret_cast<const bf16*>(&w);
      uint4 o;
      bf16* ov = reinterpret_cast<bf16*>(&o);
#pragma unroll
      for (int j = 0; j < 8; ++j) ov[j] = __float2bfloat16(x[j] * inv_rms * __bfloat162float(wv[j]));
      reinterpret_cast<uint4*>(a.out + base)[c] = o;
    }
  }
}

__global__ void __launch_bounds__(kThreads) peer_reduce_add_rmsnorm_kernel(ReduceArgs a) {
  __shared__ float scratch[kRowsPerCta][kRowThreads / 32];
  __shared__ uint32_t generation;
  // Launched as a programmatic dependent (programmatic_launch.h): nothing is read or written before
  // the kernel before it (the GEMM writing the partials) is done; the one after may be scheduled now.
  wait_for_previous_grid();
  allow_next_grid();
  // The barrier with this CTA's twin on every rank: the twins run the same number of launches
  // of each grid size, so their counters agree. A rank may already have signalled the next
  // generation when a slow rank looks, hence ">=" (wrap-safe), never "==".
  if (threadIdx.x == 0) {
    generation = a.counters[blockIdx.x] + 1;
    a.counters[blockIdx.x] = generation;
  }
  __syncthreads();
  const uint32_t g = generation;
  if (threadIdx.x < a.rows.size) {
    const int peer = threadIdx.x;
    store_release_sys(a.flags[peer] + blockIdx.x * kPeerReduceMaxRanks + a.rank, g);
    const uint32_t* mine = a.flags[a.rank] + blockIdx.x * kPeerReduceMaxRanks + peer;
    while (static_cast<int32_t>(load_acquire_sys(mine) - g) < 0) {
    }
  }
  __syncthreads();
  reduce_rows(a.rows, [&](int k, size_t base, int c) {
    // L1 bypassed: the buffers are rewritten every other launch, by another GPU for peers.
    return __ldcg(reinterpret_cast<const uint4*>(a.partials[k] + base) + c);
  }, scratch);
}

// Push protocol (peer_all_reduce.h). A bf16 pair in a 32-bit word is "empty" where either half is
// negative zero, the value the receive buffers hold where nothing has arrived.
constexpr uint32_t kEmptyPair = 0x80008000u;

__device__ __forceinline__ bool has_empty_half(const uint4& v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
  bool empty = false;
#pragma unroll
  for (int i = 0; i < 4; ++i) empty |= (w[i] & 0xffffu) == 0x8000u || (w[i] >> 16) == 0x8000u;
  return empty;
}

// Negative zeros to positive ones (the same in a sum), so the receiver cannot mistake data for
// "not arrived".
__device__ __forceinline__ uint32_t no_negative_zero(uint32_t w) {
  if ((w & 0xffffu) == 0x8000u) w &= 0xffff0000u;
  if ((w >> 16) == 0x8000u) w &= 0x0000ffffu;
  return w;
}

// Polls local memory that another GPU writes: volatile (no cached copy), 16 bytes at once.
__device__ __forceinline__ uint4 load_volatile(const uint4* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

struct PushArgs {
  const bf16* partial = nullptr;                 // this rank's partial sums (its GEMM's output)
  bf16* incoming[kPeerReduceMaxRanks] = {};      // every rank's receive buffers
  uint32_t* state = nullptr;                     // this rank's {launches so far, CTAs done}
  size_t plane = 0;                              // elements of one (turn, sender) receive plane
  int rank = 0;
  ReduceRows rows;
};

__global__ void __launch_bounds__(kThreads) peer_push_reduce_add_rmsnorm_kernel(PushArgs a) {
  __shared__ float scratch[kRowsPerCta][kRowThreads / 32];
  __shared__ uint32_t launch;
  wait_for_previous_grid();  // as in peer_reduce_add_rmsnorm_kernel
  allow_next_grid();
  // The previous launch's last CTA advanced the count (stream order makes it visible here).
  if (threadIdx.x == 0) launch = *reinterpret_cast<volatile uint32_t*>(a.state);
  __syncthreads();
  const size_t turn = launch % PeerAllReduce::kPushTurns;
  const ReduceRows& rows = a.rows;
  const int chunks = rows.hidden / 8;
  const int lt = threadIdx.x % kRowThreads;
  // Send first, every row of this CTA: the other ranks' CTAs are waiting for exactly these rows.
  for (int t = blockIdx.x * kRowsPerCta + threadIdx.x / kRowThreads; t < rows.num_tokens;
       t += gridDim.x * kRowsPerCta) {
    const size_t base = static_cast<size_t>(t) * rows.hidden;
    for (int c = lt; c < chunks; c += kRowThreads) {
      uint4 p = __ldcg(reinterpret_cast<const uint4*>(a.partial + base) + c);
      p = make_uint4(no_negative_zero(p.x), no_negative_zero(p.y), no_negative_zero(p.z), no_negative_zero(p.w));
      for (int k = 0; k < rows.size; ++k) {
        if (k == a.rank) continue;
        bf16* dst = a.incoming[k] + (turn * rows.size + a.rank) * a.plane + base;
        reinterpret_cast<uint4*>(dst)[c] = p;
      }
    }
  }
  bf16* mine = a.incoming[a.rank] + turn * rows.size * a.plane;
  reduce_rows(rows, [&](int k, size_t base, int c) {
    if (k == a.rank) return __ldcg(reinterpret_cast<const uint4*>(a.partial + base) + c);
    uint4* src = reinterpret_cast<uint4*>(mine + k * a.plane + base) + c;
    uint4 p;
    do {
      p = load_volatile(src);
    } while (has_empty_half(p));
    *src = make_uint4(kEmptyPair, kEmptyPair, kEmptyPair, kEmptyPair);  // read: empty for its next turn
    return p;
  }, scratch);
  // The last CTA to finish advances the launch count for the next launch.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(a.state + 1, 1u) == gridDim.x - 1) {
      a.state[1] = 0;
      a.state[0] = launch + 1;
    }
  }
}

__global__ void fill_u32_kernel(uint32_t* p, size_t n, uint32_t v) {
  const size_t stride = gridDim.x * static_cast<size_t>(blockDim.x);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += stride) p[i] = v;
}

}  // namespace

PeerAllReduce::~PeerAllReduce() {
  for (void* p : {static_cast<void*>(buffers_), static_cast<void*>(flags_), static_cast<void*>(counters_),
                  static_cast<void*>(incoming_), static_cast<void*>(push_state_)})
    if (p != nullptr) cudaFree(p);
}

bool PeerAllReduce::peers_reachable(int num_devices) {
  if (num_devices > kPeerReduceMaxRanks) return false;
  for (int a = 0; a < num_devices; ++a)
    for (int b = 0; b < num_devices; ++b) {
      int ok = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&ok, a, b) != cudaSuccess || ok == 0)) {
        cudaGetLastError();
        return false;
      }
    }
  return true;
}

Status PeerAllReduce::init(PeerReduceGroup* group, int rank, int hidden, bool push) {
  if (group->size > kPeerReduceMaxRanks || rank < 0 || rank >= group->size)
    return invalid_argument("peer all-reduce: rank " + std::to_string(rank) + " of " + std::to_string(group->size) +
                            " (at most " + std::to_string(kPeerReduceMaxRanks) + " ranks)");
  if (hidden % 8 != 0)
    return invalid_argument("peer all-reduce: hidden size " + std::to_string(hidden) + " is not a multiple of 8");
  int device = 0;
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  const size_t buffer_elems = static_cast<size_t>(kMaxTokens) * hidden;
  if (cudaMalloc(&buffers_, 2 * buffer_elems * sizeof(bf16)) != cudaSuccess ||
      cudaMalloc(&flags_, kMaxBlocks * kPeerReduceMaxRanks * sizeof(uint32_t)) != cudaSuccess ||
      cudaMalloc(&counters_, kMaxBlocks * sizeof(uint32_t)) != cudaSuccess) {
    cudaGetLastError();
    return Status(ErrorCode::kResourceExhausted, "peer all-reduce: out of device memory for the partial sums");
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemset(flags_, 0, kMaxBlocks * kPeerReduceMaxRanks * sizeof(uint32_t)));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemset(counters_, 0, kMaxBlocks * sizeof(uint32_t)));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemset(buffers_, 0, 2 * buffer_elems * sizeof(bf16)));
  if (push) {
    const size_t incoming_elems = static_cast<size_t>(kPushTurns) * group->size * kPushMaxTokens * hidden;
    if (cudaMalloc(&incoming_, incoming_elems * sizeof(bf16)) != cudaSuccess ||
        cudaMalloc(&push_state_, 2 * sizeof(uint32_t)) != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::kResourceExhausted, "peer all-reduce: out of device memory for the receive buffers");
    }
    // Every receive slot starts empty (negative zeros), before any rank connects and sends.
    fill_u32_kernel<<<256, 256>>>(reinterpret_cast<uint32_t*>(incoming_), incoming_elems / 2, kEmptyPair);
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemset(push_state_, 0, 2 * sizeof(uint32_t)));
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  group->partials[rank][0] = buffers_;
  group->partials[rank][1] = buffers_ + buffer_elems;
  group->flags[rank] = flags_;
  group->incoming[rank] = incoming_;
  rank_ = rank;
  hidden_ = hidden;
  group_ = group;
  return Status::ok();
}

Status PeerAllReduce::connect() {
  for (int r = 0; r < group_->size; ++r) {
    if (r == rank_) continue;
    if (group_->partials[r][0] == nullptr || group_->flags[r] == nullptr ||
        (incoming_ != nullptr && group_->incoming[r] == nullptr))
      return Status(ErrorCode::kInternal, "peer all-reduce: rank " + std::to_string(r) + " has not registered");
    const cudaError_t e = cudaDeviceEnablePeerAccess(r, 0);
    if (e == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();
    } else if (e != cudaSuccess) {
      cudaGetLastError();
      return Status(ErrorCode::kUnimplemented,
                    std::string("peer all-reduce: no peer access to GPU ") + std::to_string(r) + ": " + cudaGetErrorString(e));
    }
  }
  return Status::ok();
}

void PeerAllReduce::reduce_add_rmsnorm(float* residual, const bf16* weight, float eps, int num_tokens, bf16* out,
                                       cudaStream_t stream) {
  ORIGAMI_CHECK(covers(num_tokens));
  ORIGAMI_CHECK(aligned_to(weight, 16) && aligned_to(out, 16) && aligned_to(residual, 16));
  ReduceRows rows;
  rows.size = group_->size;
  rows.residual = residual;
  rows.weight = weight;
  rows.eps = eps;
  rows.num_tokens = num_tokens;
  rows.hidden = hidden_;
  rows.out = out;
  // Every CTA resident at once (at most one per SM): a CTA waits for its twins on the other ranks
  // (their barrier flags or the rows they send) and must not wait for a slot a waiting CTA holds.
  const int blocks = std::min({(num_tokens + kRowsPerCta - 1) / kRowsPerCta, num_sms_, kMaxBlocks});
  if (num_tokens > 0 && pushes(num_tokens)) {
    PushArgs a;
    a.partial = group_->partials[rank_][parity_];
    for (int r = 0; r < group_->size; ++r) a.incoming[r] = group_->incoming[r];
    a.state = push_state_;
    a.plane = static_cast<size_t>(kPushMaxTokens) * hidden_;
    a.rank = rank_;
    a.rows = rows;
    ORIGAMI_CUDA_CHECK(launch_programmatic(peer_push_reduce_add_rmsnorm_kernel, blocks, kThreads, 0, stream, a));
    ORIGAMI_CUDA_CHECK_LAUNCH();
  } else if (num_tokens > 0) {
    ReduceArgs a;
    for (int r = 0; r < group_->size; ++r) {
      a.partials[r] = group_->partials[r][parity_];
      a.flags[r] = group_->flags[r];
    }
    a.counters = counters_;
    a.rank = rank_;
    a.rows = rows;
    ORIGAMI_CUDA_CHECK(launch_programmatic(peer_reduce_add_rmsnorm_kernel, blocks, kThreads, 0, stream, a));
    ORIGAMI_CUDA_CHECK_LAUNCH();
  }
  parity_ ^= 1;
}

}  // namespace origami::cuda
