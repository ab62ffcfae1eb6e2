// KV-compression job driver of the CUDA backend; see cuda_compression.h.
#include "backend/cuda/cuda_compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "backend/cuda/block_eviction.h"
#include "backend/cuda/compression_kernels.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/joint_selection.h"
#include "core/host_timers.h"
#include "kv/compression_validation.h"

// nvcc (unlike g++) warns on `status_ = ...` because Status is a [[nodiscard]] class and its
// assignment returns a reference to one.
#pragma nv_diag_suppress 2810

namespace origami::cuda {
namespace {

constexpr int kChunk = 64;  // entries per chunk of the tile kernels

// The compactions of one launch sequence: their plan, its joint selection's scopes (runtime
// allocations), where its descriptors, chunk map, tables, scopes and members lie in the batch's
// metadata, and where its descriptors' kept counts lie in the batch's (CudaCompressor::kept_).
struct CompressionPart {
  explicit CompressionPart(CompressionPlan* p) : plan(*p) {}
  // One of CudaCompressor::plans_; its job_index holds each descriptor's index in begin()'s jobs.
  CompressionPlan& plan;
  JointPlan joint;
  size_t descs_at = 0, chunks_at = 0, spans_at = 0, pages_at = 0, scopes_at = 0, members_at = 0;
  size_t kept0 = 0;
};

int pages_for(int entries, int block_size) { return (entries + block_size - 1) / block_size; }
size_t align16(size_t x) { return (x + 15) / 16 * 16; }

// The pool of the layer group starting at layer l0 (full layout): K/V, or the FP8 codes at the
// same element offsets and their scales at offset / head_dim. Null stays null (the other pool).
void set_layer_pool(GroupArgs& a, const CudaCompressor::Geometry& g, int l0) {
  const size_t at = static_cast<size_t>(l0) * g.kv_layer_pitch, scale_at = at / static_cast<size_t>(g.head_dim);
  a.k = g.k != nullptr ? g.k + at : nullptr;
  a.v = g.v != nullptr ? g.v + at : nullptr;
  a.k8 = g.k8 != nullptr ? g.k8 + at : nullptr;
  a.v8 = g.v8 != nullptr ? g.v8 + at : nullptr;
  a.k_scales = g.k_scales != nullptr ? g.k_scales + scale_at : nullptr;
  a.v_scales = g.v_scales != nullptr ? g.v_scales + scale_at : nullptr;
}

}  // namespace

void CompressionPlan::clear() {
  descs.clear();
  chunk_job.clear();
  pages.clear();
  score_elems = keep_elems = lse_elems = 0;
  max_window_group = 0;
  any_redundancy = false;
  span_chunks.clear();
  other_redundancy = false;
  scorers = 0;
  job_index.clear();
  block_sum0.clear();
  num_block_sums = 0;
}

CompressionPlan plan_compression(const std::vector<CompressionJob>& jobs, int bs, int rows_per_job, int group_size,
                                 CompressionKind kind, const std::vector<int>* group_heads, int heads_per_group) {
  CompressionPlan plan;
  plan_compression_into(jobs, nullptr, bs, rows_per_job, group_size, kind, group_heads, heads_per_group, &plan);
  return plan;
}

void plan_compression_into(const std::vector<CompressionJob>& jobs, const std::vector<int32_t>* indices, int bs,
                           int rows_per_job, int group_size, CompressionKind kind,
                           const std::vector<int>* group_heads, int heads_per_group, CompressionPlan* out) {
  CompressionPlan& plan = *out;
  plan.clear();
  const size_t count = indices != nullptr ? indices->size() : jobs.size();
  plan.descs.reserve(count);
  plan.job_index.reserve(count);
  plan.block_sum0.reserve(count);
  const size_t rows = static_cast<size_t>(rows_per_job);
  for (size_t at = 0; at < count; ++at) {
    const size_t j = indices != nullptr ? static_cast<size_t>((*indices)[at]) : at;
    const CompressionJob& job = jobs[j];
    if (job.num_entries == 0 || job.kind != kind) continue;
    const bool evict = kind == CompressionKind::kEvictBlock;
    const ScoreRecipe& r = *job.recipe;
    CompressionJobDesc d;
    d.n = job.num_entries;
    d.num_keep = evict ? 0 : job.num_keep;  // a block eviction moves nothing
    const bool joint = !evict && runtime_allocation(r);
    d.joint = joint ? 1 : 0;
    d.mean_keep = joint ? job.mean_keep : 0;
    d.alpha_safe = joint ? r.alpha_safe : 0.0f;
    d.page_aligned = joint && r.page_aligned ? 1 : 0;
    // Gate scores are written with every entry: all of a job's entries count as scored.
    d.num_scored = r.gate_scores ? d.n : job.num_scored_entries;
    d.scorer = r.scorer;
    d.window = r.needs_queries() ? std::min(r.window, d.n) : 0;
    d.query_slot = r.needs_queries() ? job.query_slot : 0;
    d.q_pos0 = (job.num_positions >= 0 ? job.num_positions : d.n) - d.window;
    if (r.scorer == Scorer::kKara) {
      d.kara_region = std::max(d.window - r.recent, 0);
      d.window_keep = std::min(r.window_keep, d.kara_region);
      d.chunk_budget = r.chunk_budget;
      d.chunk_max_len = r.chunk_max_len;
    }
    d.global_decay = r.global_decay;
    d.global_sum = r.global_mode == GlobalMode::kSum ? 1 : 0;
    d.pool_kernel = r.pool_kernel > 1 && (job.first_compression || !r.pool_first_only) ? r.pool_kernel : 0;
    d.pool_avg = r.pool_type == PoolType::kAvg ? 1 : 0;
    d.redundancy = r.redundancy == RedundancyMode::kFlash ? 1 : r.redundancy == RedundancyMode::kLightning ? 2 : 0;
    d.redundancy_span = r.lightning_span(bs);
    d.redundancy_lambda = r.redundancy_lambda;
    d.redundancy_tau = r.redundancy_tau;
    d.redundancy_threshold = r.redundancy_threshold;
    // A joint job's protected tail follows its average keep (recent_ratio), not its upper bound.
    d.protect_window = r.protected_tail(joint ? job.mean_keep : job.num_keep);
    d.num_sinks = r.num_sinks;
    d.src_page0 = static_cast<int32_t>(plan.pages.size());
    plan.pages.insert(plan.pages.end(), job.src_blocks->begin(), job.src_blocks->begin() + pages_for(d.n, bs));
    d.dst_page0 = static_cast<int32_t>(plan.pages.size());
    if (!evict)
      plan.pages.insert(plan.pages.end(), job.dst_blocks->begin(), job.dst_blocks->begin() + pages_for(d.num_keep, bs));
    if (group_heads != nullptr) {
      d.heads0 = static_cast<int32_t>(plan.pages.size());
      const auto first = group_heads->begin() + static_cast<ptrdiff_t>(job.group) * heads_per_group;
      plan.pages.insert(plan.pages.end(), first, first + heads_per_group);
    }
    d.chunk0 = static_cast<int32_t>(plan.chunk_job.size());
    plan.chunk_job.insert(plan.chunk_job.end(), (d.n + kChunk - 1) / kChunk, static_cast<int32_t>(plan.descs.size()));
    d.score0 = static_cast<int64_t>(plan.score_elems);
    d.keep0 = static_cast<int64_t>(plan.keep_elems);
    d.lse0 = static_cast<int64_t>(plan.lse_elems);
    plan.score_elems += rows * d.n;
    plan.keep_elems += rows * d.num_keep;
    plan.lse_elems += rows * d.window * group_size;
    plan.max_window_group = std::max(plan.max_window_group, d.window * group_size);
    plan.any_redundancy = plan.any_redundancy || d.redundancy != 0;
    if (redundancy_span_tiled(d)) {
      for (int e = 0; e < d.n; e += d.redundancy_span) plan.span_chunks.push_back(d.chunk0 + e / kChunk);
    } else if (d.redundancy != 0) {
      plan.other_redundancy = true;
    }
    plan.scorers |= scorer_bit(d.scorer);
    plan.descs.push_back(d);
    plan.job_index.push_back(static_cast<int32_t>(j));
    plan.block_sum0.push_back(plan.num_block_sums);
    plan.num_block_sums += evict ? d.n / bs : 0;
  }
}

CudaCompressor::CudaCompressor(cudaStream_t main_stream) : main_stream_(main_stream) {
  ORIGAMI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  ORIGAMI_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  // started_/done_ time the batch on the device (compression_device_seconds).
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&started_));
  ORIGAMI_CUDA_CHECK(cudaEventCreate(&done_));
}

CudaCompressor::~CudaCompressor() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  release();
  for (Scratch* s : {&scores_, &final_, &redundancy_, &norms_, &z_, &lse_, &keep_, &joint_guaranteed_, &joint_cut_,
                     &joint_head_counts_, &kept_counts_, &wide_final_})
    if (s->ptr != nullptr) cudaFree(s->ptr);
  if (dev_meta_ != nullptr) cudaFree(dev_meta_);
  if (host_meta_ != nullptr) cudaFreeHost(host_meta_);
  for (Scratch* s : {&evict_meta_, &block_sums_})
    if (s->ptr != nullptr) cudaFree(s->ptr);
  if (host_evict_meta_ != nullptr) cudaFreeHost(host_evict_meta_);
  if (host_evicted_ != nullptr) cudaFreeHost(host_evicted_);
  if (host_block_sums_ != nullptr) cudaFreeHost(host_block_sums_);
  if (host_kept_ != nullptr) cudaFreeHost(host_kept_);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (started_ != nullptr) cudaEventDestroy(started_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void CudaCompressor::release() {
  if (q_cache_ != nullptr) cudaFree(q_cache_);
  if (f_ != nullptr) cudaFree(f_);
  q_cache_ = nullptr;
  f_ = nullptr;
  configured_ = false;
}

size_t CudaCompressor::query_slot_bytes(const Geometry& g, int max_window) {
  if (max_window <= 0) return 0;
  return static_cast<size_t>(g.num_layers) * max_window * g.num_q_heads * g.head_dim * sizeof(__nv_bfloat16);
}

size_t CudaCompressor::query_layer_pitch() const {
  return static_cast<size_t>(config_.num_query_slots) * config_.max_window * geom_.num_q_heads * geom_.head_dim;
}

size_t CudaCompressor::score_layer_pitch() const {
  const int page_heads = geom_.heads_per_group > 0 ? geom_.heads_per_group : geom_.num_kv_heads;
  return static_cast<size_t>(geom_.num_blocks) * page_heads * geom_.block_size;
}

Status CudaCompressor::configure(const CompressionConfig& config, const Geometry& g) {
  ORIGAMI_RETURN_IF_ERROR(validate_compression_config(config));
  if (g.num_kv_heads <= 0 || g.num_q_heads % g.num_kv_heads != 0 || g.num_q_heads / g.num_kv_heads > kChunk)
    return Status(ErrorCode::kUnimplemented, "CUDA compression: " + std::to_string(g.num_q_heads) + " query heads over " +
                                                 std::to_string(g.num_kv_heads) +
                                                 " KV heads (a GQA group of at most 64 heads is supported)");
  if (g.head_dim % 32 != 0 || g.head_dim > 256)
    return Status(ErrorCode::kUnimplemented, "CUDA compression: head_dim " + std::to_string(g.head_dim) +
                                                 " is not supported (a multiple of 32 up to 256 is)");
  // An FP8 cache names its codes and scales together (its head_dim, a multiple of 32, is checked above).
  const int fp8_fields = (g.k8 != nullptr) + (g.v8 != nullptr) + (g.k_scales != nullptr) + (g.v_scales != nullptr);
  if (fp8_fields != 0 && fp8_fields != 4)
    return invalid_argument("CUDA compression: an FP8 KV cache needs k8, v8, k_scales and v_scales (" +
                            std::to_string(fp8_fields) + " of 4 set)");
  ORIGAMI_RETURN_IF_ERROR(wait());
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  release();
  geom_ = g;
  config_ = config;
  const size_t q_bytes = query_slot_bytes(g, config.max_window) * config.num_query_slots;
  if (q_bytes > 0) {
    if (cudaMalloc(reinterpret_cast<void**>(&q_cache_), q_bytes) != cudaSuccess) {
      cudaGetLastError();
      q_cache_ = nullptr;
      return Status(ErrorCode::kResourceExhausted,
                    "compression config: cannot allocate the query cache (" + std::to_string(q_bytes >> 20) + " MiB)");
    }
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(q_cache_, 0, q_bytes, stream_));
  }
  if (config.global_scores) {
    // Head groups: a page belongs to one layer's group, so F is one array over the pool.
    const size_t f_bytes = score_layer_pitch() * (g.heads_per_group > 0 ? 1 : g.num_layers) * sizeof(float);
    if (cudaMalloc(reinterpret_cast<void**>(&f_), f_bytes) != cudaSuccess) {
      cudaGetLastError();
      f_ = nullptr;
      release();
      return Status(ErrorCode::kResourceExhausted,
                    "compression config: cannot allocate the global scores (" + std::to_string(f_bytes >> 20) + " MiB)");
    }
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(f_, 0, f_bytes, stream_));
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  status_ = Status::ok();
  configured_ = true;
  return Status::ok();
}

Status CudaCompressor::validate(const std::vector<CompressionJob>& jobs) const {
  ORIGAMI_RETURN_IF_ERROR(
      validate_job_groups(jobs, geom_.heads_per_group > 0 ? static_cast<int>(geom_.group_layer.size()) : 1));
  return validate_compression_batch(jobs, geom_.block_size, geom_.num_blocks, config_.num_query_slots,
                                    config_.max_window, f_ != nullptr);
}

Status CudaCompressor::ensure_device(void** ptr, size_t* capacity, size_t bytes) {
  if (bytes <= *capacity) return Status::ok();
  if (*ptr != nullptr) cudaFree(*ptr);
  *ptr = nullptr;
  *capacity = 0;
  const size_t grown = std::max(bytes, bytes + bytes / 4);
  if (cudaMalloc(ptr, grown) != cudaSuccess) {
    cudaGetLastError();
    *ptr = nullptr;
    return Status(ErrorCode::kResourceExhausted,
                  "CUDA compression: cannot allocate " + std::to_string(grown >> 20) + " MiB of scratch");
  }
  *capacity = grown;
  return Status::ok();
}

Status CudaCompressor::begin(const std::vector<CompressionJob>& jobs) {
  if (!configured_) return invalid_argument("CUDA compressor: begin() before configure()");
  if (in_flight_) {
    const cudaError_t err = cudaEventSynchronize(done_);
    in_flight_ = false;
    if (err != cudaSuccess) status_ = cuda_status(err, "compression batch");
    else account_finished_batch();
  }
  {
    ORIGAMI_HOST_TIMER("compressor.begin.validate");
    status_ = validate(jobs);
  }
  if (!status_.is_ok()) return status_;
  ORIGAMI_HOST_TIMER("compressor.begin.plan_stage_launch");
  // Tensor parallelism: the other ranks may still read this rank's rows of the last batch
  // (gather_rows below); wait before any buffer is rewritten or reallocated.
  if (peers_ != nullptr)
    for (int r = 0; r < peers_->size(); ++r)
      if (r != tp_rank_) ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(peers_->read(r)));

  const Geometry& g = geom_;
  const int bs = g.block_size, group_size = g.num_q_heads / g.num_kv_heads;
  // A runtime allocation selects a request's heads jointly, so every layer is scored before any
  // is selected: one layer group of every layer (scratch for the requests' whole scope).
  bool joint_batch = false;
  for (const CompressionJob& job : jobs)
    joint_batch = joint_batch || (job.kind == CompressionKind::kCompact && runtime_allocation(*job.recipe));
  const int stride = joint_batch ? g.num_layers : std::min(config_.layer_stride, g.num_layers);
  const size_t rows_max = static_cast<size_t>(stride) * g.num_kv_heads;

  // The compactions: one plan over every layer (full layout), or one per `stride` layers that
  // have jobs (head groups: a group is one layer, and a launch serves the groups of `stride`
  // layers, each job reading its own layer's queries; the same scratch as the full layout's).
  const bool grouped = g.heads_per_group > 0;
  std::vector<CompressionPart> parts;
  if (!grouped) {
    if (plans_.empty()) plans_.resize(1);
    CompressionPart part(&plans_[0]);
    plan_compression_into(jobs, nullptr, bs, static_cast<int>(rows_max), group_size, CompressionKind::kCompact, nullptr,
                          0, &part.plan);
    std::vector<const CompressionJob*> desc_jobs;
    for (int32_t j : part.plan.job_index) desc_jobs.push_back(&jobs[static_cast<size_t>(j)]);
    // Rows are (layer, KV head) of every layer (stride == num_layers when a job is joint).
    part.joint = plan_joint_selection(desc_jobs, static_cast<int>(rows_max), [&](int, int lh) {
      return std::make_pair(lh / g.num_kv_heads, lh % g.num_kv_heads);
    });
    parts.push_back(std::move(part));
  } else {
    std::vector<std::vector<int32_t>> by_stride((g.num_layers + stride - 1) / stride);  // job indices
    for (size_t j = 0; j < jobs.size(); ++j)
      if (jobs[j].kind == CompressionKind::kCompact)
        by_stride[g.group_layer[jobs[j].group] / stride].push_back(static_cast<int32_t>(j));
    if (plans_.size() < by_stride.size()) plans_.resize(by_stride.size());
    for (size_t p = 0; p < by_stride.size(); ++p) {
      if (by_stride[p].empty()) continue;
      CompressionPart part(&plans_[p]);
      plan_compression_into(jobs, &by_stride[p], bs, g.heads_per_group, group_size, CompressionKind::kCompact,
                            &g.group_heads, g.heads_per_group, &part.plan);
      std::vector<const CompressionJob*> desc_jobs;
      desc_jobs.reserve(part.plan.descs.size());
      for (size_t d = 0; d < part.plan.descs.size(); ++d) {
        const int32_t j = part.plan.job_index[d];
        part.plan.descs[d].layer = g.group_layer[jobs[static_cast<size_t>(j)].group];
        desc_jobs.push_back(&jobs[static_cast<size_t>(j)]);
      }
      // Rows are the H_p head slots of each job's group (one layer).
      part.joint = plan_joint_selection(desc_jobs, g.heads_per_group, [&](int d, int slot) {
        const CompressionJob& job = *desc_jobs[static_cast<size_t>(d)];
        return std::make_pair(g.group_layer[job.group], g.group_heads[job.group * g.heads_per_group + slot]);
      });
      parts.push_back(std::move(part));
    }
  }
  // Tensor parallelism, a joint batch: the selection runs over every rank's heads. Its descriptors
  // address a wide copy of the scored rows, built from the ranks' gathered rows: a job's local rows
  // are [row_layers][row_heads][n] (every layer x this rank's heads; head groups: one layer x the
  // group's slots on this rank), its wide rows [row_layers][ranks x row_heads][n], rank r's rows
  // at r x row_heads (rank r holds model heads r x num_kv_heads ..). The same jobs, so the wide
  // selection's kept counts land where the local selection reads them.
  const int tp_size = peers_ != nullptr ? peers_->size() : 1;
  const int row_layers = grouped ? 1 : g.num_layers;
  const int row_heads = grouped ? g.heads_per_group : g.num_kv_heads;
  const int wide_heads = row_heads * tp_size;
  std::vector<CompressionJobDesc> wide_descs;
  JointPlan wide_joint;
  size_t wide_elems = 0;
  if (tp_size > 1 && parts.size() == 1 && !parts[0].joint.scopes.empty()) {
    const CompressionPart& part = parts[0];
    const size_t wide_rows = static_cast<size_t>(row_layers) * wide_heads;
    wide_descs = part.plan.descs;
    for (CompressionJobDesc& d : wide_descs) {
      d.score0 = static_cast<int64_t>(wide_elems);
      wide_elems += wide_rows * static_cast<size_t>(d.n);
    }
    std::vector<const CompressionJob*> desc_jobs;
    for (int32_t j : part.plan.job_index) desc_jobs.push_back(&jobs[static_cast<size_t>(j)]);
    wide_joint = plan_joint_selection(desc_jobs, static_cast<int>(wide_rows), [&](int d, int lh) {
      const int layer = lh / wide_heads, rank = lh % wide_heads / row_heads, slot = lh % row_heads;
      if (!grouped) return std::make_pair(layer, rank * g.num_kv_heads + slot);
      const int group = desc_jobs[static_cast<size_t>(d)]->group;
      return std::make_pair(g.group_layer[group],
                            rank * g.num_kv_heads + g.group_heads[group * g.heads_per_group + slot]);
    });
  }
  // Every rank meets the others in gather_rows; a rank that leaves begin() before it (an error)
  // meets them on the way out, so that none waits forever and all report the batch failed.
  struct MeetOnExit {
    CompressorPeers* peers = nullptr;
    ~MeetOnExit() {
      if (peers != nullptr) (void)peers->arrive_and_wait(false);
    }
  } meet_on_exit;
  if (!wide_descs.empty()) meet_on_exit.peers = peers_;
  plan_compression_into(jobs, nullptr, bs, static_cast<int>(rows_max), group_size, CompressionKind::kEvictBlock, nullptr,
                        0, &evict_plan_);
  const CompressionPlan& evict_plan = evict_plan_;
  evicted_blocks_.assign(jobs.size(), -1);
  evicted_block_sums_.assign(jobs.size(), {});
  // Kept counts: a uniform compaction keeps its num_keep; a joint one's count comes back with the
  // batch (account_finished_batch), 0 for one without entries.
  kept_entries_.assign(jobs.size(), -1);
  for (size_t j = 0; j < jobs.size(); ++j)
    if (jobs[j].kind == CompressionKind::kCompact) kept_entries_[j] = runtime_allocation(*jobs[j].recipe) ? 0 : jobs[j].num_keep;
  joint_kept_index_.clear();

  // Host staging and device metadata of every part (one copy).
  size_t meta_bytes = 0, score_elems = 0, keep_elems = 0, lse_elems = 0, members = 0, kept_total = 0;
  bool any_redundancy = false;
  for (CompressionPart& part : parts) {
    const CompressionPlan& pl = part.plan;
    part.descs_at = meta_bytes;
    part.chunks_at = part.descs_at + align16(pl.descs.size() * sizeof(CompressionJobDesc));
    part.spans_at = part.chunks_at + align16(pl.chunk_job.size() * sizeof(int32_t));
    part.pages_at = part.spans_at + align16(pl.span_chunks.size() * sizeof(int32_t));
    part.scopes_at = part.pages_at + align16(pl.pages.size() * sizeof(int32_t));
    part.members_at = part.scopes_at + align16(part.joint.scopes.size() * sizeof(JointScope));
    meta_bytes = part.members_at + align16(part.joint.members.size() * sizeof(int32_t));
    members = std::max({members, part.joint.members.size(), wide_joint.members.size()});
    if (!part.joint.scopes.empty()) {
      part.kept0 = kept_total;
      for (size_t d = 0; d < pl.descs.size(); ++d)
        if (pl.descs[d].joint) joint_kept_index_.emplace_back(pl.job_index[d], static_cast<int32_t>(kept_total + d));
      kept_total += pl.descs.size();
    }
    score_elems = std::max(score_elems, pl.score_elems);
    keep_elems = std::max(keep_elems, pl.keep_elems);
    lse_elems = std::max(lse_elems, pl.lse_elems);
    any_redundancy = any_redundancy || pl.any_redundancy;
  }
  const size_t wide_descs_at = meta_bytes;
  const size_t wide_scopes_at = wide_descs_at + align16(wide_descs.size() * sizeof(CompressionJobDesc));
  const size_t wide_members_at = wide_scopes_at + align16(wide_joint.scopes.size() * sizeof(JointScope));
  meta_bytes = wide_members_at + align16(wide_joint.members.size() * sizeof(int32_t));
  if (meta_bytes > host_meta_bytes_) {
    if (host_meta_ != nullptr) cudaFreeHost(host_meta_);
    host_meta_ = nullptr;
    host_meta_bytes_ = 0;
    const size_t grown = std::max<size_t>(meta_bytes * 2, 4096);
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(&host_meta_, grown));
    host_meta_bytes_ = grown;
  }
  ORIGAMI_RETURN_IF_ERROR(ensure_device(&dev_meta_, &dev_meta_bytes_, std::max<size_t>(meta_bytes, 16)));
  char* h = static_cast<char*>(host_meta_);
  for (const CompressionPart& part : parts) {
    const CompressionPlan& pl = part.plan;
    if (!pl.descs.empty()) std::memcpy(h + part.descs_at, pl.descs.data(), pl.descs.size() * sizeof(CompressionJobDesc));
    if (!pl.chunk_job.empty()) std::memcpy(h + part.chunks_at, pl.chunk_job.data(), pl.chunk_job.size() * sizeof(int32_t));
    if (!pl.span_chunks.empty())
      std::memcpy(h + part.spans_at, pl.span_chunks.data(), pl.span_chunks.size() * sizeof(int32_t));
    if (!pl.pages.empty()) std::memcpy(h + part.pages_at, pl.pages.data(), pl.pages.size() * sizeof(int32_t));
    if (!part.joint.scopes.empty()) {
      std::memcpy(h + part.scopes_at, part.joint.scopes.data(), part.joint.scopes.size() * sizeof(JointScope));
      std::memcpy(h + part.members_at, part.joint.members.data(), part.joint.members.size() * sizeof(int32_t));
    }
  }

  if (!wide_descs.empty()) {
    std::memcpy(h + wide_descs_at, wide_descs.data(), wide_descs.size() * sizeof(CompressionJobDesc));
    std::memcpy(h + wide_scopes_at, wide_joint.scopes.data(), wide_joint.scopes.size() * sizeof(JointScope));
    std::memcpy(h + wide_members_at, wide_joint.members.data(), wide_joint.members.size() * sizeof(int32_t));
  }

  // Scratch of one layer group (every part runs after the previous one on the same stream).
  auto need = [&](Scratch& s, size_t bytes) { return ensure_device(&s.ptr, &s.bytes, std::max<size_t>(bytes, 16)); };
  // Block evictions reuse the scores after the compactions (same stream).
  ORIGAMI_RETURN_IF_ERROR(need(scores_, std::max(score_elems, evict_plan.score_elems) * sizeof(float)));
  ORIGAMI_RETURN_IF_ERROR(need(final_, score_elems * sizeof(float)));
  ORIGAMI_RETURN_IF_ERROR(need(keep_, keep_elems * sizeof(int32_t)));
  ORIGAMI_RETURN_IF_ERROR(need(lse_, lse_elems * sizeof(float2)));
  if (!wide_descs.empty()) ORIGAMI_RETURN_IF_ERROR(need(wide_final_, wide_elems * sizeof(float)));
  if (kept_total > 0) {  // the joint selection's per-member scratch and the kept counts
    ORIGAMI_RETURN_IF_ERROR(need(joint_guaranteed_, members * sizeof(int32_t)));
    ORIGAMI_RETURN_IF_ERROR(need(joint_cut_, members * sizeof(unsigned long long)));
    ORIGAMI_RETURN_IF_ERROR(need(joint_head_counts_, members * sizeof(int32_t)));
    ORIGAMI_RETURN_IF_ERROR(need(kept_counts_, kept_total * sizeof(int32_t)));
    if (kept_total > host_kept_capacity_) {
      if (host_kept_ != nullptr) cudaFreeHost(host_kept_);
      host_kept_ = nullptr;
      host_kept_capacity_ = 0;
      const size_t grown = std::max<size_t>(kept_total * 2, 64);
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&host_kept_), grown * sizeof(int32_t)));
      host_kept_capacity_ = grown;
    }
  }
  if (any_redundancy) {
    ORIGAMI_RETURN_IF_ERROR(need(redundancy_, score_elems * sizeof(float)));
    ORIGAMI_RETURN_IF_ERROR(need(norms_, score_elems * sizeof(float)));
    ORIGAMI_RETURN_IF_ERROR(need(z_, score_elems * sizeof(int2)));
  }

  // Block evictions' metadata, sums and results (allocated before anything is enqueued).
  const size_t evict_desc_bytes = align16(evict_plan.descs.size() * sizeof(CompressionJobDesc));
  const size_t evict_chunk_bytes = align16(evict_plan.chunk_job.size() * sizeof(int32_t));
  const size_t evict_pages_bytes = align16(evict_plan.pages.size() * sizeof(int32_t));
  const size_t evict_meta_bytes = evict_desc_bytes + evict_chunk_bytes + evict_pages_bytes +
                                  align16(evict_plan.block_sum0.size() * sizeof(int32_t)) +
                                  align16(evict_plan.descs.size() * sizeof(int32_t));  // the chosen blocks
  if (!evict_plan.descs.empty()) {
    if (evict_meta_bytes > host_evict_meta_bytes_) {
      if (host_evict_meta_ != nullptr) cudaFreeHost(host_evict_meta_);
      host_evict_meta_ = nullptr;
      host_evict_meta_bytes_ = 0;
      const size_t grown = std::max<size_t>(evict_meta_bytes * 2, 4096);
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(&host_evict_meta_, grown));
      host_evict_meta_bytes_ = grown;
    }
    if (static_cast<size_t>(evict_plan.num_block_sums) > host_block_sums_capacity_) {
      if (host_block_sums_ != nullptr) cudaFreeHost(host_block_sums_);
      host_block_sums_ = nullptr;
      host_block_sums_capacity_ = 0;
      const size_t grown = std::max<size_t>(static_cast<size_t>(evict_plan.num_block_sums) * 2, 256);
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&host_block_sums_), grown * sizeof(float)));
      host_block_sums_capacity_ = grown;
    }
    if (evict_plan.descs.size() > host_evicted_capacity_) {
      if (host_evicted_ != nullptr) cudaFreeHost(host_evicted_);
      host_evicted_ = nullptr;
      host_evicted_capacity_ = 0;
      const size_t grown = std::max<size_t>(evict_plan.descs.size() * 2, 64);
      ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMallocHost(reinterpret_cast<void**>(&host_evicted_), grown * sizeof(int32_t)));
      host_evicted_capacity_ = grown;
    }
    ORIGAMI_RETURN_IF_ERROR(need(evict_meta_, evict_meta_bytes));
    ORIGAMI_RETURN_IF_ERROR(need(block_sums_, static_cast<size_t>(evict_plan.num_block_sums) * sizeof(float)));
    char* eh = static_cast<char*>(host_evict_meta_);
    std::memcpy(eh, evict_plan.descs.data(), evict_plan.descs.size() * sizeof(CompressionJobDesc));
    std::memcpy(eh + evict_desc_bytes, evict_plan.chunk_job.data(), evict_plan.chunk_job.size() * sizeof(int32_t));
    std::memcpy(eh + evict_desc_bytes + evict_chunk_bytes, evict_plan.pages.data(),
                evict_plan.pages.size() * sizeof(int32_t));
    std::memcpy(eh + evict_desc_bytes + evict_chunk_bytes + evict_pages_bytes, evict_plan.block_sum0.data(),
                evict_plan.block_sum0.size() * sizeof(int32_t));
  }
  evict_job_index_ = evict_plan.job_index;
  evict_sum_ranges_.clear();
  for (size_t i = 0; i < evict_plan.descs.size(); ++i)
    evict_sum_ranges_.emplace_back(evict_plan.block_sum0[i], evict_plan.descs[i].n / bs);

  // After everything already queued on the backend's stream (KV writes, query capture, copies).
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_, main_stream_));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, ready_, 0));
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(started_, stream_));
  if (meta_bytes > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev_meta_, host_meta_, meta_bytes, cudaMemcpyHostToDevice, stream_));
  for (const CompressionPart& part : parts) {
    const CompressionPlan& pl = part.plan;
    if (pl.descs.empty()) continue;
    char* dm = static_cast<char*>(dev_meta_);
    GroupArgs a;
    a.jobs = reinterpret_cast<const CompressionJobDesc*>(dm + part.descs_at);
    a.num_jobs = static_cast<int>(pl.descs.size());
    a.chunk_job = reinterpret_cast<const int32_t*>(dm + part.chunks_at);
    a.num_chunks = static_cast<int>(pl.chunk_job.size());
    a.span_chunks = reinterpret_cast<const int32_t*>(dm + part.spans_at);
    a.num_span_chunks = static_cast<int>(pl.span_chunks.size());
    a.other_redundancy = pl.other_redundancy;
    a.pages = reinterpret_cast<const int32_t*>(dm + part.pages_at);
    a.max_window_group = pl.max_window_group;
    a.any_redundancy = pl.any_redundancy;
    a.scorers = pl.scorers;
    a.num_kv_heads = g.num_kv_heads;
    a.group_size = group_size;
    a.head_dim = g.head_dim;
    a.block_size = bs;
    a.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
    a.kv_layer_pitch = g.kv_layer_pitch;
    a.q_layer_pitch = query_layer_pitch();
    a.max_window = config_.max_window;
    a.f_layer_pitch = score_layer_pitch();
    a.scores = static_cast<float*>(scores_.ptr);
    a.final_scores = static_cast<float*>(final_.ptr);
    a.redundancy = static_cast<float*>(redundancy_.ptr);
    a.norms = static_cast<float*>(norms_.ptr);
    a.z = static_cast<int2*>(z_.ptr);
    a.lse = static_cast<float2*>(lse_.ptr);
    a.keep = static_cast<int32_t*>(keep_.ptr);
    // The joint selection between scoring and selection (a part with joint jobs covers every
    // layer: one launch sequence).
    JointArgs ja;
    if (!part.joint.scopes.empty()) {
      a.kept_counts = static_cast<int32_t*>(kept_counts_.ptr) + part.kept0;
      ja.scopes = reinterpret_cast<const JointScope*>(dm + part.scopes_at);
      ja.num_scopes = static_cast<int>(part.joint.scopes.size());
      ja.members = reinterpret_cast<const int32_t*>(dm + part.members_at);
      ja.num_members = static_cast<int>(part.joint.members.size());
      ja.guaranteed = static_cast<int32_t*>(joint_guaranteed_.ptr);
      ja.cut = static_cast<unsigned long long*>(joint_cut_.ptr);
      ja.head_counts = static_cast<int32_t*>(joint_head_counts_.ptr);
      ja.kept_counts = static_cast<int32_t*>(kept_counts_.ptr) + part.kept0;
    }
    // Tensor parallelism: the joint selection over every rank's rows (see set_tensor_parallel).
    GroupArgs wa = a;
    JointArgs wja = ja;
    const bool wide = !wide_descs.empty() && ja.num_scopes > 0;
    if (wide) {
      // A joint batch is one launch sequence: every layer (full layout; `a` gets its per-group
      // fields in the loop below, the wide view needs them now) or every group (head groups).
      wa.num_group_layers = row_layers;
      wa.jobs = reinterpret_cast<const CompressionJobDesc*>(dm + wide_descs_at);
      wa.num_kv_heads = wide_heads;
      wa.final_scores = static_cast<float*>(wide_final_.ptr);
      wja.scopes = reinterpret_cast<const JointScope*>(dm + wide_scopes_at);
      wja.num_scopes = static_cast<int>(wide_joint.scopes.size());
      wja.members = reinterpret_cast<const int32_t*>(dm + wide_members_at);
      wja.num_members = static_cast<int>(wide_joint.members.size());
    }
    // Every rank's scored rows of the joint jobs into the wide layout: rank r's rows of layer l of
    // job d (row_heads contiguous rows at its score0 + l * row_heads * n, the same local layout on
    // every rank) go to the wide rows (l, r * row_heads ..) at the wide score0 + (l * wide_heads +
    // r * row_heads) * n. Every rank reaches the barrier, also after an error (then all stop).
    auto gather_rows = [&](bool ok) -> cudaError_t {
      meet_on_exit.peers = nullptr;  // met here
      if (ok) ok = cudaEventRecord(peers_->scored(tp_rank_), stream_) == cudaSuccess;
      peers_->rows(tp_rank_) = static_cast<const float*>(final_.ptr);
      if (!peers_->arrive_and_wait(ok)) return cudaErrorUnknown;
      float* dst = static_cast<float*>(wide_final_.ptr);
      for (int r = 0; r < tp_size; ++r) {
        if (r != tp_rank_) {
          const cudaError_t err = cudaStreamWaitEvent(stream_, peers_->scored(r), 0);
          if (err != cudaSuccess) return err;
        }
        const float* src = peers_->rows(r);
        for (size_t d = 0; d < pl.descs.size(); ++d) {
          if (!pl.descs[d].joint) continue;
          const size_t n = static_cast<size_t>(pl.descs[d].n), H = static_cast<size_t>(row_heads);
          const cudaError_t err = cudaMemcpy2DAsync(
              dst + wide_descs[d].score0 + r * H * n, wide_heads * n * sizeof(float), src + pl.descs[d].score0,
              H * n * sizeof(float), H * n * sizeof(float), static_cast<size_t>(row_layers), cudaMemcpyDefault, stream_);
          if (err != cudaSuccess) return err;
        }
      }
      return cudaEventRecord(peers_->read(tp_rank_), stream_);
    };
    auto launch = [&]() -> cudaError_t {
      cudaError_t err = launch_compression_scores(a, stream_);
      if (wide) {
        const cudaError_t gathered = gather_rows(err == cudaSuccess);
        if (err == cudaSuccess) err = gathered;
      }
      if (err == cudaSuccess && ja.num_scopes > 0)
        err = wide ? launch_joint_counts(wa, wja, stream_) : launch_joint_counts(a, ja, stream_);
      if (err == cudaSuccess) err = launch_compression_select(a, stream_);
      if (err == cudaSuccess) err = launch_compression_compact(a, stream_);
      return err;
    };
    if (grouped) {
      // Rows are the H_p head slots of each job's group; pages hold K then V of those slots.
      a.num_group_layers = 1;
      a.num_kv_heads = g.heads_per_group;
      a.kv_page_heads = 2 * g.heads_per_group;
      a.f_page_heads = g.heads_per_group;
      a.q_kv_heads = g.num_kv_heads;
      a.k = g.k;
      a.v = g.v;
      a.k8 = g.k8;
      a.v8 = g.v8;
      a.k_scales = g.k_scales;
      a.v_scales = g.v_scales;
      a.q = q_cache_;  // each job adds its own layer (CompressionJobDesc::layer)
      a.f = f_;
      ORIGAMI_CUDA_RETURN_IF_ERROR(launch());
      continue;
    }
    for (int l0 = 0; l0 < g.num_layers; l0 += stride) {
      a.num_group_layers = std::min(stride, g.num_layers - l0);
      set_layer_pool(a, g, l0);
      a.q = q_cache_ != nullptr ? q_cache_ + l0 * a.q_layer_pitch : nullptr;
      a.f = f_ != nullptr ? f_ + l0 * a.f_layer_pitch : nullptr;
      ORIGAMI_CUDA_RETURN_IF_ERROR(launch());
    }
  }
  // The joint counts reach pinned memory with the batch (account_finished_batch reads them).
  if (kept_total > 0)
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_kept_, kept_counts_.ptr, kept_total * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, stream_));
  if (!evict_plan.descs.empty()) {
    // Block evictions: the base scores of each layer group, summed per block, then the choice,
    // copied to pinned memory that done()/wait() read once the batch completed.
    ORIGAMI_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(evict_meta_.ptr, host_evict_meta_, evict_meta_bytes, cudaMemcpyHostToDevice, stream_));
    ORIGAMI_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(block_sums_.ptr, 0, static_cast<size_t>(evict_plan.num_block_sums) * sizeof(float), stream_));
    char* dm = static_cast<char*>(evict_meta_.ptr);
    const int32_t* sum0 = reinterpret_cast<const int32_t*>(dm + evict_desc_bytes + evict_chunk_bytes + evict_pages_bytes);
    int32_t* chosen = reinterpret_cast<int32_t*>(dm + evict_meta_bytes -
                                                 align16(evict_plan.descs.size() * sizeof(int32_t)));
    GroupArgs a;
    a.jobs = reinterpret_cast<const CompressionJobDesc*>(dm);
    a.num_jobs = static_cast<int>(evict_plan.descs.size());
    a.chunk_job = reinterpret_cast<const int32_t*>(dm + evict_desc_bytes);
    a.num_chunks = static_cast<int>(evict_plan.chunk_job.size());
    a.pages = reinterpret_cast<const int32_t*>(dm + evict_desc_bytes + evict_chunk_bytes);
    a.scorers = evict_plan.scorers;
    a.num_kv_heads = g.num_kv_heads;
    a.group_size = group_size;
    a.head_dim = g.head_dim;
    a.block_size = bs;
    a.scale = 1.0f / std::sqrt(static_cast<float>(g.head_dim));
    a.kv_layer_pitch = g.kv_layer_pitch;
    a.q_layer_pitch = query_layer_pitch();
    a.max_window = config_.max_window;
    a.scores = static_cast<float*>(scores_.ptr);
    int max_blocks = 0;
    for (const CompressionJobDesc& d : evict_plan.descs) max_blocks = std::max(max_blocks, d.n / bs);
    for (int l0 = 0; l0 < g.num_layers; l0 += stride) {
      a.num_group_layers = std::min(stride, g.num_layers - l0);
      set_layer_pool(a, g, l0);
      a.q = q_cache_ != nullptr ? q_cache_ + l0 * a.q_layer_pitch : nullptr;
      ORIGAMI_CUDA_RETURN_IF_ERROR(launch_base_scores(a, stream_));
      ORIGAMI_CUDA_RETURN_IF_ERROR(
          launch_block_score_sums(a, sum0, static_cast<float*>(block_sums_.ptr), max_blocks, stream_));
    }
    const float inv_count = 1.0f / (static_cast<float>(g.num_layers) * g.num_kv_heads * bs);
    ORIGAMI_CUDA_RETURN_IF_ERROR(launch_pick_evicted_blocks(a.jobs, a.num_jobs, sum0,
                                                            static_cast<const float*>(block_sums_.ptr), bs, inv_count,
                                                            chosen, stream_));
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_evicted_, chosen, evict_plan.descs.size() * sizeof(int32_t),
                                                 cudaMemcpyDeviceToHost, stream_));
    ORIGAMI_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_block_sums_, block_sums_.ptr,
                                                 static_cast<size_t>(evict_plan.num_block_sums) * sizeof(float),
                                                 cudaMemcpyDeviceToHost, stream_));
  }
  ORIGAMI_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
  in_flight_ = true;
  return Status::ok();
}

bool CudaCompressor::done() {
  if (!in_flight_) return true;
  const cudaError_t q = cudaEventQuery(done_);
  if (q == cudaErrorNotReady) return false;
  in_flight_ = false;
  if (q != cudaSuccess && status_.is_ok()) status_ = cuda_status(q, "compression batch");
  if (q == cudaSuccess) account_finished_batch();
  return true;
}

Status CudaCompressor::wait() {
  if (in_flight_) {
    const cudaError_t err = cudaEventSynchronize(done_);
    in_flight_ = false;
    if (err != cudaSuccess && status_.is_ok()) status_ = cuda_status(err, "compression batch");
    if (err == cudaSuccess) account_finished_batch();
  }
  return status_;
}

void CudaCompressor::account_finished_batch() {
  // The batch completed: its chosen blocks have reached pinned memory.
  for (size_t i = 0; i < evict_job_index_.size(); ++i) {
    evicted_blocks_[static_cast<size_t>(evict_job_index_[i])] = host_evicted_[i];
    const auto [sum0, count] = evict_sum_ranges_[i];
    evicted_block_sums_[static_cast<size_t>(evict_job_index_[i])].assign(host_block_sums_ + sum0,
                                                                         host_block_sums_ + sum0 + count);
  }
  // Its joint counts too (the kernels never exceed a job's num_keep: kept_count()).
  for (const auto& [job, at] : joint_kept_index_) kept_entries_[static_cast<size_t>(job)] = host_kept_[at];
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, started_, done_) == cudaSuccess) device_seconds_ += ms * 1e-3;
  else cudaGetLastError();  // timing is best effort; the batch itself succeeded
}

Status CudaCompressor::set_tensor_parallel(CompressorPeers* peers, int rank) {
  ORIGAMI_CUDA_RETURN_IF_ERROR(peers->init_rank(rank));
  peers_ = peers;
  tp_rank_ = rank;
  return Status::ok();
}

void CudaCompressor::copy_scores(BlockId src, BlockId dst, cudaStream_t stream) {
  if (f_ == nullptr) return;
  const bool grouped = geom_.heads_per_group > 0;
  const size_t page = static_cast<size_t>(grouped ? geom_.heads_per_group : geom_.num_kv_heads) * geom_.block_size;
  for (int l = 0; l < (grouped ? 1 : geom_.num_layers); ++l) {
    float* base = f_ + l * score_layer_pitch();
    ORIGAMI_CUDA_CHECK(cudaMemcpyAsync(base + dst * page, base + src * page, page * sizeof(float),
                                       cudaMemcpyDeviceToDevice, stream));
  }
}

}  // namespace origami::cuda
