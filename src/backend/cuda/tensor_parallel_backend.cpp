#include "backend/cuda/tensor_parallel_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "backend/cpu/block_eviction.h"
#include "kv/kv_layout_ranks.h"
#include "gates/gate_weights.h"
#include "backend/cuda/cuda_check.h"
#include "core/check.h"

namespace origami::cuda {

// ---------------------------------------------------------------- RankThreads

namespace {

// How long a rank thread spins for its next task before it sleeps: longer than the host's step
// between two runs (0.1-1 ms), far shorter than an idle engine's wait.
constexpr auto kSpin = std::chrono::milliseconds(2);
// How long the caller spins for the ranks to finish before it sleeps: longer than a decode step
// (10-50 ms), so a step's end is never a sleeping thread's wake-up (tens of microseconds on every
// step at TP = 2). The rank threads already spin in cudaStreamSynchronize meanwhile; a prefill
// step of seconds sleeps after this.
constexpr auto kCallerSpin = std::chrono::milliseconds(100);

// Spins until pred() holds or `spin` has passed; whether it holds.
template <typename Pred>
bool spin_until(Pred pred, std::chrono::milliseconds spin) {
  const auto deadline = std::chrono::steady_clock::now() + spin;
  for (int i = 0;; ++i) {
    if (pred()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

}  // namespace

RankThreads::RankThreads(const std::vector<int>& devices) {
  results_.resize(devices.size());
  for (size_t r = 0; r < devices.size(); ++r) threads_.emplace_back([this, r, d = devices[r]] { loop(static_cast<int>(r), d); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::loop(int rank, int device) {
  ORIGAMI_CUDA_CHECK(cudaSetDevice(device));
  uint64_t seen = 0;
  auto ready = [&] { return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen; };
  for (;;) {
    if (!spin_until(ready, kSpin)) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, ready);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    Status st = (*task_)(rank);
    results_[rank] = std::move(st);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The lock orders this with a caller between its check and its sleep (no lost wake-up).
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

Status RankThreads::run(const std::function<Status(int)>& fn) {
  task_ = &fn;
  remaining_.store(size(), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  work_cv_.notify_all();
  auto done = [&] { return remaining_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done, kCallerSpin)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, done);
  }
  task_ = nullptr;
  for (Status& st : results_)
    if (!st.is_ok()) return st;
  return Status::ok();
}

// ---------------------------------------------------------------- Compressor

class TensorParallelBackend::Compressor : public KVCompressor {
 public:
  explicit Compressor(TensorParallelBackend* tp) : tp_(tp) {}
  Status begin(const std::vector<CompressionJob>& jobs) override {
    return tp_->run([&](int r) { return tp_->ranks_[r]->compressor()->begin(jobs); });
  }
  bool done() override {
    std::vector<char> done(tp_->size(), 0);
    (void)tp_->run([&](int r) {
      done[r] = tp_->ranks_[r]->compressor()->done() ? 1 : 0;
      return Status::ok();
    });
    return std::all_of(done.begin(), done.end(), [](char d) { return d != 0; });
  }
  Status wait() override {
    return tp_->run([&](int r) { return tp_->ranks_[r]->compressor()->wait(); });
  }
  double device_seconds() const override {
    double s = 0.0;
    for (const auto& rank : tp_->ranks_) s = std::max(s, rank->compressor()->device_seconds());
    return s;
  }
  bool synchronous() const override { return tp_->ranks_[0]->compressor()->synchronous(); }

 private:
  TensorParallelBackend* tp_;
};

// ---------------------------------------------------------------- TensorParallelBackend

Expected<std::unique_ptr<Backend>> TensorParallelBackend::create(const BackendOptions& options) {
  const int size = options.tensor_parallel_size;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (size > count)
    return invalid_argument("tensor-parallel-size " + std::to_string(size) + " needs " + std::to_string(size) +
                            " GPUs; " + std::to_string(count) + " visible");
  std::vector<int> devices(size);
  std::iota(devices.begin(), devices.end(), 0);
  std::unique_ptr<TensorParallelBackend> tp(new TensorParallelBackend());
  ORIGAMI_ASSIGN_OR_RETURN(tp->comms_, NcclCommunicators::create(devices));
  tp->compressor_peers_ = std::make_unique<CompressorPeers>(size);
  using Reduce = BackendOptions::TensorParallelReduce;
  if ((options.tensor_parallel_reduce == Reduce::kPeer || options.tensor_parallel_reduce == Reduce::kPeerPull) &&
      PeerAllReduce::peers_reachable(size)) {
    tp->peer_group_ = std::make_unique<PeerReduceGroup>();
    tp->peer_group_->size = size;
  }
  tp->threads_ = std::make_unique<RankThreads>(devices);
  tp->ranks_.resize(size);
  // Each rank is built on its own thread, so its streams and handles belong to its device.
  ORIGAMI_RETURN_IF_ERROR(tp->run([&](int r) {
    TensorParallelRank rank;
    rank.rank = r;
    rank.size = size;
    rank.comms = &tp->comms_;
    rank.compressor_peers = tp->compressor_peers_.get();
    rank.peer_group = tp->peer_group_.get();
    tp->ranks_[r] = std::make_unique<CudaBackend>(options, rank);
    return Status::ok();
  }));
  return std::unique_ptr<Backend>(std::move(tp));
}

TensorParallelBackend::~TensorParallelBackend() {
  compressor_.reset();
  // Each rank is destroyed on its own device's thread, before the communicators it uses.
  if (threads_ != nullptr)
    (void)run([&](int r) {
      ranks_[r].reset();
      return Status::ok();
    });
  threads_.reset();
}

Status TensorParallelBackend::load(const ModelConfig& config, const ModelWeights& weights) {
  ORIGAMI_RETURN_IF_ERROR(CudaBackend::check_tensor_parallel(config, size()));
  ORIGAMI_RETURN_IF_ERROR(run([&](int r) { return ranks_[r]->load(config, weights); }));
  set_up_peer_reduce();
  return Status::ok();
}

Status TensorParallelBackend::load_dummy(const ModelConfig& config, uint64_t seed) {
  ORIGAMI_RETURN_IF_ERROR(CudaBackend::check_tensor_parallel(config, size()));
  ORIGAMI_RETURN_IF_ERROR(run([&](int r) { return ranks_[r]->load_dummy(config, seed); }));
  set_up_peer_reduce();
  return Status::ok();
}

void TensorParallelBackend::set_up_peer_reduce() {
  if (peer_group_ == nullptr) return;
  // Every rank registers its buffers before any connects; all ranks take the same path, so a
  // failure anywhere puts every rank back on NCCL.
  Status st = run([&](int r) { return ranks_[r]->init_peer_reduce(); });
  if (st.is_ok()) st = run([&](int r) { return ranks_[r]->connect_peer_reduce(); });
  if (!st.is_ok()) {
    std::fprintf(stderr, "[origami] tensor parallelism: all-reduce through NCCL (%s)\n", st.to_string().c_str());
    (void)run([&](int r) {
      ranks_[r]->drop_peer_reduce();
      return Status::ok();
    });
  }
}

size_t TensorParallelBackend::available_kv_bytes(size_t requested_bytes) const {
  // A rank holds 1/size of every page; the page count is what the smallest rank can hold.
  const size_t per_rank = requested_bytes / static_cast<size_t>(size());
  std::vector<size_t> avail(size(), 0);
  (void)run([&](int r) {
    avail[r] = ranks_[r]->available_kv_bytes(requested_bytes > 0 ? std::max<size_t>(per_rank, 1) : 0);
    return Status::ok();
  });
  return *std::min_element(avail.begin(), avail.end()) * static_cast<size_t>(size());
}

Status TensorParallelBackend::allocate_kv_cache(const KVLayout& layout) {
  // Every rank's pool has the same pages (block ids) and groups, holding its own heads, numbered
  // from 0 (kv_layout_ranks.h: head groups must hold as many heads on every rank).
  std::vector<KVLayout> rank_layouts;
  for (int r = 0; r < size(); ++r) {
    ORIGAMI_ASSIGN_OR_RETURN(KVLayout rank_layout, slice_layout_for_rank(layout, r, size()));
    rank_layouts.push_back(std::move(rank_layout));
  }
  compressor_.reset();
  kv_layout_ = layout;
  return run([&](int r) { return ranks_[r]->allocate_kv_cache(rank_layouts[r]); });
}

Status TensorParallelBackend::execute(const ForwardBatch& batch, StepOutput* out) {
  // finish_launched() reads the oldest launched step: none may be ahead of this one.
  if (!launched_.empty()) return invalid_argument("tensor parallelism: execute() while a launched step is unfinished");
  ORIGAMI_RETURN_IF_ERROR(launch(batch, out));
  return finish_launched(out);
}

Status TensorParallelBackend::launch(const ForwardBatch& batch, StepOutput* out) {
  if (launched_.size() == kMaxLaunched)
    return invalid_argument("tensor parallelism: a step launched while " + std::to_string(kMaxLaunched) +
                            " launched steps are unfinished");
  LaunchedStep& step = launched_.emplace_back();
  step.outs.resize(size());
  step.merged.assign(size(), 0);
  std::vector<char> launched(size(), 0);
  const Status st = run([&](int r) {
    Status rank_st = ranks_[r]->launch(batch, &step.outs[r]);
    launched[r] = rank_st.is_ok() ? 1 : 0;
    return rank_st;
  });
  out->finished_compressions.clear();
  merge_outputs(step, false, out);
  if (st.is_ok()) return Status::ok();
  // The ranks that did launch finish the step now, so that every rank's launched steps stay the
  // same ones; the step reports what a failed execute() reported.
  (void)run([&](int r) { return launched[r] != 0 ? ranks_[r]->finish_launched(&step.outs[r]) : Status::ok(); });
  merge_outputs(step, true, out);
  launched_.pop_back();
  return st;
}

Status TensorParallelBackend::finish_launched(StepOutput* out) {
  if (launched_.empty()) return invalid_argument("tensor parallelism: finish_launched() with no launched step");
  LaunchedStep& step = launched_.front();
  const Status st = run([&](int r) { return ranks_[r]->finish_launched(&step.outs[r]); });
  merge_outputs(step, true, out);
  launched_.pop_front();
  return st;
}

void TensorParallelBackend::merge_outputs(LaunchedStep& step, bool finished, StepOutput* out) {
  // Each rank reports a compression once, at the launch or the finish of some step.
  for (int r = 0; r < size(); ++r) {
    const std::vector<CompressionResult>& reported = step.outs[r].finished_compressions;
    for (size_t i = step.merged[r]; i < reported.size(); ++i)
      if (std::optional<CompressionResult> done = merge_compression(r, reported[i]))
        out->finished_compressions.push_back(std::move(*done));
    step.merged[r] = reported.size();
  }
  double seconds = 0.0, device_seconds = 0.0;
  for (const StepOutput& o : step.outs) {
    seconds = std::max(seconds, o.compression_seconds);
    device_seconds = std::max(device_seconds, o.compression_device_seconds);
  }
  double prepare = 0.0, device = 0.0;
  for (const StepOutput& o : step.outs) {
    prepare = std::max(prepare, o.prepare_seconds);
    device = std::max(device, o.device_seconds);
  }
  out->prepare_seconds = prepare;
  out->device_seconds = device;
  out->compression_seconds = seconds;
  out->compression_device_seconds = device_seconds;
  // The step's results are rank 0's (every rank sampled the same tokens): at launch their shape
  // (nothing sampled yet) and the kAll logits, computed then; once finished, the sampled tokens.
  StepOutput& first = step.outs[0];
  if (!finished) {
    out->sampled_tokens = first.sampled_tokens;
    out->token_logprobs = first.token_logprobs;
    out->logprobs = first.logprobs;
    out->all_logits = std::move(first.all_logits);
    return;
  }
  out->sampled_tokens = std::move(first.sampled_tokens);
  out->token_logprobs = std::move(first.token_logprobs);
  out->logprobs = std::move(first.logprobs);
}

std::optional<CompressionResult> TensorParallelBackend::merge_compression(int rank, const CompressionResult& c) {
  // One job per (request, head group); every rank runs each on its heads of the group, and it
  // finishes when its last rank does.
  // A block eviction (PagedEviction) drops the block with the lowest mean score over every rank's
  // heads: the ranks' per-block sums added (no entry moves, so every rank's pool stays consistent
  // with the one table whichever block goes; a rank that reported no sums leaves rank 0's choice).
  const std::pair<uint64_t, int> key{c.request_id, c.group};
  PartlyFinished& p = partly_finished_[key];
  ++p.ranks;
  if (p.status.is_ok() && !c.status.is_ok()) p.status = c.status;
  if (rank == 0) p.evicted_block = c.evicted_block;
  // A runtime allocation's count: every rank selected over every rank's heads, so they agree.
  if (c.status.is_ok()) p.kept.push_back(c.num_kept);
  if (!c.block_score_sums.empty()) {
    if (p.block_sums.empty()) p.block_sums.assign(c.block_score_sums.size(), 0.0);
    if (p.block_sums.size() == c.block_score_sums.size()) {
      for (size_t b = 0; b < p.block_sums.size(); ++b) p.block_sums[b] += c.block_score_sums[b];
      ++p.ranks_with_sums;
    }
  }
  if (p.ranks < size()) return std::nullopt;
  CompressionResult done;
  done.request_id = c.request_id;
  done.group = c.group;
  done.status = p.status;
  done.evicted_block = p.evicted_block;
  done.num_kept = p.kept.empty() ? -1 : p.kept[0];
  if (done.status.is_ok() && std::any_of(p.kept.begin(), p.kept.end(), [&](int k) { return k != done.num_kept; }))
    done.status = Status(ErrorCode::kInternal, "tensor parallelism: the ranks kept different entry counts");
  if (p.status.is_ok() && p.ranks_with_sums == size() && p.block_sums.size() >= 3) {
    // Means as the single-GPU choice takes them: over layers x every KV head x block size.
    const double count = static_cast<double>(kv_layout_.num_layers) * kv_layout_.num_kv_heads * kv_layout_.block_size;
    std::vector<double> means(p.block_sums.size());
    for (size_t b = 0; b < means.size(); ++b) means[b] = p.block_sums[b] / count;
    done.evicted_block = cpu::pick_evicted_block(means);
  }
  partly_finished_.erase(key);
  return done;
}

void TensorParallelBackend::copy_block(int group, BlockId src, BlockId dst) {
  (void)run([&](int r) {
    ranks_[r]->copy_block(group, src, dst);
    return Status::ok();
  });
}

Status TensorParallelBackend::configure_compression(const CompressionConfig& config) {
  ORIGAMI_RETURN_IF_ERROR(run([&](int r) { return ranks_[r]->configure_compression(config); }));
  compressor_ = std::make_unique<Compressor>(this);
  return Status::ok();
}

KVCompressor* TensorParallelBackend::compressor() { return compressor_.get(); }

Status TensorParallelBackend::load_gates(const gates::GateWeights& gates) {
  const int heads = gates.shape.num_kv_heads;
  if (heads % size() != 0)
    return invalid_argument("tensor parallelism: the gates' " + std::to_string(heads) + " KV heads do not split over " +
                            std::to_string(size()) + " ranks");
  const int per_rank = heads / size();
  return run([&](int r) { return ranks_[r]->load_gates(gates::slice_gates(gates, r * per_rank, per_rank)); });
}

size_t TensorParallelBackend::query_slot_bytes(int max_window) const {
  // Each rank keeps the queries of its own heads.
  return ranks_[0]->query_slot_bytes(max_window) * static_cast<size_t>(size());
}

}  // namespace origami::cuda
