#pragma once
// Scatter of a step's new K/V rows into the paged cache of one layer.
// The caller computes slot_mapping on the host from each sequence's page table:
// the new token at logical cache entry e of its sequence goes to
//   slot = page_table[e / block_size] * block_size + e % block_size,
// and a negative slot skips the token (padding rows of a captured graph). With head groups
// (KVWriteArgs::head_table) every group has its own slot per token.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace origami::cuda {

struct KVWriteArgs {
  const __nv_bfloat16* k = nullptr;     // [num_tokens, num_kv_heads, head_dim]
  const __nv_bfloat16* v = nullptr;     // [num_tokens, num_kv_heads, head_dim]
  const int32_t* slot_mapping = nullptr;  // [num_tokens] device
  __nv_bfloat16* k_cache = nullptr;     // [num_blocks, num_kv_heads, block_size, head_dim]
  __nv_bfloat16* v_cache = nullptr;     // [num_blocks, num_kv_heads, block_size, head_dim]
  int num_tokens = 0;
  int num_kv_heads = 0;
  int head_dim = 0;    // a multiple of 8 (16-byte rows); 8 and up
  int block_size = 0;
  // Ragged paging (head groups, paged_attention.h RaggedHeads): each head writes through its
  // group's slot, slot_mapping[head_table[h] * num_tokens + token], at slot head_slot[h] of a page
  // page_stride elements long. Null head_table: one slot per token, pages of num_kv_heads heads.
  const int32_t* head_table = nullptr;  // [num_kv_heads] device
  const int32_t* head_slot = nullptr;   // [num_kv_heads] device
  long long page_stride = 0;
};

// Enqueues the scatter on `stream`. cudaErrorInvalidValue for bad sizes (head_dim not a multiple
// of 8, non-positive counts); num_tokens == 0 is a no-op.
cudaError_t write_kv_cache(const KVWriteArgs& args, cudaStream_t stream);

// The FP8 cache (--kv-cache-dtype fp8, kv/kv_cache_dtype.h): the same addressing (KVWriteArgs
// with k_cache / v_cache unused), but each (token, head) row is stored as head_dim E4M3 codes at
// the element offset the bf16 cache would use, and its fp32 scale (amax / 448) at that offset /
// head_dim in k_scales / v_scales: [num_blocks, num_kv_heads, block_size] (ragged: page_stride /
// head_dim scales per page). The codes times the scale are bit for bit the CPU backend's
// emulation (round_head_vector_fp8) of the same bf16 row. head_dim 32..256, a multiple of 32.
struct KVWriteFp8Out {
  uint8_t* k_codes = nullptr;
  uint8_t* v_codes = nullptr;
  float* k_scales = nullptr;
  float* v_scales = nullptr;
};
cudaError_t write_kv_cache_fp8(const KVWriteArgs& args, const KVWriteFp8Out& out, cudaStream_t stream);

// The size checks of the two launchers (and of the write fused into launch_qk_norm_rope): false
// for what write_kv_cache (fp8 null) or write_kv_cache_fp8 (fp8 its outputs) would reject.
bool kv_write_args_valid(const KVWriteArgs& args, const KVWriteFp8Out* fp8);

}  // namespace origami::cuda
