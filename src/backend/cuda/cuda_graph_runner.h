#pragma once
// CUDA graphs of decode steps, one per batch-size bucket. A decode batch is padded up to its
// bucket (padding rows write no KV and read the null block), so a handful of graphs serve every
// batch size; each graph replays the whole forward pass and the sampling with one launch.
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <utility>
#include <vector>

namespace origami::cuda {

class CudaGraphRunner {
 public:
  CudaGraphRunner();
  ~CudaGraphRunner();
  CudaGraphRunner(const CudaGraphRunner&) = delete;
  CudaGraphRunner& operator=(const CudaGraphRunner&) = delete;

  // The smallest bucket holding `batch_size` rows, or 0 when the batch is larger than every bucket.
  int bucket_for(int batch_size) const;
  int max_bucket() const { return buckets_.back(); }
  // Serves batches of a bucket's sizes from the next larger bucket instead (never the largest),
  // where the step measured faster padded up (FP8 projections: cuda_backend.cu). Drops every graph.
  void remove_bucket(int size);

  // Replays the graph of (`bucket`, `variant`) on `stream`, capturing `record` (which must only
  // enqueue work on `stream`) the first time. A variant is a different recording of the same
  // bucket (tensor parallelism's greedy-only sampling, the balanced FP8 decode attention:
  // CudaBackend::forward's variant).
  void run(int bucket, int variant, cudaStream_t stream, const std::function<void()>& record);
  // Drops every graph (their buffers moved, or the KV cache was reallocated).
  void clear();
  int num_graphs() const { return static_cast<int>(graphs_.size()); }

 private:
  std::vector<int> buckets_;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphs_;  // (bucket, variant)
};

}  // namespace origami::cuda
