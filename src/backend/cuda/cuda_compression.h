#pragma once
// KV compression on the CUDA backend (kv/compression.h): owns the query cache
// Q[L, M, max_window, h_q, d] (bf16), the global scores F[L, num_blocks, h_kv, block_size] (fp32),
// its own CUDA stream, and the scratch of one batch of jobs. begin() validates the jobs, uploads
// their tables in one copy, makes its stream wait for the work already queued on the backend's
// stream (the step that wrote the last KV entries and queries, copy_block), then enqueues, layer
// group by layer group (CompressionConfig::layer_stride layers at a time), the scorer, select and
// compact kernels (compression_kernels.h) and records an event. Decode steps of other requests
// run meanwhile on the backend's stream: compression touches only its jobs' pages and slots.
//
// Scratch is sized for one layer group of the batch: per (layer of the stride, KV head, entry)
// 8 bytes (24 with a redundancy score), plus 4 per kept entry; it grows between batches, never
// while one is in flight or during a graph capture (execute() calls begin() before it enqueues or
// captures the step).
// It is not part of the KV memory plan: it comes out of the backend's reserve.
//
// Runtime allocations (KeepAllocation kLayer / kGlobal, joint_selection.h): a batch with a joint
// job is scored as one layer group of every layer (the joint selection needs every head of a
// request before it selects any), so its scratch covers the requests' whole scope: per (layer,
// KV head, entry) of every layer the same 8 (24) bytes, plus 4 per entry for the kept indices
// (a joint job's num_keep is its whole length: any head may keep everything); e.g. 36 layers x
// 8 heads x 4096 entries x 12 bytes = 14 MiB per Qwen3-8B request of 4096 entries. Plus 16 bytes
// per (layer, KV head) of the joint requests and 4 per job (the kept counts, read back with the
// batch's completion event into pinned memory: kept_entries()).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/compressor_peers.h"
#include "backend/cuda/joint_selection.h"
#include "backend/kv_compressor.h"
#include "core/status.h"
#include "kv/block_table.h"
#include "kv/compression.h"

namespace origami::cuda {

// The kernels' view of a batch of jobs, built on the host: one descriptor per non-empty job, the
// chunk -> job map, the page tables, and the scratch elements of one layer group.
struct CompressionPlan {
  std::vector<CompressionJobDesc> descs;
  std::vector<int32_t> chunk_job;
  std::vector<int32_t> pages;
  size_t score_elems = 0;  // scores, final_scores, redundancy, norms, z
  size_t keep_elems = 0;
  size_t lse_elems = 0;
  int max_window_group = 0;
  bool any_redundancy = false;
  // The first chunk of every span of the jobs whose redundancy runs span by span
  // (redundancy_span_tiled), and whether some redundancy job does not.
  std::vector<int32_t> span_chunks;
  bool other_redundancy = false;
  uint32_t scorers = 0;  // scorer_bit() of every base scorer the jobs use (GroupArgs::scorers)
  std::vector<int32_t> job_index;   // per descriptor: its index in the jobs
  // kEvictBlock plans: per descriptor, the offset of its per-block score sums; their total.
  std::vector<int32_t> block_sum0;
  int32_t num_block_sums = 0;

  // Empty again, its arrays' memory kept for the next batch.
  void clear();
};
// The jobs of one kind: kCompact (score, select, compact) or kEvictBlock (base scores summed per
// block, block_eviction.h; no destination pages, num_keep 0). rows_per_job: layers of the largest
// group (min(layer_stride, L)) times KV heads (head groups: H_p). group_heads (head groups):
// [group * heads_per_group + slot] -> KV head; each job's heads are appended to `pages`
// (CompressionJobDesc::heads0). The jobs must be valid (CudaCompressor::begin validates them first).
CompressionPlan plan_compression(const std::vector<CompressionJob>& jobs, int block_size, int rows_per_job,
                                 int group_size, CompressionKind kind = CompressionKind::kCompact,
                                 const std::vector<int>* group_heads = nullptr, int heads_per_group = 0);
// The same plan written into `plan` (cleared first, its arrays' memory reused), over the jobs at
// `indices` only (null: all of them); job_index then holds indices into `jobs`. A batch of
// per-head compactions is ~14,700 jobs and ~5 MB of plan: planned into fresh vectors each batch,
// the pages they touch for the first time cost more than the planning (page faults: ~10 ms a batch
// on the GPU machine's VM).
void plan_compression_into(const std::vector<CompressionJob>& jobs, const std::vector<int32_t>* indices,
                           int block_size, int rows_per_job, int group_size, CompressionKind kind,
                           const std::vector<int>* group_heads, int heads_per_group, CompressionPlan* plan);

class CudaCompressor : public KVCompressor {
 public:
  // The backend's paged storage: K of layer l at k + l * kv_layer_pitch (elements), V likewise
  // (or, for an FP8 cache, k8 / v8 and their scales).
  struct Geometry {
    int num_layers = 0;
    int num_kv_heads = 0;
    int num_q_heads = 0;
    int head_dim = 0;
    int block_size = 0;
    int num_blocks = 0;
    __nv_bfloat16* k = nullptr;
    __nv_bfloat16* v = nullptr;
    size_t kv_layer_pitch = 0;
    // FP8 cache (--kv-cache-dtype fp8; k / v are then null): E4M3 codes at the element offsets a bf16
    // cache would use (kv_layer_pitch counts elements = bytes here), and one fp32 scale per head row
    // at element offset / head_dim (scale layer pitch kv_layer_pitch / head_dim). Head groups:
    // k8 = page 0's K codes, v8 = k8 + H_p * block_size * head_dim, k_scales = page 0's K scales
    // ([2, H_p, block_size] floats per page), v_scales = k_scales + H_p * block_size. Whether the
    // cache is FP8: k8 != nullptr (configure() then requires all four).
    uint8_t* k8 = nullptr;
    uint8_t* v8 = nullptr;
    float* k_scales = nullptr;
    float* v_scales = nullptr;
    // Head groups (KVLayout::grouped; 0 = the full layout): H_p heads per page, each group's layer
    // and KV heads ([group * H_p + slot]). k / v are page 0's K and V in the shared pool (pages
    // [2, H_p, block_size, head_dim]; kv_layer_pitch 0); F is [num_blocks, H_p, block_size].
    int heads_per_group = 0;
    std::vector<int> group_layer;
    std::vector<int> group_heads;
  };

  // Batches run after the work already queued on `main_stream` (the backend's stream) when begin()
  // is called.
  explicit CudaCompressor(cudaStream_t main_stream);
  ~CudaCompressor() override;
  CudaCompressor(const CudaCompressor&) = delete;
  CudaCompressor& operator=(const CudaCompressor&) = delete;

  // (Re)allocates the query cache and, if config.global_scores, F (zeroed). Waits for a batch in
  // flight first.
  Status configure(const CompressionConfig& config, const Geometry& geometry);
  bool configured() const { return configured_; }
  const CompressionConfig& config() const { return config_; }

  // Bytes of one query slot: [L, max_window, h_q, d] bf16.
  static size_t query_slot_bytes(const Geometry& g, int max_window);
  // The query cache at layer 0; layer l starts query_layer_pitch() elements further.
  __nv_bfloat16* query_cache() const { return q_cache_; }
  size_t query_layer_pitch() const;
  // F at layer 0 (null without global scores); layer l starts score_layer_pitch() floats further.
  float* global_scores() const { return f_; }
  size_t score_layer_pitch() const;

  // Validates `jobs` (each names the job, request and field at fault) and enqueues them after the
  // work already on the main stream. Waits for a previous batch still in flight.
  Status begin(const std::vector<CompressionJob>& jobs) override;
  bool done() override;
  Status wait() override;
  // Device time of the completed batches: from the batch's first command on stream_ (after it
  // waited for the main stream) to its done_ event. Decode kernels overlapping it count too.
  double device_seconds() const override { return device_seconds_; }

  // Copy-on-write of one page's global scores (every layer; a group page's own), enqueued on `stream`.
  void copy_scores(BlockId src, BlockId dst, cudaStream_t stream);

  // Tensor parallelism: this compressor holds rank `rank`'s KV heads (geometry's num_kv_heads of
  // them, heads rank * num_kv_heads ..) of the ranks `peers` connects. A runtime allocation then
  // selects over every rank's heads: each rank reads every other rank's scored rows
  // (compressor_peers.h) and runs the joint selection over all of them, so every rank keeps the
  // same count per job. Call on the rank's thread (its device).
  Status set_tensor_parallel(CompressorPeers* peers, int rank);

 private:
  Status validate(const std::vector<CompressionJob>& jobs) const;
  Status ensure_device(void** ptr, size_t* capacity, size_t bytes);
  void release();

  bool configured_ = false;
  CompressionConfig config_;
  Geometry geom_;
  cudaStream_t main_stream_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the backend's stream at begin()
  cudaEvent_t started_ = nullptr;  // recorded on stream_ once it may run the batch
  cudaEvent_t done_ = nullptr;     // recorded on stream_ after the batch
  bool in_flight_ = false;
  double device_seconds_ = 0.0;
  void account_finished_batch();  // adds the batch's device time (done_ has completed)
  Status status_;

  __nv_bfloat16* q_cache_ = nullptr;
  float* f_ = nullptr;

  // One batch's metadata (job descriptors, chunk -> job map, page tables): pinned staging and
  // its device twin, uploaded in one copy.
  void* host_meta_ = nullptr;
  size_t host_meta_bytes_ = 0;
  void* dev_meta_ = nullptr;
  size_t dev_meta_bytes_ = 0;
  // Scratch of one layer group (see compression_kernels.h GroupArgs).
  struct Scratch {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  Scratch scores_, final_, redundancy_, norms_, z_, lse_, keep_;
  // The joint selection's per-(layer, KV head) scratch, its per-descriptor kept counts (device,
  // then pinned for the host) and, per joint job of the batch, (job index, index in host_kept_).
  Scratch joint_guaranteed_, joint_cut_, joint_head_counts_, kept_counts_;
  // Tensor parallelism (set_tensor_parallel): the ranks' compressors, and the scratch of a joint
  // batch: every rank's scored rows laid out as one backend with every head would hold them.
  CompressorPeers* peers_ = nullptr;
  int tp_rank_ = 0;
  Scratch wide_final_;
  int32_t* host_kept_ = nullptr;
  size_t host_kept_capacity_ = 0;
  std::vector<std::pair<int32_t, int32_t>> joint_kept_index_;

  // Block evictions of the batch (after its compactions, on the same stream): their metadata
  // (descriptors, chunk -> job map, tables, per-job block-sum offsets; pinned staging and device
  // twin), the per-block score sums, and the chosen blocks (device, then pinned for the host;
  // account_finished_batch() copies them into evicted_blocks_).
  void* host_evict_meta_ = nullptr;
  size_t host_evict_meta_bytes_ = 0;
  Scratch evict_meta_, block_sums_;
  int32_t* host_evicted_ = nullptr;  // pinned, one per block eviction of the batch
  size_t host_evicted_capacity_ = 0;
  std::vector<int32_t> evict_job_index_;  // per block eviction of the batch: its job index
  // The plans of the last batch (one per launch sequence, then the block evictions'), kept so that
  // the next batch plans into memory already touched (plan_compression_into).
  std::vector<CompressionPlan> plans_;
  CompressionPlan evict_plan_;
  // Per block eviction of the batch: its block sums' offset and count, copied with the batch into
  // host_block_sums_ (pinned) and reported as evicted_block_sums().
  std::vector<std::pair<int32_t, int32_t>> evict_sum_ranges_;
  float* host_block_sums_ = nullptr;
  size_t host_block_sums_capacity_ = 0;
};

}  // namespace origami::cuda
