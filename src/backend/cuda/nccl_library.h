#pragma once
// NCCL (NVIDIA's collectives library), loaded at run time from the system's libnccl.so.2, for
// tensor parallelism. Loading it at run time rather than linking it keeps one build for every
// machine: the CUDA backend compiles where NCCL is not installed (Debian ships no NCCL package,
// so neither do the machines that only build), and a run that asks for more than one GPU without
// NCCL gets an error naming the missing library instead of a loader failure at start-up.
//
// Where <nccl.h> exists the build checks that the few ABI values declared here (data types,
// reduction, unique id size) equal the header's; the collectives themselves are NCCL's.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"

namespace origami::cuda {

// ncclDataType_t values (stable across NCCL 2.x).
enum class NcclDataType : int { kInt32 = 2, kFloat32 = 7, kBFloat16 = 9 };

// ncclUniqueId: the bootstrap handle rank 0 creates and every rank receives (over TCP between
// hosts; in one process it is simply shared).
struct NcclUniqueId {
  char internal[128];
};

// The loaded library: its version and the entry points origami uses.
class NcclLibrary {
 public:
  // Loads libnccl.so.2 once (ORIGAMI_NCCL_LIBRARY may name another path); an error says what is
  // missing. Thread-safe.
  static Expected<const NcclLibrary*> get();

  int version() const { return version_; }  // e.g. 22805 for 2.28.5
  std::string version_string() const;

  using Comm = void*;  // ncclComm_t
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  int (*comm_init_rank)(Comm*, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*comm_init_all)(Comm*, int ndev, const int* devices) = nullptr;
  int (*comm_destroy)(Comm) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int datatype, int op, Comm, cudaStream_t) = nullptr;
  int (*all_gather)(const void* send, void* recv, size_t send_count, int datatype, Comm, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*get_error_string)(int) = nullptr;

  // A Status for an NCCL result code (ok for ncclSuccess).
  Status check(int result, const char* call) const;

 private:
  NcclLibrary() = default;
  int version_ = 0;
};

// One communicator per GPU of this process (ncclCommInitAll), rank i on devices[i]. The
// collectives are enqueued on the caller's stream and may be captured into CUDA graphs.
class NcclCommunicators {
 public:
  static Expected<NcclCommunicators> create(const std::vector<int>& devices);
  NcclCommunicators() = default;
  NcclCommunicators(NcclCommunicators&& other) noexcept;
  NcclCommunicators& operator=(NcclCommunicators&& other) noexcept;
  NcclCommunicators(const NcclCommunicators&) = delete;
  NcclCommunicators& operator=(const NcclCommunicators&) = delete;
  ~NcclCommunicators();

  int size() const { return static_cast<int>(comms_.size()); }
  int device(int rank) const { return devices_[rank]; }

  // In-place sum over the ranks of `count` elements of `buffer` (rank's device memory).
  Status all_reduce_sum(int rank, void* buffer, size_t count, NcclDataType type, cudaStream_t stream) const;
  // recv[r * count .. (r + 1) * count) = rank r's send, on every rank.
  Status all_gather(int rank, const void* send, void* recv, size_t count, NcclDataType type, cudaStream_t stream) const;
  // Collectives of several ranks issued from one thread must be grouped (NCCL deadlocks
  // otherwise); a thread per rank needs no group.
  Status group_start() const;
  Status group_end() const;

 private:
  const NcclLibrary* lib_ = nullptr;
  std::vector<void*> comms_;
  std::vector<int> devices_;
};

}  // namespace origami::cuda
