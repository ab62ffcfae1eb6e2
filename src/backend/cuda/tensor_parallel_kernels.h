#pragma once
// The kernels tensor parallelism adds around the vocab-parallel embedding and LM head: each
// rank holds `vocab_shard` consecutive rows of the table (rank r: [r * shard, (r + 1) * shard),
// zero rows past the real vocabulary). Launchers only enqueue on `stream` (graph-capturable).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

// residual[t, :] = table[ids[t] - vocab_begin, :] when ids[t] falls in this rank's shard, else 0;
// the sum over ranks (an all-reduce) is the full embedding.   table [vocab_shard, hidden]
// With `rows` (bf16 [n, hidden]): the row (or 0) goes there instead and residual is zeroed, so that
// the peer all-reduce that adds the ranks' rows to the residual (the first layer's) embeds.
void launch_embedding_gather_shard(const __nv_bfloat16* table, const int32_t* ids, int n, int hidden,
                                   int vocab_begin, int vocab_shard, float* residual, cudaStream_t stream,
                                   __nv_bfloat16* rows = nullptr);

// The all-gather of per-rank logits [ranks][rows][shard] laid out as rows of the full vocabulary:
// out[r, k * shard + j] = gathered[k, r, j].   out [rows, ranks * shard]
void launch_unshard_logits(const float* gathered, int ranks, int rows, int shard, float* out, cudaStream_t stream);

// Greedy decoding without gathering the logits: each rank's argmax over its shard, then every
// rank's candidates (all-gathered: 8 bytes a row and rank instead of its shard of fp32 logits)
// merged. Same result as the full-vocabulary argmax of sampling_kernels.h: NaN counts as -inf,
// ties go to the lowest id, and a row whose largest logit is not finite yields kNonFiniteLogits.
struct ShardArgmax {
  float logit;
  int32_t id;  // the global token id
};
// logits [rows, shard] of this rank (only the first `valid` columns hold real tokens: the last
// shard may overhang the vocabulary), ids offset by vocab_begin.   out [rows]
void launch_shard_argmax(const float* logits, int rows, int shard, int valid, int vocab_begin, ShardArgmax* out,
                         cudaStream_t stream);
// gathered [ranks, rows] (an all-gather of every rank's launch_shard_argmax output) -> tokens [rows].
void launch_merge_shard_argmax(const ShardArgmax* gathered, int ranks, int rows, int32_t* tokens, cudaStream_t stream);

}  // namespace origami::cuda
