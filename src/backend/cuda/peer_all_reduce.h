#pragma once
// Tensor parallelism's reduction of a layer's partial sums fused with the residual add and the RMS
// norm that follow it: one kernel per reduction where NCCL needs an all-reduce kernel and the norm
// another, and no NCCL launch latency (most of a decode step's reduction time: each reduction
// moves only tokens x hidden x 2 bytes, 2 MiB at 256 tokens of a 4096-wide model).
//
// One process drives every GPU (tensor_parallel_backend.h), so a rank reads the other ranks'
// partial sums straight from their memory over NVLink (CUDA peer access): a one-shot all-reduce.
// With two ranks it moves what a ring all-reduce moves (each rank reads the other's partials once)
// in one hop. Each CTA first meets the same CTA of every other rank at a barrier of flags in device
// memory (a rank's CTA arrives after its GEMM that wrote the partials has finished: stream order),
// then sums its rows' partials in fp32 in rank order (every rank the same order, so the ranks stay
// bit-identical; no rounding of the sum to bf16, one rounding fewer than a bf16 all-reduce), adds
// them to the fp32 residual and normalizes. A rank's partials alternate between two buffers: a
// rank that runs ahead writes the next partials into the other buffer while a slower rank still
// reads the first, and it cannot write the first again before every rank has passed the next
// barrier (so has finished reading it). The barrier counters live in device memory, so the kernel
// can be captured in CUDA graphs and replayed.
//
// Built after every rank's CudaBackend exists: init() on each rank's thread registers its buffers
// in the shared PeerReduceGroup, then connect() on each enables peer access to the others.
// Steps above kMaxTokens rows (long prefill chunks) reduce through NCCL instead.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace origami::cuda {

constexpr int kPeerReduceMaxRanks = 8;

// The ranks' buffers, shared by the ranks of one process (host memory; device pointers).
struct PeerReduceGroup {
  int size = 0;
  __nv_bfloat16* partials[kPeerReduceMaxRanks][2] = {};
  uint32_t* flags[kPeerReduceMaxRanks] = {};  // rank r's barrier flags, [kMaxBlocks][kPeerReduceMaxRanks]
};

class PeerAllReduce {
 public:
  static constexpr int kMaxTokens = 2048;
  static constexpr int kMaxBlocks = 256;

  PeerAllReduce() = default;
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Whether every pair of `devices` can access each other's memory (NVLink or PCIe peer access).
  static bool peers_reachable(int num_devices);

  // On rank `rank`'s device: allocates its two partial-sum buffers of kMaxTokens x hidden and its
  // barrier flags, and registers them in `group`.
  Status init(PeerReduceGroup* group, int rank, int hidden);
  // On the same device, after every rank's init(): peer access to every other rank's device.
  Status connect();

  // Whether a step of `num_tokens` rows of `hidden` reduces here (else NCCL).
  bool covers(int num_tokens) const { return group_ != nullptr && num_tokens <= kMaxTokens; }
  // Where this rank's next partial sums go (the GEMM's output).
  __nv_bfloat16* partial() const { return group_->partials[rank_][parity_]; }

  // residual[t] += sum over ranks of their partial()[t]; out[t] = rmsnorm(residual[t]) * weight,
  // for t < num_tokens (<= kMaxTokens), on every rank; then the next partials go to the other
  // buffer. Every rank must call it with the same num_tokens, in the same order.
  void reduce_add_rmsnorm(float* residual, const __nv_bfloat16* weight, float eps, int num_tokens,
                          __nv_bfloat16* out, cudaStream_t stream);

 private:
  PeerReduceGroup* group_ = nullptr;
  int rank_ = 0, hidden_ = 0, num_sms_ = 0;
  int parity_ = 0;
  __nv_bfloat16* buffers_ = nullptr;  // both partial buffers
  uint32_t* flags_ = nullptr;         // [kMaxBlocks][kPeerReduceMaxRanks], written by every rank
  uint32_t* counters_ = nullptr;      // [kMaxBlocks]: each CTA's barrier generation, this rank only
};

}  // namespace origami::cuda
