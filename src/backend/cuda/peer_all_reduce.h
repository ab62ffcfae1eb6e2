#pragma once
// Tensor parallelism's reduction of a layer's partial sums fused with the residual add and the RMS
// norm that follow it: one kernel per reduction where NCCL needs an all-reduce kernel and the norm
// another, and no NCCL launch latency (most of a decode step's reduction time: each reduction
// moves only tokens x hidden x 2 bytes, 2 MiB at 256 tokens of a 4096-wide model).
//
// One process drives every GPU (tensor_parallel_backend.h), so the ranks reach each other's memory
// over NVLink (CUDA peer access) and the all-reduce is one-shot: every rank ends with every rank's
// partials for all its rows and sums them in fp32 in rank order (every rank the same order, so the
// ranks stay bit-identical; no rounding of the sum to bf16, one rounding fewer than a bf16
// all-reduce), adds them to the fp32 residual and normalizes. Two ways to move the partials, the
// same sums bit for bit:
//
// - Push (steps of at most kPushMaxTokens rows, the decode steps): each CTA first stores its rows'
//   partials into every other rank's receive buffer, then waits for the other ranks' partials of
//   the same rows to land in its own. The buffers hold negative zero (0x8000) wherever nothing has
//   arrived; a sender turns its own negative zeros into positive ones (the same in any sum), so a
//   value other than negative zero is the data itself and there is no barrier, no flag and no
//   round trip over the link: the writes are posted and the wait reads local memory. A receiver
//   puts negative zeros back once it has read. Three receive buffers in turn (the launch's
//   generation, counted on the device so CUDA graphs replay it): a rank can run at most one
//   reduction ahead of another (it needs the other's partials to finish), so the buffer it writes
//   was last read two reductions ago and has been reset since.
// - Pull (larger steps, up to kMaxTokens): each CTA meets the same CTA of every other rank at a
//   barrier of flags in device memory (a rank's CTA arrives after its GEMM that wrote the partials
//   has finished: stream order), then reads the other ranks' partials from their memory. A rank's
//   partials alternate between two buffers: a rank that runs ahead writes the next partials into
//   the other buffer while a slower rank still reads the first, and it cannot write the first
//   again before every rank has passed the next barrier (so has finished reading it). The barrier
//   counters live in device memory, so the kernel can be captured in CUDA graphs and replayed.
//   Push needs a receive buffer of kPushMaxTokens rows per rank and turn; beyond that the messages
//   are large enough that the barrier's latency is a small share of them.
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
  // Rank r's push receive buffers, [kPushTurns][size][kPushMaxTokens x hidden] (null: no push).
  __nv_bfloat16* incoming[kPeerReduceMaxRanks] = {};
};

class PeerAllReduce {
 public:
  static constexpr int kMaxTokens = 2048;
  static constexpr int kMaxBlocks = 256;
  static constexpr int kPushMaxTokens = 512;
  static constexpr int kPushTurns = 3;

  PeerAllReduce() = default;
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Whether every pair of `devices` can access each other's memory (NVLink or PCIe peer access).
  static bool peers_reachable(int num_devices);

  // On rank `rank`'s device: allocates its two partial-sum buffers of kMaxTokens x hidden, its
  // barrier flags and, with `push`, its receive buffers, and registers them in `group`. Every rank
  // passes the same `push`.
  Status init(PeerReduceGroup* group, int rank, int hidden, bool push);
  // On the same device, after every rank's init(): peer access to every other rank's device.
  Status connect();

  // Whether a step of `num_tokens` rows of `hidden` reduces here (else NCCL).
  bool covers(int num_tokens) const { return group_ != nullptr && num_tokens <= kMaxTokens; }
  // Where this rank's next partial sums go (the GEMM's output).
  __nv_bfloat16* partial() const { return group_->partials[rank_][parity_]; }

  // Whether a step of `num_tokens` rows pushes its partials (else pulls them).
  bool pushes(int num_tokens) const { return incoming_ != nullptr && num_tokens <= kPushMaxTokens; }

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
  __nv_bfloat16* incoming_ = nullptr;  // push: this rank's receive buffers (PeerReduceGroup::incoming)
  uint32_t* push_state_ = nullptr;     // push: {launches so far, CTAs of this launch done}, this rank only
};

}  // namespace origami::cuda
