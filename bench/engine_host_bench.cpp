// Host time per engine step with many page tables: the real Engine (scheduler, KV manager,
// ForwardBatch building, batch validation, output handling) over a backend that computes nothing,
// so that wall time / steps is the host's share of a step. The Qwen3-8B shape (36 layers x 8 KV
// heads) with Fast KVzip's per-head pages gives every request 288 page tables; this measures what
// that costs the host against one table (full KV, Zipage) and 72 tables (4 heads per group).
// The engine runs as `origami bench` runs it on the GPU machine: through run_batch with the
// bench's per-step hook, Qwen3's tokenizer (../shared/tokenizers/qwen3) detokenizing every output,
// and sampled tokens that vary over the vocabulary (a hash of request and position), so that the
// output handling between steps costs what it costs there.
//
// Built with the project (target engine_host_bench; ctest engine_host_page_table_copies runs it short
// with cuda-verify). Run from the repository:
//   build/engine_host_bench [num_requests=256] [output_tokens=1024] [policy=all] [inputs=cuda] [threads=1]
// ORIGAMI_HOST_BENCH_COMPRESSION_STEPS=k: compressions report k steps after they start (async).
// ORIGAMI_HOST_BENCH_ASYNC=1: with --async-scheduling (the outputs digest must not change).
// ORIGAMI_HOST_BENCH_DIGEST=1: also prints a digest of every step's batch (sequences, every table's
// length and pages, compression jobs), so that a change to the host code can show it schedules
// exactly as before (it reads every table every step: not for timing), and of every request's
// result (tokens, text, finish reason), so that a change to the output handling can show the same.
// policy: all | full | zipage | fastkvzip | fastkvzip-hpg4 | pagedeviction | snapkv-prefix |
// fastkvzip-prefix | full-turns | fastkvzip-turns. Prompts are 128 tokens (the -prefix ones: 640
// sharing their first 512, with prefix caching; the -turns ones: a second turn per request that
// continues its retained context), block 256, budget 1024 (ORIGAMI_HOST_BENCH_BLOCK / _BUDGET).
// inputs: what the backend does on the host with each batch:
//   validate     validate_forward_batch, every page of every table (the CPU backend)
//   cuda         the CUDA backend: validation without the page tables, then the tables sized and
//                flattened into an upload buffer with the page checks folded in (page_table_inputs.h)
//   cuda-before  the CUDA backend before that fold: the full validation, then the same flattening
//   cuda-nocopies  as cuda, every table read every step (no kept copies of versioned requests)
//   cuda-verify  as cuda, each kept copy checked against its tables every step (a change that did
//                not move RequestKV::pages_version fails an internal check), and each request's
//                table summary (RequestKV::summary) against a walk over its tables
// threads: the flattening's threads (PageTableInputs; the CUDA backend takes a quarter of the
// host's, at most 4).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "../apps/full_batch_meter.h"
#include "backend/backend.h"
#include "backend/forward_batch_validation.h"
#include "backend/page_table_inputs.h"
#include "engine/batch_runner.h"
#include "engine/engine.h"
#include "kv/table_summary.h"

using namespace origami;

namespace {

// ORIGAMI_HOST_BENCH_BLOCK / ORIGAMI_HOST_BENCH_BUDGET: the block size and budget (default 256 and
// 1024), e.g. the max-load runs' pages of 64 at budget 512. A value that is not a whole number
// from 1 to 2^20 reads as 0, which main() refuses.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(v, &end, 10);
  return errno == 0 && *end == '\0' && value >= 1 && value <= (1L << 20) ? static_cast<int>(value) : 0;
}
const int kBlockSize = env_int("ORIGAMI_HOST_BENCH_BLOCK", 256);
const int kBudget = env_int("ORIGAMI_HOST_BENCH_BUDGET", 1024);
// ORIGAMI_HOST_BENCH_COMPRESSION_STEPS: a compression batch reports this many steps after the
// step that starts it, as the CUDA backend's asynchronous compressor does (default 0: the same
// step; a value that is not a whole number from 1 to 2^20 reads as 0).
const int kCompressionSteps = env_int("ORIGAMI_HOST_BENCH_COMPRESSION_STEPS", 0);
const bool kDigest = env_int("ORIGAMI_HOST_BENCH_DIGEST", 0) == 1;
// ORIGAMI_HOST_BENCH_ASYNC=1: the engine schedules each step before the last one's tokens are
// known (--async-scheduling; the null backend runs a step when it is launched, so no host time is
// hidden here): its outputs digest must equal the synchronous engine's.
const bool kAsyncScheduling = env_int("ORIGAMI_HOST_BENCH_ASYNC", 0) == 1;

// FNV-1a over 64-bit words: the schedule's fingerprint (ORIGAMI_HOST_BENCH_DIGEST).
struct Digest {
  uint64_t value = 0xcbf29ce484222325ull;
  void add(int64_t word) {
    value ^= static_cast<uint64_t>(word);
    value *= 0x100000001b3ull;
  }
  void add_table(const std::vector<BlockId>& blocks, int num_entries) {
    add(num_entries);
    add(static_cast<int64_t>(blocks.size()));
    for (BlockId b : blocks) add(b);
  }
  // What the backend is asked to do: every sequence with every table it reads, every job.
  void add_batch(const ForwardBatch& batch) {
    for (const SequenceInput& s : batch.sequences) {
      for (int64_t w : {int64_t(s.request_id), int64_t{s.num_query_tokens}, int64_t{s.start_position},
                        int64_t{s.num_cached_entries}, int64_t{s.query_slot}, int64_t{s.query_capture_from}})
        add(w);
      if (s.kv == nullptr) add_table(*s.block_table, s.num_cached_entries);
      else for (size_t g = 0; g < s.kv->groups.size(); ++g) add_table(s.kv->groups[g].blocks, s.kv->num_entries(g));
    }
    for (const CompressionJob& j : batch.compressions) {
      for (int64_t w : {int64_t(j.request_id), int64_t{j.group}, int64_t(j.kind), int64_t{j.num_entries},
                        int64_t{j.num_keep}, int64_t{j.mean_keep}, int64_t{j.query_slot}, int64_t{j.num_scored_entries},
                        int64_t{j.first_compression}, int64_t{j.num_positions}})
        add(w);
      add_table(*j.src_blocks, j.num_entries);
      add_table(*j.dst_blocks, j.num_keep);
    }
    add(batch.wait_for_compressions);
  }
  // What a request's caller gets: its tokens, its text, how and when it ended.
  void add_result(const BatchResult& r) {
    for (int64_t w : {int64_t{r.ok}, int64_t(r.finish_reason), int64_t{r.num_prompt_tokens},
                      int64_t{r.num_cached_prompt_tokens}, int64_t{r.num_compressions}})
      add(w);
    add(static_cast<int64_t>(r.output_token_ids.size()));
    for (int32_t t : r.output_token_ids) add(t);
    add(static_cast<int64_t>(r.text.size()));
    for (unsigned char c : r.text) add(c);
    add(static_cast<int64_t>(r.error.size()));
  }
};

// Computes nothing: every sequence that samples gets a token hashed from its request and position
// (sampled_token), and every compression finishes in the step that starts it, keeping what the
// scheduler allows (a runtime allocation: a deterministic count per group around the job's mean,
// in whole pages where the recipe asks).
// It still does the host work of a real backend with every batch (`Inputs`).
enum class Inputs { kValidate, kCuda, kCudaBefore, kCudaNoCopies, kCudaVerify };

class NullBackend : public Backend {
 public:
  NullBackend(Inputs inputs, int threads) : tables_(threads), inputs_(inputs) {
    tables_.set_keep_copies(inputs != Inputs::kCudaNoCopies);
    tables_.set_verify(inputs == Inputs::kCudaVerify);
  }
  std::string name() const override { return "null"; }
  Status load(const ModelConfig& config, const ModelWeights&) override {
    model_ = config;
    return Status::ok();
  }
  Status load_dummy(const ModelConfig& config, uint64_t) override {
    model_ = config;
    return Status::ok();
  }
  size_t available_kv_bytes(size_t requested) const override {
    const size_t h100_kv = size_t{60} << 30;  // what an H100 has left beside Qwen3-8B in bf16
    return requested > 0 ? std::min(requested, h100_kv) : h100_kv;
  }
  Status allocate_kv_cache(const KVLayout& layout) override {
    limits_.vocab_size = model_.vocab_size;
    limits_.block_size = layout.block_size;
    limits_.num_blocks = layout.groups[0].num_blocks;
    limits_.num_groups = layout.num_groups();
    return Status::ok();
  }
  Status configure_compression(const CompressionConfig& config) override {
    limits_.num_query_slots = config.num_query_slots;
    return Status::ok();
  }
  size_t query_slot_bytes(int max_window) const override {
    return size_t{2} * model_.num_layers * max_window * model_.num_heads * model_.head_dim;  // bf16
  }
  Status load_gates(const gates::GateWeights&) override { return Status::ok(); }
  bool selects_jointly() const override { return true; }
  int num_groups() const { return limits_.num_groups; }  // page tables per request
  void copy_block(int, BlockId, BlockId) override {}

  Status execute(const ForwardBatch& batch, StepOutput* out) override {
    ForwardBatchLimits limits = limits_;
    limits.check_page_tables = inputs_ == Inputs::kValidate || inputs_ == Inputs::kCudaBefore;
    ORIGAMI_RETURN_IF_ERROR(validate_forward_batch(batch, limits));
    if (kDigest) digest.add_batch(batch);
    if (inputs_ == Inputs::kCudaVerify)
      for (const SequenceInput& s : batch.sequences)
        if (s.kv != nullptr && !summary_matches(s.kv->summary, *s.kv, limits_.block_size))
          return Status(ErrorCode::kInternal, "request " + std::to_string(s.request_id) +
                                                  ": its table summary differs from its tables");
    if (inputs_ != Inputs::kValidate) ORIGAMI_RETURN_IF_ERROR(flatten_tables(batch));
    out->sampled_tokens.clear();
    for (const SequenceInput& s : batch.sequences)
      out->sampled_tokens.push_back(s.logits_mode == LogitsMode::kNone ? -1 : sampled_token(s));
    out->finished_compressions.clear();
    ++step_;
    for (const CompressionJob& job : batch.compressions) {
      CompressionResult result;
      result.request_id = job.request_id;
      result.group = job.group;
      if (job.kind == CompressionKind::kCompact) result.num_kept = kept_count(job);
      if (job.kind == CompressionKind::kEvictBlock) result.evicted_block = 1;
      pending_.push_back({step_ + static_cast<uint64_t>(kCompressionSteps), std::move(result)});
    }
    // As the CUDA backend's asynchronous compressor: a batch reports in a later step's output
    // (ORIGAMI_HOST_BENCH_COMPRESSION_STEPS later; 0: the step that starts it).
    size_t due = 0;
    while (due < pending_.size() && pending_[due].first <= step_) ++due;
    for (size_t i = 0; i < due; ++i) out->finished_compressions.push_back(std::move(pending_[i].second));
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(due));
    return Status::ok();
  }

 private:
  // A model's output is text: a token that varies with the request and its position (a hash of
  // the two over the vocabulary), so that the detokenizer and the streamed text cost what they
  // cost with a real model's tokens rather than one cached piece repeated.
  int32_t sampled_token(const SequenceInput& s) const {
    uint64_t h = s.request_id * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(s.sample_index) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    return static_cast<int32_t>(h % static_cast<uint64_t>(model_.vocab_size));
  }

  int kept_count(const CompressionJob& job) const {
    if (job.mean_keep <= 0) return job.num_keep;  // the scheduler fixed the count
    // Joint selection: groups keep between half and 1.5x the mean (a fixed pattern over groups),
    // never fewer than the protected tail nor more than the job allows.
    const int spread = job.group * 7919 % 11;  // 0..10
    int kept = job.mean_keep / 2 + job.mean_keep * spread / 10;
    const int b = limits_.block_size;
    if (job.recipe != nullptr && job.recipe->page_aligned) kept = (kept + b / 2) / b * b;
    const int floor_keep = job.recipe != nullptr ? job.recipe->protected_tail() : 0;
    return std::min(std::max(kept, floor_keep), job.num_keep);
  }

  // As CudaBackend::prepare_step: sized, then flattened into a buffer that only grows.
  Status flatten_tables(const ForwardBatch& batch) {
    const int G = limits_.num_groups, seqs = static_cast<int>(batch.sequences.size());
    const int tokens = static_cast<int>(batch.token_ids.size());
    const auto t0 = std::chrono::steady_clock::now();
    const PageTableInputsSize size = tables_.size(batch, G, limits_.block_size);
    const auto t1 = std::chrono::steady_clock::now();
    if (!size.tables_cover) return Status(ErrorCode::kInternal, "a table does not cover its entries");
    auto grow = [](std::vector<int32_t>& v, size_t n) {
      if (v.size() < n) v.resize(n);
    };
    grow(slots_, static_cast<size_t>(G) * tokens);
    grow(indptr_, static_cast<size_t>(G) * seqs + 1);
    grow(kv_len_, static_cast<size_t>(G) * seqs);
    grow(pages_, static_cast<size_t>(size.num_pages));
    const PageTableInputsFill fill =
        tables_.fill(batch, limits_.num_blocks, seqs, tokens, {slots_.data(), indptr_.data(), kv_len_.data(), pages_.data()});
    const auto t2 = std::chrono::steady_clock::now();
    size_seconds += std::chrono::duration<double>(t1 - t0).count();
    fill_seconds += std::chrono::duration<double>(t2 - t1).count();
    if (!fill.pages_inside) return Status(ErrorCode::kInternal, "a page outside the pool");
    return Status::ok();
  }

  PageTableInputs tables_;
  Inputs inputs_;
  uint64_t step_ = 0;
  std::vector<std::pair<uint64_t, CompressionResult>> pending_;  // (step it reports in, result)
  ModelConfig model_;
  ForwardBatchLimits limits_{0, 1, 0, -1, 1};  // no query slots until configure_compression()
 public:
  double size_seconds = 0, fill_seconds = 0;
  Digest digest;
 private:
  std::vector<int32_t> slots_, indptr_, kv_len_, pages_;
};

struct Workload {
  const char* name;
  const char* policy;
  int heads_per_group;  // 0: the policy's default layout
  // Prefix caching on, prompts of 640 tokens sharing their first 512 (two pages), and half the
  // requests running at once: the later ones start from the earlier ones' cached pages.
  bool shared_prefix = false;
  // Retained contexts on, and a second turn per request once all have finished: each continues
  // its first turn's context (prompt + outputs + 16 new tokens) for a quarter of the outputs.
  bool second_turn = false;
};

int run(const Workload& w, int num_requests, int output_tokens, Inputs inputs, int threads) {
  EngineConfig config;
  config.model_dir = "../shared/configs/qwen3-8b";
  // The tokenizer `origami bench` runs with on the GPU machine (scripts/lib/gpu_common.sh's
  // BENCH_TOKENIZER): Qwen3's, else the tiny model's.
  config.tokenizer_dir = std::ifstream("../shared/tokenizers/qwen3/tokenizer.json").good()
                             ? "../shared/tokenizers/qwen3"
                             : "../shared/models/origami-tiny-qwen3";
  config.dummy_weights = true;
  // Not "cpu": that would size the KV cache in host memory and keep it in fp32. The backend is
  // the null one either way.
  config.device = "cuda";
  config.block_size = kBlockSize;
  config.kv_policy = w.policy;
  config.kv_budget = kBudget;
  config.heads_per_group = w.heads_per_group;
  config.max_num_seqs = w.shared_prefix ? std::max(1, num_requests / 2) : num_requests;
  config.max_num_batched_tokens = 8192;  // as the max-load runs (scripts/gpu_maxload.sh)
  config.enable_prefix_caching = w.shared_prefix;
  config.retain_contexts = w.second_turn;
  config.async_scheduling = kAsyncScheduling;
  if (std::strcmp(w.policy, "fastkvzip") == 0) config.kv_gates = kRandomKvGates;
  Expected<std::unique_ptr<Engine>> created = Engine::create(config, std::make_unique<NullBackend>(inputs, threads));
  if (!created) {
    std::fprintf(stderr, "%s: %s\n", w.name, created.status().to_string().c_str());
    return 1;
  }
  Engine& engine = **created;
  SamplingParams params;
  params.max_tokens = output_tokens;
  params.ignore_eos = true;
  params.temperature = 0.0f;
  std::vector<BatchItem> items(static_cast<size_t>(num_requests));
  for (int r = 0; r < num_requests; ++r) {
    std::vector<int32_t>& prompt = items[r].prompt_token_ids;
    prompt.resize(w.shared_prefix ? 640 : 128);
    for (size_t i = 0; i < prompt.size(); ++i) {
      const int owner = w.shared_prefix && i < 512 ? 0 : r;  // the shared part is request 0's
      prompt[i] = static_cast<int32_t>(100 + (owner * 131 + static_cast<int>(i) * 17) % 4000);
    }
    items[r].sampling = params;
  }
  int64_t errors = 0;
  int64_t expected_tokens = int64_t{num_requests} * output_tokens;
  // As `origami bench` drives the engine (apps/bench_command.cpp): run_batch, with its hooks
  // called every step and every result tallied as it becomes final.
  FullBatchMeter full_batch;
  Digest outputs_digest;
  BatchHooks hooks;
  hooks.on_result = [&](size_t, const BatchResult& r) {
    if (!r.ok) ++errors;
  };
  hooks.progress = [&](size_t, size_t) {
    full_batch.sample(engine.now(), engine.metrics().num_generated_tokens, static_cast<int>(engine.num_running()));
  };
  hooks.should_stop = [] { return false; };
  auto run_all = [&](const std::vector<BatchItem>& batch) {
    std::vector<BatchResult> results = run_batch(engine, batch, hooks);
    if (kDigest)
      for (const BatchResult& r : results) outputs_digest.add_result(r);
    return results;
  };
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<BatchResult> first_turn = run_all(items);
  if (w.second_turn) {
    SamplingParams turn = params;
    turn.max_tokens = std::max(1, output_tokens / 4);
    std::vector<BatchItem> second(items.size());
    for (size_t r = 0; r < items.size(); ++r) {
      std::vector<int32_t>& history = second[r].prompt_token_ids;
      history = items[r].prompt_token_ids;
      history.insert(history.end(), first_turn[r].output_token_ids.begin(), first_turn[r].output_token_ids.end());
      for (int i = 0; i < 16; ++i) history.push_back(static_cast<int32_t>(200 + i));
      second[r].sampling = turn;
    }
    expected_tokens += int64_t{num_requests} * turn.max_tokens;
    run_all(second);
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const EngineMetrics& m = engine.metrics();
  if (errors > 0 || m.num_generated_tokens != expected_tokens) {
    std::fprintf(stderr, "%s: %lld requests failed, %lld of %lld tokens generated\n", w.name,
                 static_cast<long long>(errors), static_cast<long long>(m.num_generated_tokens),
                 static_cast<long long>(expected_tokens));
    return 1;
  }
  const double steps = static_cast<double>(std::max<int64_t>(m.num_steps, 1));
  const int tables = static_cast<NullBackend&>(engine.backend()).num_groups();
  const double total_ms = 1e3 * wall / steps, sched_ms = 1e3 * m.schedule_seconds / steps;
  const double exec_ms = 1e3 * m.execute_seconds / steps;
  std::printf("| %-16s | %6d | %6lld | %11lld | %12.3f | %8.3f | %8.3f | %8.3f |\n", w.name, tables,
              static_cast<long long>(m.num_steps), static_cast<long long>(m.num_compressions), total_ms, sched_ms,
              exec_ms, total_ms - sched_ms - exec_ms);
  const NullBackend& nb = static_cast<NullBackend&>(engine.backend());
  std::printf("  (tables sized %.3f ms/step, flattened %.3f ms/step; prompt tokens from the prefix cache %lld, "
              "continued contexts %lld; preemptions %lld)\n",
              1e3 * nb.size_seconds / steps, 1e3 * nb.fill_seconds / steps,
              static_cast<long long>(m.num_prefix_cached_tokens), static_cast<long long>(m.num_retained_hits),
              static_cast<long long>(m.num_preemptions));
  if (kDigest)
    std::printf("  (schedule digest %016llx, outputs digest %016llx)\n", static_cast<unsigned long long>(nb.digest.value),
                static_cast<unsigned long long>(outputs_digest.value));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int num_requests = argc > 1 ? std::atoi(argv[1]) : 256;
  const int output_tokens = argc > 2 ? std::atoi(argv[2]) : 1024;
  const std::string which = argc > 3 ? argv[3] : "all";
  const std::string inputs_name = argc > 4 ? argv[4] : "cuda";
  const int threads = argc > 5 ? std::atoi(argv[5]) : 1;  // the CUDA backend's flattening threads
  Inputs inputs = Inputs::kCuda;
  if (inputs_name == "validate") inputs = Inputs::kValidate;
  else if (inputs_name == "cuda-before") inputs = Inputs::kCudaBefore;
  else if (inputs_name == "cuda-nocopies") inputs = Inputs::kCudaNoCopies;
  else if (inputs_name == "cuda-verify") inputs = Inputs::kCudaVerify;
  else if (inputs_name != "cuda") {
    std::fprintf(stderr, "unknown inputs '%.100s' (validate | cuda | cuda-before | cuda-nocopies | cuda-verify)\n",
                 inputs_name.c_str());
    return 2;
  }
  const Workload workloads[] = {
      {"full", "full", 0},
      {"zipage", "zipage", 0},
      {"fastkvzip", "fastkvzip", 0},  // per-head pages: one table per (layer, KV head)
      {"fastkvzip-hpg4", "fastkvzip", 4},
      {"pagedeviction", "pagedeviction", 0},       // block evictions
      {"snapkv-prefix", "snapkv", 0, true},         // prefix-cache hits, prefill-end compaction
      {"fastkvzip-prefix", "fastkvzip", 0, true},  // the same on per-head pages
      {"full-turns", "full", 0, false, true},            // retained contexts continued
      {"fastkvzip-turns", "fastkvzip", 0, false, true},  // the same, compressed, per-head pages
  };
  if (num_requests < 1 || output_tokens < 1 || threads < 1 || threads > 64) {
    std::fprintf(stderr, "usage: %s [num_requests >= 1] [output_tokens >= 1] [all|full|zipage|fastkvzip|fastkvzip-hpg4|pagedeviction|snapkv-prefix|fastkvzip-prefix|full-turns|fastkvzip-turns] [validate|cuda|cuda-before|cuda-nocopies|cuda-verify] [threads 1..64]\n",
                 argv[0]);
    return 2;
  }
  if (kBlockSize < 1 || kBudget < 1) {
    std::fprintf(stderr, "ORIGAMI_HOST_BENCH_BLOCK and ORIGAMI_HOST_BENCH_BUDGET must be whole numbers from 1 to %ld\n",
                 1L << 20);
    return 2;
  }
  std::printf("%d requests x (128 -> %d), block %d, budget %d, Qwen3-8B shape, null backend, inputs %s, %d thread(s)\n",
              num_requests, output_tokens, kBlockSize, kBudget, inputs_name.c_str(), threads);
  std::printf("| workload         | tables | steps  | compactions | host ms/step | schedule | execute* | rest     |\n");
  std::printf("|------------------|--------|--------|-------------|--------------|----------|----------|----------|\n");
  bool any = false;
  for (const Workload& w : workloads) {
    if (which != "all" && which != w.name) continue;
    any = true;
    if (run(w, num_requests, output_tokens, inputs, threads) != 0) return 1;
  }
  if (!any) {
    std::fprintf(stderr, "unknown workload '%.100s'\n", which.c_str());
    return 2;
  }
  return 0;
}
