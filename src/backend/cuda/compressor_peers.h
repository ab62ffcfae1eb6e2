#pragma once
// The tensor-parallel ranks' compressors of one process, for a joint selection over every rank's
// heads (CudaCompressor::set_tensor_parallel): each rank's scored rows are read by the other ranks
// straight from its device memory (CUDA's unified addressing; NVLink where peer access is on),
// ordered by CUDA events, which one process's streams can wait on across devices. No collective
// library: a second NCCL communicator on the compression streams beside the step's own would be
// one more set of kernels that can block each other's devices.
//
// The ranks' compressors run every batch together (TensorParallelBackend fans begin() out to
// every rank's thread at once), so a host barrier inside begin() lines them up: a rank publishes
// its rows and records `scored` after its scoring kernels, meets the others, then makes its stream
// wait for their `scored` events before it copies their rows, and records `read` after. Before a
// rank's next batch touches its rows' buffer it waits (on the host) for every other rank's `read`.
#include <cuda_runtime.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace origami::cuda {

class CompressorPeers {
 public:
  explicit CompressorPeers(int size)
      : size_(size), rows_(size, nullptr), scored_(size, nullptr), read_(size, nullptr) {}
  ~CompressorPeers();
  CompressorPeers(const CompressorPeers&) = delete;
  CompressorPeers& operator=(const CompressorPeers&) = delete;

  int size() const { return size_; }
  // On rank `rank`'s device (its thread): creates its two events (once).
  cudaError_t init_rank(int rank);
  // Every rank calls it with whether it can go on; all return once every rank arrived, each with
  // true only if every rank was ok (so that an error anywhere stops every rank at the same point).
  bool arrive_and_wait(bool ok);

  const float*& rows(int rank) { return rows_[rank]; }
  cudaEvent_t scored(int rank) const { return scored_[rank]; }
  cudaEvent_t read(int rank) const { return read_[rank]; }

 private:
  int size_;
  std::vector<const float*> rows_;
  std::vector<cudaEvent_t> scored_, read_;
  std::vector<int> devices_ = std::vector<int>(static_cast<size_t>(size_), -1);
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool all_ok_ = true, last_ok_ = true;
};

}  // namespace origami::cuda
