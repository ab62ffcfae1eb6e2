#pragma once
// Log-probabilities on the GPU, beside the sampler on the same logits, with the semantics of
// sampling/logprob.h (temperature 1, before any filter). Per row, for the rows that ask:
//  - teacher forcing: log p(logprob_token) (RowSamplingParams::logprob_token >= 0);
//  - the OpenAI `logprobs` fields: log p(the row's token: logprob_token when set, else the
//    sampled one) and the top `num_top_logprobs` tokens (RowSamplingParams::num_top_logprobs >= 0).
// One thread block per row; rows that ask for nothing return at once. Runs inside CUDA graphs,
// so forced decode steps and decode steps with logprobs keep the graph path instead of copying
// whole logits rows to the host.
#include <cuda_runtime.h>

#include "backend/cuda/sampling_kernels.h"
#include "sampling/logprob.h"

namespace origami::cuda {

// logits [num_rows, row_stride] fp32 (first `vocab` columns used), params [num_rows] (device),
// sampled [num_rows] (device: launch_sample_rows' tokens, read when logprob_token < 0),
// logprobs [num_rows] (device): log p(the row's token) for rows that ask, NaN for the others;
// top [num_rows, kMaxTopLogprobs] (device): the first num_top_logprobs entries of rows that ask
// (descending, ties by ascending id). One kernel; no allocation; graph-capturable.
void launch_row_logprobs(const float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                         const int32_t* sampled, float* logprobs, TopLogprob* top, cudaStream_t stream);

}  // namespace origami::cuda
