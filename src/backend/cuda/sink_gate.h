#pragma once
// Fast KVzip's sink-attention gates on the CUDA backend (gates/sink_attention_gate.h is the fp32
// CPU reference and docs/gates.md the architecture). Per layer and token, from the layer's
// attention input h (the normed hidden state the q/k/v projections read):
//
//   1. one cuBLAS GEMM: [W_q; W_k] h (bf16 operands, fp32 accumulation and output), the q and k
//      projections of every KV head stacked so that both take one launch;
//   2. one kernel, a thread per (token, query head), in fp32: + b_q, the two weighted RMSNorms, the
//      query-key logit and the 16 sink logits of each of the head's G queries, the softmax share
//      of the token's own logit beside the sinks and the bias, averaged over the G queries; written
//      to the entry's global-score slot F (per-(table, token) slot tables, as the KV write) and/or
//      to a plain [tokens, H] array.
//
// Both are plain launches on a stream, so a decode step's graph captures them. In the backend's
// forward they run on a side stream of their own (fork() / join()), beside the layer's attention:
// the projection GEMM has only 640 outputs per token on the Qwen3-8B shape, a handful of CTAs
// that stream the 5 MB of gate weights at a few SMs' bandwidth, ~17 us a layer on the main stream
// at decode sizes (H100), hidden behind the attention when forked.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/gemm.h"
#include "core/status.h"
#include "gates/gate_weights.h"

namespace origami::cuda {

// The kernel keeps a query and a key in registers: rank (D') up to this.
inline constexpr int kMaxDeviceGateRank = 32;

// Where a layer's gate scores go.
struct GateScoreDestination {
  // [num_tokens, num_kv_heads] scores, or null.
  float* token_scores = nullptr;
  // The layer's global-score pages F, or null: the score of KV head h for token t goes to slot
  // slot_mapping[table * num_tokens + t] (negative: skipped, a graph's padding row), page
  // slot / block_size, at ((page * page_heads + head_in_page) * block_size + slot % block_size),
  // with table = head_table[h] and head_in_page = head_slot[h] (head groups) or 0 and h (null
  // head_table: one table, pages of every KV head).
  float* f = nullptr;
  const int32_t* slot_mapping = nullptr;
  const int32_t* head_table = nullptr;
  const int32_t* head_slot = nullptr;
  int page_heads = 0;
  int block_size = 0;
};

class DeviceSinkGates {
 public:
  DeviceSinkGates() = default;
  ~DeviceSinkGates();
  DeviceSinkGates(const DeviceSinkGates&) = delete;
  DeviceSinkGates& operator=(const DeviceSinkGates&) = delete;

  // Uploads `gates` (their shape checked against the model by the caller): the projections as
  // bf16, everything else fp32. A rank above kMaxDeviceGateRank is an error naming it.
  Status load(const gates::GateWeights& gates);
  bool loaded() const { return !layers_.empty(); }
  const gates::GateShape& shape() const { return shape_; }

  // Grows the projection scratch to `tokens` rows (never while a graph is being captured).
  Status reserve(int tokens);
  int capacity() const { return capacity_; }

  // Enqueues layer `layer`'s gate over `num_tokens` rows of `hidden` (bf16 [num_tokens,
  // hidden_size]) on gemm's stream, `stream`; num_tokens <= capacity().
  void enqueue(int layer, const __nv_bfloat16* hidden, int num_tokens, const GateScoreDestination& dst, Gemm& gemm,
               cudaStream_t stream) const;
  // The same on the side stream, after the work queued on `main` so far (also inside a graph
  // capture of `main`); `hidden` and dst's slot tables must stay unchanged until join(main),
  // which makes `main` wait for the gate.
  void fork(int layer, const __nv_bfloat16* hidden, int num_tokens, const GateScoreDestination& dst,
            cudaStream_t main);
  void join(cudaStream_t main);

 private:
  struct Layer {
    __nv_bfloat16* proj = nullptr;  // [q_rows + k_rows, hidden]: W_q then W_k
    float* params = nullptr;        // q_bias [q_rows], q_norm [R], k_norm [R], sink_keys [H, S, R], bias [H, G]
  };
  void release();

  gates::GateShape shape_;
  std::vector<Layer> layers_;
  // fork()/join(): the side stream, its cuBLAS handle and the two events (created by load()).
  cudaStream_t side_ = nullptr;
  cudaEvent_t forked_ = nullptr, joined_ = nullptr;
  std::unique_ptr<Gemm> side_gemm_;
  float* proj_out_ = nullptr;  // [capacity, q_rows + k_rows]
  int capacity_ = 0;
};

}  // namespace origami::cuda
