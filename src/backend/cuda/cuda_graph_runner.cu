#include "backend/cuda/cuda_graph_runner.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace origami::cuda {

CudaGraphRunner::CudaGraphRunner() {
  // Fine steps for small batches (where padding costs most), coarser ones for large, up to the
  // 2048 sequences of max-load serving (--max-num-seqs; graphs are captured on first use).
  buckets_ = {1,   2,   4,   8,   16,  24,  32,   48,   64,   96,   128,  160,  192,  224, 256,
              320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2048};
}

CudaGraphRunner::~CudaGraphRunner() { clear(); }

void CudaGraphRunner::remove_bucket(int size) {
  if (size == buckets_.back()) return;
  buckets_.erase(std::remove(buckets_.begin(), buckets_.end(), size), buckets_.end());
  clear();
}

int CudaGraphRunner::bucket_for(int batch_size) const {
  for (int b : buckets_)
    if (b >= batch_size) return b;
  return 0;
}

void CudaGraphRunner::run(int bucket, int variant, cudaStream_t stream, const std::function<void()>& record) {
  auto it = graphs_.find({bucket, variant});
  if (it == graphs_.end()) {
    cudaGraph_t graph = nullptr;
    ORIGAMI_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    record();
    ORIGAMI_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    ORIGAMI_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    ORIGAMI_CUDA_CHECK(cudaGraphDestroy(graph));
    it = graphs_.emplace(std::make_pair(bucket, variant), exec).first;
  }
  ORIGAMI_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
}

void CudaGraphRunner::clear() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace origami::cuda
