#pragma once
// Next-token selection on the GPU, one thread block per logits row, with the semantics of
// sampling/sampler.h: greedy argmax (ties to the lowest id), or temperature -> min-p -> top-k ->
// top-p -> one inverse-CDF draw in descending probability order (ties by ascending id); a row
// without a finite maximum logit yields kNonFiniteLogits, as on the CPU. The
// uniform `u` of each row is computed on the host with sampling_uniform(seed, sample_index), so
// both backends draw with the same number.
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

struct RowSamplingParams {
  float temperature = 1.0f;
  int top_k = 0;      // <= 0: disabled
  float top_p = 1.0f;
  float min_p = 0.0f;
  float u = 0.0f;     // the row's uniform draw in [0, 1)
  int greedy = 1;     // nonzero: argmax
  int logprob_token = -1;  // >= 0: also report log p(this token) (logprob_kernels.h)
  int num_top_logprobs = -1;  // >= 0: also report log p(the row's token) and the top N (logprob_kernels.h)
};

// logits [num_rows, row_stride] fp32 (the first `vocab` columns are used), params [num_rows]
// (device), tokens [num_rows] (device). Enqueues one kernel; no allocation, graph-capturable.
void launch_sample_rows(const float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                        int32_t* tokens, cudaStream_t stream);

}  // namespace origami::cuda
