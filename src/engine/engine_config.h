#pragma once
// Everything needed to stand up an engine: model, backend, KV memory and scheduling limits.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kv/kv_cache_dtype.h"

namespace origami {

// EngineConfig::kv_gates value for random gates (with dummy_weights only).
inline constexpr const char* kRandomKvGates = "random";

struct EngineConfig {
  std::string model_dir;
  std::string tokenizer_dir;  // defaults to model_dir
  bool dummy_weights = false; // random weights for the config (benchmarks)
  std::string device = "cpu"; // cpu | cuda
  int num_threads = 0;        // CPU backend threads (0 = all cores)
  float gpu_memory_utilization = 0.9f;
  bool enable_cuda_graphs = true;
  int tensor_parallel_size = 1;  // GPUs the model is split over (CUDA; NCCL)
  // Tensor parallelism: the fused one-shot all-reduce over peer memory where the GPUs reach each
  // other (backend/cuda/peer_all_reduce.h); false: NCCL for every reduction.
  bool custom_all_reduce = true;
  // "none" or "fp8": FP8 E4M3 projections (a bf16 checkpoint is quantized per channel as it
  // loads; FP8 checkpoints run in FP8 either way). The CPU backend emulates it.
  std::string quantization = "none";
  // FP8 GEMMs accumulate the whole K sum in the tensor cores (BackendOptions::fp8_fast_accumulation).
  bool fp8_fast_accumulation = false;
  // --fp8-fused-quantize (on; --no-fp8-fused-quantize turns it off): FP8 projections' activations
  // quantized by their producers (the norms and the activation) instead of a separate kernel each
  // (BackendOptions::fuse_fp8_quantize; CUDA).
  bool fp8_fused_quantize = true;
  // --fp8-gemv-rows: decode's FP8 products of 1 to this many rows (0-4) by the streaming GEMV
  // (BackendOptions::fp8_gemv_rows).
  int fp8_gemv_rows = 2;
  // --no-fp8-split-k: FP8 products never split K (BackendOptions::fp8_split_k).
  bool fp8_split_k = true;
  // Decode attention's many KV splits merged in the last CTA of each unit instead of a merge kernel
  // (BackendOptions::fused_attention_merge; CUDA). Bit for bit the same; off only to compare.
  bool fused_attention_merge = true;
  // FP8 decode attention over one resident wave of CTAs sharing the batch's KV tiles evenly
  // (BackendOptions::balanced_attention; CUDA). Off only to compare.
  bool balanced_attention = true;
  // A mixed step's decode rows in the decode attention kernels, the prompt tokens in a second
  // launch (BackendOptions::mixed_decode_attention; CUDA, FP8 KV cache). Off only to compare.
  bool mixed_decode_attention = true;

  // Tokens per KV page. The command line's default is default_block_size() below; 16 here.
  int block_size = 16;
  // --kv-cache-dtype: the KV cache's element type (auto = the model's: bf16 on CUDA, fp32 on the
  // CPU; fp8 = E4M3 with a per-(token, KV head) scale, emulated bit-exactly on the CPU).
  KVCacheDType kv_cache_dtype = KVCacheDType::kAuto;
  int64_t kv_cache_bytes = 0;  // 0: backend default (CPU: 1 GiB; CUDA: from free memory)
  int num_kv_blocks = 0;       // overrides kv_cache_bytes when > 0
  bool enable_prefix_caching = false;
  // Retained contexts (kv/retained_contexts.h): a finished request's KV, compressed or not, stays
  // as a context keyed by its token history, and a later request whose tokens begin with that
  // history continues from it. Contexts hold at most retained_kv_bytes (> 0) or else
  // retained_kv_share of the KV pool, and are released least recently used first whenever a
  // request needs their pages. `origami serve` turns them on (--no-retain-contexts: off).
  bool retain_contexts = false;
  int64_t retained_kv_bytes = 0;
  double retained_kv_share = 1.0;
  // Ragged head-group paging (TANGRAM §4.2, docs/architecture.md "Head groups"): KV heads per
  // head group; each group is (one layer, heads_per_group adjacent KV heads) with its own page
  // table, all groups sharing one pool. 0 or num_kv_heads = one group for everything (full
  // layout). Must divide the model's num_kv_heads. num_kv_blocks keeps counting full-layout
  // blocks (the same memory).
  int heads_per_group = 0;
  // With tensor parallelism over R ranks, head groups are striped instead of adjacent: each group
  // takes heads_per_group / R heads from every rank's slice (kv/kv_layout_ranks.h), so that each
  // rank stores its heads' slots of every page; per-head pages (the default of a policy that
  // prefers them) become groups of R heads, one per rank. head_group_stripes > 0 stripes over that
  // many slices instead (on one GPU too: the layout a tensor-parallel run uses, for comparisons).
  int head_group_stripes = 0;
  // Each head group's share of a request's compression budget (group g keeps
  // ceil(ratio x num_keep) entries per head), groups numbered layer by layer. Either one ratio per
  // group, or one per group of a layer (repeated for every layer); empty = 1.0 each (uniform).
  std::vector<float> group_budget_ratios;
  // A calibrated head budget file (`origami calibrate`; kv/head_budgets.h), checked against the
  // model: heads are grouped by budget (TANGRAM's budget-aware clustering, heads_per_group each;
  // default 4, or half the heads when 4 does not split them into at least two groups) and each
  // group's budget ratio is its largest head's ratio over the largest group's, so the request's
  // budget is what the most-retaining group keeps. Excludes group_budget_ratios.
  std::string kv_head_budgets;
  // Fast KVzip gate weights (`origami train-gates`; gates/gate_weights.h), checked against the
  // model: the backend scores every KV entry it writes, for the `fastkvzip` policy (CPU and CUDA
  // backends). kRandomKvGates with dummy_weights: random gates of the model's shape (benchmarks).
  std::string kv_gates;

  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  bool enable_chunked_prefill = true;
  int max_model_len = 0;  // 0: the model's max_position_embeddings

  uint64_t seed = 0;  // seeds requests that carry no seed of their own

  // KV compression (src/policy): the default policy and budget of requests that name none.
  std::string kv_policy = "full";  // a registered policy name (`origami policies`)
  int kv_budget = 0;               // tokens of KV per request after compression; 0 = policy default
  std::map<std::string, std::string> kv_policy_options;  // policy options, e.g. {"window", "16"}
  bool async_compression = true;   // overlap compression with decoding (CUDA)
  // Asynchronous scheduling (--async-scheduling): step N+1 is scheduled and launched before step N's
  // tokens reach the host, its reads of them filled in by the backend, so that the host's work
  // between steps (detokenizing, scheduling, the next batch) overlaps the device's. A request's
  // end (EOS, stop) is then seen one step late: the token sampled after it is dropped, as in
  // vLLM's --async-scheduling. Steps run one at a time while a request needs its tokens on the
  // host before the next step (penalties, min_tokens, logit_bias, forced tokens).
  bool async_scheduling = false;
  int compression_layer_stride = 8;  // layers scored and compacted together (Zipage App. C.1)
  // Admit a bounded (cache-full compressed) request only when its peak blocks are free after the
  // growth the running bounded requests still have ahead (SchedulerConfig::reserve_bounded_kv).
  bool reserve_bounded_kv = true;
  // Admit a request without a compression bound (full KV) only when its prompt + max_tokens fit
  // beside what the running reserved requests still need: never preempted
  // (SchedulerConfig::reserve_full_kv, TensorRT-LLM's GUARANTEED_NO_EVICT).
  bool reserve_full_kv = false;
  // Query slots M (Zipage eq. 1): 0 = from the default policy's budget, capped by max_num_seqs
  // (8 when the default policy needs no queries, so per-request policies still can); -1 = none
  // and no compression support at all (a pure full-KV engine).
  int num_query_slots = 0;
  // Rows per query slot: 0 = the default policy's window (32 when it needs no queries, enough
  // for every built-in policy's default window).
  int query_window = 0;
};

// Whether the configuration names its head layout (--heads-per-group, --group-budget-ratios or
// --kv-head-budgets). Where it does not, an engine whose default policy prefers per-head pages lays
// them out (engine.cpp), and `origami eval` follows its sweep's policies (eval_command.cpp).
inline bool head_layout_given(const EngineConfig& c) {
  return c.heads_per_group != 0 || !c.group_budget_ratios.empty() || !c.kv_head_budgets.empty();
}

// The page size the command line uses where --block-size is not given. 32 on CUDA when the
// engine's policy keeps every token on one page table per layer: the decode attention then reads
// each page's codes (and an FP8 cache's scales) in runs twice as long as at 16, which measured
// 1.02-1.03x faster a decode step with an FP8 KV cache at 256-472 sequences on an H100 (bf16
// within 1% either way; docs/benchmarks.md, "Page size"), while a request wastes at most 31
// entries of its last page (64 gained no more at the max-load shape and wastes twice that). 16 on
// the CPU backend, under a compressing policy (a page is what page-level policies evict and what
// budgets are checked against), with head groups, and in `origami eval` (its sweep's policies,
// compressing ones among them, share one engine).
inline int default_block_size(const std::string& device, bool policy_compresses, int heads_per_group) {
  return device == "cuda" && !policy_compresses && heads_per_group == 0 ? 32 : 16;
}

}  // namespace origami
