#pragma once
// Teacher forcing on the GPU: log p(token) under a row of logits (temperature 1), for the rows
// whose RowSamplingParams::logprob_token is >= 0, with the semantics of sampling/logprob.h. Runs
// beside the sampler on the same logits, inside CUDA graphs, so forced decode steps (perplexity,
// stream-mode evaluation) keep the graph path instead of copying whole logits rows to the host.
#include <cuda_runtime.h>

#include "backend/cuda/sampling_kernels.h"

namespace origami::cuda {

// logits [num_rows, row_stride] fp32 (first `vocab` columns used), params [num_rows] (device),
// logprobs [num_rows] (device): written for rows with logprob_token >= 0, NaN for the others.
// One kernel; no allocation; graph-capturable.
void launch_row_logprobs(const float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                         float* logprobs, cudaStream_t stream);

}  // namespace origami::cuda
