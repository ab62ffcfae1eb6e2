#pragma once
// Next-token selection on the GPU, one thread block per logits row, with the semantics of
// sampling/sampler.h: greedy argmax (ties to the lowest id), or temperature -> min-p -> top-k ->
// top-p -> one inverse-CDF draw in descending probability order (ties by ascending id); a row
// without a finite maximum logit yields kNonFiniteLogits, as on the CPU. The
// uniform `u` of each row is computed on the host with sampling_uniform(seed, sample_index), so
// both backends draw with the same number.
//
// Logit adjustments (sampling/logit_adjustments.h: min_tokens mask, logit_bias, penalties) come
// as a flat device array of LogitAdjustment, each row naming its slice: the kernel applies them
// to the row in place before selecting (with the same single-rounding float operations as the
// CPU), and puts the raw logits back before it returns, so the logprob kernel that follows reads
// raw logits as vLLM reports them. Rows without adjustments do no extra work.
#include <cuda_runtime.h>

#include <cstdint>

#include "sampling/logit_adjustments.h"
#include "sampling/sampling_params.h"

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
  int adjust_begin = 0;   // the row's logit adjustments: adjustments[adjust_begin, + adjust_count)
  int adjust_count = 0;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
};

// A row's filters and draw: the request's temperature, top-k, top-p and min-p (`sp` null: greedy)
// and its uniform `u`; the logprob and adjustment fields keep their defaults.
RowSamplingParams row_sampling_params(const SamplingParams* sp, float u);

// logits [num_rows, row_stride] fp32 (the first `vocab` columns are used), params [num_rows]
// (device), tokens [num_rows] (device). Enqueues one kernel; no allocation, graph-capturable.
// adjustments (device, the rows' slices; tokens distinct within a slice and < vocab) and
// saved_logits (device, as many floats: the raw values while the kernel runs) may be null when
// no row has adjustments. The logits of adjusted rows are written during the kernel and are
// raw again when it ends.
void launch_sample_rows(float* logits, int num_rows, int vocab, int row_stride, const RowSamplingParams* params,
                        int32_t* tokens, cudaStream_t stream, const LogitAdjustment* adjustments = nullptr,
                        float* saved_logits = nullptr);

// Asynchronous scheduling (ForwardBatch::pending_tokens): tokens[pairs[i].x] = sampled[pairs[i].y]
// for i < n, the tokens the previous step sampled (its rows of `sampled`) put into this step's
// token inputs on the device, where they are. pairs (token index, row), sampled and tokens are
// device memory. Enqueues one kernel (none for n == 0).
void launch_gather_pending_tokens(const int2* pairs, int n, const int32_t* sampled, int32_t* tokens,
                                  cudaStream_t stream);

}  // namespace origami::cuda
