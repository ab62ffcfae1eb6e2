#include "backend/cuda/compressor_peers.h"

namespace origami::cuda {

CompressorPeers::~CompressorPeers() {
  int current = 0;
  const bool have_current = cudaGetDevice(&current) == cudaSuccess;
  for (int r = 0; r < size_; ++r) {
    if (devices_[r] < 0) continue;
    cudaSetDevice(devices_[r]);  // an event is destroyed on its own device
    if (scored_[r] != nullptr) cudaEventDestroy(scored_[r]);
    if (read_[r] != nullptr) cudaEventDestroy(read_[r]);
  }
  if (have_current) cudaSetDevice(current);
}

cudaError_t CompressorPeers::init_rank(int rank) {
  if (scored_[rank] != nullptr) return cudaSuccess;
  cudaError_t err = cudaGetDevice(&devices_[rank]);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&scored_[rank], cudaEventDisableTiming);
  if (err == cudaSuccess) err = cudaEventCreateWithFlags(&read_[rank], cudaEventDisableTiming);
  return err;
}

bool CompressorPeers::arrive_and_wait(bool ok) {
  std::unique_lock<std::mutex> lock(mutex_);
  const uint64_t generation = generation_;
  all_ok_ = all_ok_ && ok;
  if (++arrived_ == size_) {
    last_ok_ = all_ok_;
    all_ok_ = true;
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return last_ok_;
  }
  cv_.wait(lock, [&] { return generation_ != generation; });
  return last_ok_;
}

}  // namespace origami::cuda
