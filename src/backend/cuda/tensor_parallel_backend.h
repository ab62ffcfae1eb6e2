#pragma once
// Tensor parallelism over NCCL: one CudaBackend per GPU (its TensorParallelRank share of the
// weights, its KV heads' cache and compressor), driven as one Backend. One process with a thread
// per GPU: the scheduler, the KV manager and the block tables exist once, every rank reads the
// same ForwardBatch (the same block ids index every rank's pool of its own heads), and every rank
// runs the same CompressionJobs on its own heads. A thread per rank (rather than one thread
// issuing every rank's work) lets each rank capture and replay its own CUDA graphs with the
// collectives inside, and needs no NCCL group calls.
//
// Ranks sample identically (the same logits after the all-gather, the same seeds); rank 0's
// tokens are the step's. A compression is reported finished once every rank has finished it.
// Asynchronous launches run each rank's launch() / finish_launched() on its thread, the ranks'
// StepOutputs kept per launched step.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <utility>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_library.h"

namespace origami::cuda {

// One thread per GPU, each bound to its device; run() executes a function on all of them at once.
class RankThreads {
 public:
  explicit RankThreads(const std::vector<int>& devices);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Runs fn(rank) on every rank's thread concurrently and waits for all; the first error by rank.
  Status run(const std::function<Status(int rank)>& fn);

 private:
  void loop(int rank, int device);

  std::vector<std::thread> threads_;
  // A step hands its task to the rank threads and waits for them twice per step. Each side spins
  // on these atomics for a while before it sleeps on its condition variable: the next step comes
  // within a fraction of a millisecond of the last (the host's scheduling), and a sleeping
  // thread's wake-up (tens of microseconds on a busy host) would sit on every step's critical path
  // (the ranks meet in their collectives, so the last to start sets the pace).
  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<Status(int)>* task_ = nullptr;  // published by generation_ (release)
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> remaining_{0};
  std::vector<Status> results_;
  std::atomic<bool> stop_{false};
};

class TensorParallelBackend : public Backend {
 public:
  // Ranks on GPUs 0 .. size-1; an error (before any allocation) if fewer GPUs are visible or NCCL
  // cannot be loaded.
  static Expected<std::unique_ptr<Backend>> create(const BackendOptions& options);
  ~TensorParallelBackend() override;

  std::string name() const override { return "cuda"; }
  Status load(const ModelConfig& config, const ModelWeights& weights) override;
  Status load_dummy(const ModelConfig& config, uint64_t seed) override;
  // Bytes of the whole (all-heads) KV cache: the smallest rank's share, times the ranks.
  size_t available_kv_bytes(size_t requested_bytes) const override;
  Status allocate_kv_cache(const KVLayout& layout) override;
  Status execute(const ForwardBatch& batch, StepOutput* out) override;
  bool launches_asynchronously() const override { return true; }
  Status launch(const ForwardBatch& batch, StepOutput* out) override;
  Status finish_launched(StepOutput* out) override;
  void copy_block(int group, BlockId src, BlockId dst) override;
  Status configure_compression(const CompressionConfig& config) override;
  size_t query_slot_bytes(int max_window) const override;
  KVCompressor* compressor() override;
  // Runtime allocations select over every rank's heads (CudaCompressor::set_tensor_parallel).
  bool selects_jointly() const override { return true; }
  // Each rank gets its KV heads' slice of the gates (gates::slice_gates): a head's score depends on
  // its own gate rows and the full hidden state, which every rank has.
  Status load_gates(const gates::GateWeights& gates) override;

  int size() const { return static_cast<int>(ranks_.size()); }
  CudaBackend& rank(int r) { return *ranks_[r]; }

 private:
  // Every rank's compressor as one: begin/done/wait fan out to the ranks' threads.
  class Compressor;

  // One launched step: every rank's StepOutput (each rank's launch() and finish_launched() fill
  // the same one), and how many of each rank's finished compressions are merged already.
  struct LaunchedStep {
    std::vector<StepOutput> outs;
    std::vector<size_t> merged;
  };

  TensorParallelBackend() = default;
  Status run(const std::function<Status(int rank)>& fn) const { return threads_->run(fn); }
  // After the weights load: the ranks' peer all-reduce (peer_all_reduce.h), or NCCL where it fails.
  void set_up_peer_reduce();
  // The ranks' outputs of `step` as one in `out` (at its launch, then again once `finished`):
  // the compressions the ranks reported since the last merge, the slowest rank's times, rank 0's
  // results.
  void merge_outputs(LaunchedStep& step, bool finished, StepOutput* out);
  // Folds one rank's report of a compression into partly_finished_; the merged result once every
  // rank has reported it.
  std::optional<CompressionResult> merge_compression(int rank, const CompressionResult& c);

  NcclCommunicators comms_;
  std::unique_ptr<CompressorPeers> compressor_peers_;
  std::unique_ptr<PeerReduceGroup> peer_group_;  // null: the ranks reduce through NCCL
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  std::unique_ptr<Compressor> compressor_;
  KVLayout kv_layout_;  // the whole (all-heads) layout
  // Compressions some ranks have reported finished: how many, the first error, rank 0's block.
  struct PartlyFinished {
    int ranks = 0;
    Status status;
    int evicted_block = -1;
    std::vector<double> block_sums;  // block evictions: every rank's per-block sums added
    int ranks_with_sums = 0;
    std::vector<int> kept;  // each rank's kept count (they must agree)
  };
  std::map<std::pair<uint64_t, int>, PartlyFinished> partly_finished_;  // (request, head group)
  std::deque<LaunchedStep> launched_;  // oldest first, at most kMaxLaunched
  static constexpr size_t kMaxLaunched = 2;
};

}  // namespace origami::cuda
