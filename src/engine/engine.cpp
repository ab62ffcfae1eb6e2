#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>

#include "core/check.h"
#include "core/host_timers.h"
#include "engine/forward_batch_builder.h"
#include "engine/engine_setup_check.h"
#include "engine/head_budget_loader.h"
#include "engine/kv_memory_plan.h"
#include "kv/head_grouping.h"
#include "kv/kv_layout_ranks.h"
#include "policy/kvzip_prompt.h"
#include "sched/compression_state.h"
#include "model/weights.h"
#include "sampling/sampler.h"
#include "sampling/stop_checker.h"

namespace origami {

// A request plus what the engine needs to turn its tokens into streamed text.
struct Engine::Tracked {
  Request request;
  std::unique_ptr<StreamingDecoder> decoder;
  std::string text;         // all decoded output text (up to any stop string)
  size_t text_emitted = 0;  // bytes of `text` already reported
  bool reported_finish = false;
  std::vector<int32_t> forced_tokens;  // teacher forcing: output i is forced_tokens[i]
  bool forced_logprobs = false;        // report log p(forced token)
  int logprobs = -1;                   // RequestOptions::logprobs
  bool retain = true;                  // RequestOptions::retain_context
  bool retain_only = false;            // RequestOptions::retain_only
  // Its steps ask the backend for log-probabilities (of forced tokens, or the top ones).
  bool wants_logprobs() const { return forced_logprobs || logprobs >= 0; }
  // Its next step needs its last token on the host: penalties, min_tokens and logit_bias adjust
  // the logits by the outputs so far, and a forced token replaces the sampled one as the next
  // input. Steps are not pipelined while such a request runs (EngineConfig::async_scheduling).
  // Decided when it is added (a min_tokens mask alone empties its adjustments later on; the
  // engine's count of such requests must drop when it finishes all the same).
  bool needs_known_tokens = false;
};

namespace {

// --heads-per-group must cut every layer's KV heads into equal groups.
Status check_head_groups(const EngineConfig& config, const ModelConfig& mc) {
  const int hp = config.heads_per_group;
  if (hp < 0 || (hp > 0 && (hp > mc.num_kv_heads || mc.num_kv_heads % hp != 0)))
    return invalid_argument("--heads-per-group " + std::to_string(hp) + " must divide the model's " +
                            std::to_string(mc.num_kv_heads) + " KV heads (0 = all heads in one group)");
  return Status::ok();
}

// One budget ratio per head group of `layout` (empty when every ratio is 1: uniform budgets).
Expected<std::vector<float>> expand_group_budget_ratios(const EngineConfig& config, const KVLayout& layout) {
  const std::vector<float>& given = config.group_budget_ratios;
  if (given.empty()) return std::vector<float>{};
  if (!layout.shared_pool)
    return invalid_argument("group budget ratios need head groups (--heads-per-group below the model's " +
                            std::to_string(layout.num_kv_heads) + " KV heads)");
  const int num_groups = layout.num_groups();
  const int per_layer = num_groups / layout.num_layers;
  for (float r : given)
    if (!(r > 0.0f && r <= 1.0f))
      return invalid_argument("group budget ratio " + std::to_string(r) + " must be in (0, 1]");
  std::vector<float> ratios;
  if (static_cast<int>(given.size()) == num_groups) {
    ratios = given;
  } else if (static_cast<int>(given.size()) == per_layer) {
    for (int l = 0; l < layout.num_layers; ++l) ratios.insert(ratios.end(), given.begin(), given.end());
  } else {
    return invalid_argument("group budget ratios: got " + std::to_string(given.size()) + ", expected one per head group (" +
                            std::to_string(num_groups) + ") or one per group of a layer (" + std::to_string(per_layer) +
                            ")");
  }
  if (std::all_of(ratios.begin(), ratios.end(), [](float r) { return r == 1.0f; })) ratios.clear();
  return ratios;
}

// --kv-head-budgets: the file checked against the model, and its heads clustered by budget.
struct CalibratedGroups {
  HeadBudgets budgets;
  HeadGrouping grouping;
};
Expected<CalibratedGroups> calibrated_head_groups(const EngineConfig& config, const ModelConfig& mc) {
  if (!config.group_budget_ratios.empty())
    return invalid_argument("--kv-head-budgets and --group-budget-ratios both set the groups' budgets: give one");
  ORIGAMI_ASSIGN_OR_RETURN(HeadBudgets budgets, load_head_budgets_for_model(config.kv_head_budgets, mc));
  int hp = config.heads_per_group;
  if (hp == 0) hp = mc.num_kv_heads % 4 == 0 && mc.num_kv_heads / 4 >= 2 ? 4 : std::max(1, mc.num_kv_heads / 2);
  if (hp >= mc.num_kv_heads)
    return invalid_argument("--kv-head-budgets needs at least two head groups per layer: --heads-per-group " +
                            std::to_string(hp) + " is all of the model's " + std::to_string(mc.num_kv_heads) +
                            " KV heads");
  auto grouping = cluster_heads(budgets.ratios, hp);
  if (!grouping) return invalid_argument("--kv-head-budgets " + config.kv_head_budgets + ": " + grouping.status().to_string());
  return CalibratedGroups{std::move(budgets), std::move(grouping).value()};
}

}  // namespace

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) { return create(config, nullptr); }

Expected<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config, std::unique_ptr<Backend> backend) {
  std::unique_ptr<Engine> engine(new Engine());
  engine->config_ = config;
  engine->start_time_ = std::chrono::steady_clock::now();
  if (config.model_dir.empty()) return invalid_argument("--model is required");
  if (config.block_size < 1 || config.block_size > 1024)
    return invalid_argument("block size must be in [1, 1024], got " + std::to_string(config.block_size));
  if (config.max_num_seqs < 1) return invalid_argument("max_num_seqs must be >= 1");
  if (config.max_num_batched_tokens < 1) return invalid_argument("max_num_batched_tokens must be >= 1");

  ORIGAMI_ASSIGN_OR_RETURN(engine->model_config_, load_model_config(config.model_dir));
  const ModelConfig& mc = engine->model_config_;
  ORIGAMI_RETURN_IF_ERROR(check_head_groups(config, mc));

  const std::string tokenizer_dir = config.tokenizer_dir.empty() ? config.model_dir : config.tokenizer_dir;
  ORIGAMI_ASSIGN_OR_RETURN(std::shared_ptr<Tokenizer> tokenizer, Tokenizer::load(tokenizer_dir));
  engine->tokenizer_ = std::move(tokenizer);
  // KVzip's repeat prompt, for the reconstruction of `kvzip` compressions.
  engine->reconstruction_prompt_ = engine->tokenizer_->encode(kKVzipRepeatPrompt, /*add_special_tokens=*/false);
  for (int32_t id : engine->tokenizer_->encode(kKVzipPromptSuffix, /*add_special_tokens=*/false))
    engine->reconstruction_prompt_.push_back(id);
  ORIGAMI_RETURN_IF_ERROR(check_engine_setup(config, mc, *engine->tokenizer_));

  BackendOptions backend_options;
  backend_options.device = config.device;
  backend_options.num_threads = config.num_threads;
  backend_options.gpu_memory_utilization = config.gpu_memory_utilization;
  backend_options.enable_cuda_graphs = config.enable_cuda_graphs;
  backend_options.tensor_parallel_size = config.tensor_parallel_size;
  backend_options.tensor_parallel_reduce = config.custom_all_reduce ? BackendOptions::TensorParallelReduce::kPeer
                                                                     : BackendOptions::TensorParallelReduce::kNccl;
  backend_options.fp8_fast_accumulation = config.fp8_fast_accumulation;
  backend_options.fuse_fp8_quantize = config.fp8_fused_quantize;
  backend_options.fp8_gemv_rows = config.fp8_gemv_rows;
  backend_options.fp8_split_k = config.fp8_split_k;
  backend_options.fused_attention_merge = config.fused_attention_merge;
  backend_options.balanced_attention = config.balanced_attention;
  backend_options.mixed_decode_attention = config.mixed_decode_attention;
  if (config.quantization == "fp8") {
    backend_options.quantization = WeightQuantization::kFp8;
  } else if (config.quantization != "none") {
    return invalid_argument("--quantization must be none or fp8, got '" + config.quantization.substr(0, 100) + "'");
  }
  if (backend != nullptr) {
    engine->backend_ = std::move(backend);
  } else {
    ORIGAMI_ASSIGN_OR_RETURN(engine->backend_, create_backend(backend_options));
  }

  if (config.dummy_weights) {
    // The backend builds them where they live (the CUDA backend on the device: no host copy).
    ORIGAMI_RETURN_IF_ERROR(engine->backend_->load_dummy(mc, config.seed + 1));
  } else {
    ORIGAMI_ASSIGN_OR_RETURN(ModelWeights weights, load_model_weights(config.model_dir, mc));
    ORIGAMI_RETURN_IF_ERROR(engine->backend_->load(mc, weights));
  }  // host copies of the weights are released here; the backend holds its own

  // KV pool (an explicit block count wins, then a byte budget, then the backend's default),
  // split with the query slots and global-score pages compression needs.
  // --kv-cache-dtype: auto is the backend's native KV dtype (fp32 on the CPU, bf16 on CUDA); bf16
  // and fp8 on the CPU round its fp32 entries the way those caches would (kv/kv_cache_dtype.h).
  const DType kv_dtype = config.kv_cache_dtype == KVCacheDType::kBF16 ? DType::kBF16
                         : config.device == "cpu"                     ? DType::kF32
                                                                      : DType::kBF16;
  KVLayout layout = KVLayout::full(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.block_size, 0, kv_dtype);
  layout.fp8 = config.kv_cache_dtype == KVCacheDType::kFP8;
  ORIGAMI_ASSIGN_OR_RETURN(KVMemoryPlan memory, plan_kv_memory(config, mc, layout, *engine->backend_));
  int num_blocks = memory.num_blocks;
  layout.groups[0].num_blocks = num_blocks;
  // Calibrated head budgets: clustered groups and their ratios (below) replace the adjacent ones.
  EngineConfig grouped_config = config;
  // Head groups striped over the tensor-parallel ranks (kv/kv_layout_ranks.h), else adjacent.
  const int stripes = config.head_group_stripes > 0 ? config.head_group_stripes : std::max(1, config.tensor_parallel_size);
  std::optional<CalibratedGroups> calibrated;
  if (!config.kv_head_budgets.empty()) {
    ORIGAMI_ASSIGN_OR_RETURN(calibrated, calibrated_head_groups(config, mc));
    grouped_config.heads_per_group = calibrated->grouping.heads_per_group;
  } else if (!head_layout_given(config) && memory.default_policy != nullptr &&
             memory.default_policy->prefers_per_head_pages()) {
    // The default policy's method keeps a different count per head in whole pages (Fast KVzip's
    // global threshold): per-head pages make the memory follow the counts. --heads-per-group N
    // (N = the model's KV heads: one group) overrides it. Over R ranks (or stripes) a group takes
    // one head from each rank: its heads share a table and keep the largest of their counts.
    grouped_config.heads_per_group = stripes;
    if (config.tensor_parallel_size > 1)
      std::fprintf(stderr,
                   "[origami] tensor parallelism: KV policy %s on head groups of %d KV heads, one per rank (per-head "
                   "pages on one GPU): each group keeps the largest of its heads' counts\n",
                   memory.default_policy->name().c_str(), stripes);
  }
  if (grouped_config.heads_per_group > 0 && grouped_config.heads_per_group < mc.num_kv_heads) {
    // Head groups: the same memory, cut into group pages (one shared pool).
    const int hp = grouped_config.heads_per_group;
    const int per_block = mc.num_layers * (mc.num_kv_heads / hp);
    const int64_t pages = int64_t{num_blocks - 1} * per_block + 1;
    if (pages > std::numeric_limits<int32_t>::max())
      return invalid_argument("--heads-per-group " + std::to_string(hp) + ": " + std::to_string(pages) +
                              " group pages are more than block ids can name");
    num_blocks = static_cast<int>(pages);
    std::vector<std::vector<std::vector<int>>> heads;
    if (calibrated) {
      heads = calibrated->grouping.groups;
    } else if (stripes > 1) {
      ORIGAMI_ASSIGN_OR_RETURN(heads, striped_heads(mc.num_layers, mc.num_kv_heads, hp, stripes));
    } else {
      heads = KVLayout::adjacent_heads(mc.num_layers, mc.num_kv_heads, hp);
    }
    ORIGAMI_ASSIGN_OR_RETURN(layout, KVLayout::grouped(mc.num_layers, mc.num_kv_heads, mc.head_dim, config.block_size,
                                                       num_blocks, layout.dtype, heads));
    layout.fp8 = config.kv_cache_dtype == KVCacheDType::kFP8;
  }
  // Each group's share of the request's budget: its largest head's ratio over the largest group's.
  if (calibrated) grouped_config.group_budget_ratios = layout_group_shares(calibrated->budgets.ratios, layout);
  CompressionSupport& support = engine->compression_support_;
  ORIGAMI_ASSIGN_OR_RETURN(support.group_ratios, expand_group_budget_ratios(grouped_config, layout));
  for (size_t g = 0; g < support.group_ratios.size(); ++g) layout.groups[g].budget = support.group_ratios[g];
  ORIGAMI_RETURN_IF_ERROR(engine->backend_->allocate_kv_cache(layout));
  support.backend = engine->backend_->name();
  support.block_size = config.block_size;
  support.calibrated_head_budgets = calibrated.has_value();
  if (memory.compression) {
    Status st = engine->backend_->configure_compression(memory.compression_config);
    if (!st.is_ok() && memory.default_policy->compresses())
      return invalid_argument("KV policy " + memory.default_policy->name() + ": " + st.message());
    support.available = st.is_ok();
    support.unavailable_reason = st.message();
  } else {
    support.unavailable_reason = "compression is turned off (num_query_slots = -1)";
  }
  if (memory.default_policy != nullptr) ORIGAMI_RETURN_IF_ERROR(check_head_budgets(*memory.default_policy, support));
  if (memory.default_policy != nullptr) {
    support.joint_selection = engine->backend_->selects_jointly();
    ORIGAMI_RETURN_IF_ERROR(check_joint_selection(*memory.default_policy, support));
  }
  if (support.available) {
    support.num_query_slots = memory.compression_config.num_query_slots;
    support.max_window = memory.compression_config.max_window;
    support.global_scores = memory.compression_config.global_scores;
    // The reconstruction reads every layer and head through one table.
    support.reconstruction = engine->backend_->runs_reconstruction() && layout.num_groups() == 1;
    support.joint_selection = engine->backend_->selects_jointly();
  }
  if (!config.kv_gates.empty()) {
    if (!support.available || !support.global_scores)
      return invalid_argument("--kv-gates " + config.kv_gates +
                              ": gate scores live in the global-score pages, which this engine did not allocate "
                              "(compression off, or a default policy that needs none: use --kv-policy fastkvzip)");
    // "random": the reference initialization (gates::init_gates), seeded like the dummy weights,
    // so that benchmarks of model shapes without trained gates measure the gate's cost.
    const bool random_gates = config.kv_gates == kRandomKvGates;
    if (random_gates && !config.dummy_weights)
      return invalid_argument("--kv-gates random goes with --dummy-weights only (benchmarks); give a gates file "
                              "(`origami train-gates`)");
    Expected<gates::GateWeights> gate_weights =
        random_gates ? Expected<gates::GateWeights>(gates::init_gates(gates::gate_shape_for(mc), config.seed + 2))
                     : gates::load_gates(config.kv_gates, mc);
    if (!gate_weights) return invalid_argument("--kv-gates: " + gate_weights.status().message());
    Status st = engine->backend_->load_gates(*gate_weights);
    if (!st.is_ok()) return invalid_argument("--kv-gates " + config.kv_gates + ": " + st.message());
    support.gate_scores = true;
  }
  engine->kv_ = std::make_unique<KVCacheManager>(layout, config.enable_prefix_caching);
  if (config.retain_contexts) {
    if (!(config.retained_kv_share > 0.0 && config.retained_kv_share <= 1.0) && config.retained_kv_bytes <= 0)
      return invalid_argument("--retained-kv-memory: a share of the KV pool must be in (0, 1], got " +
                              std::to_string(config.retained_kv_share));
    const int64_t pages = num_blocks - 1;
    int64_t max_pages = static_cast<int64_t>(config.retained_kv_share * static_cast<double>(pages));
    if (config.retained_kv_bytes > 0) {
      const int64_t page_bytes = static_cast<int64_t>(std::max<size_t>(engine->backend_->kv_page_bytes(layout), 1));
      max_pages = std::min(pages, config.retained_kv_bytes / page_bytes);
    }
    if (max_pages < 1)
      return invalid_argument("--retained-kv-memory holds less than one KV page (" +
                              std::to_string(engine->backend_->kv_page_bytes(layout)) + " bytes)");
    engine->kv_->enable_retained_contexts(static_cast<int>(max_pages));
  }
  engine->metrics_.num_kv_blocks_total = num_blocks - 1;
  engine->metrics_.num_query_slots = support.num_query_slots;

  SchedulerConfig sc;
  sc.max_num_seqs = config.max_num_seqs;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.enable_chunked_prefill = config.enable_chunked_prefill;
  sc.max_model_len = config.max_model_len > 0 ? config.max_model_len : mc.max_position_embeddings;
  engine->config_.max_model_len = sc.max_model_len;
  if (!config.enable_chunked_prefill && sc.max_num_batched_tokens < sc.max_model_len)
    sc.max_num_batched_tokens = sc.max_model_len;  // a whole prompt must fit in one step
  sc.num_query_slots = support.num_query_slots;
  sc.reserve_bounded_kv = config.reserve_bounded_kv;
  sc.reserve_full_kv = config.reserve_full_kv;
  const KVCompressor* compressor = engine->backend_->compressor();
  sc.compress_before_forward =
      support.available && (!config.async_compression || (compressor != nullptr && compressor->synchronous()));
  engine->scheduler_ = std::make_unique<Scheduler>(sc, engine->kv_.get());
  engine->pipeline_ = std::make_unique<StepPipeline>(engine->backend_.get());
  return engine;
}

Engine::~Engine() {
  // The backend may still be running a launched step, and reading and writing pages for a
  // compression (CUDA: on its streams).
  if (pipeline_ != nullptr) {
    StepOutput discarded;
    while (pipeline_->num_launched() > 0) (void)pipeline_->finish(&discarded);
  }
  if (backend_ != nullptr && backend_->compressor() != nullptr) (void)backend_->compressor()->wait();
}

double Engine::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time_).count();
}

Expected<RequestId> Engine::add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params) {
  return add_request(std::move(prompt_token_ids), params, RequestOptions{});
}

Expected<RequestId> Engine::add_request(std::vector<int32_t> prompt_token_ids, const SamplingParams& params,
                                        const RequestOptions& options) {
  ORIGAMI_RETURN_IF_ERROR(params.validate());
  if (prompt_token_ids.empty()) return invalid_argument("prompt is empty");
  const int vocab = model_config_.vocab_size;
  for (size_t i = 0; i < prompt_token_ids.size(); ++i) {
    if (prompt_token_ids[i] < 0 || prompt_token_ids[i] >= vocab)
      return invalid_argument("prompt token " + std::to_string(i) + " has id " + std::to_string(prompt_token_ids[i]) +
                              ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  const int max_len = config_.max_model_len;
  if (static_cast<int>(prompt_token_ids.size()) >= max_len)
    return out_of_range("prompt has " + std::to_string(prompt_token_ids.size()) +
                        " tokens, but the model's context (max_model_len) is " + std::to_string(max_len) +
                        " tokens and at least one must be left to generate");

  if (options.logprobs < -1 || options.logprobs > kMaxTopLogprobs)
    return invalid_argument("logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "] (or -1 for none), got " +
                            std::to_string(options.logprobs));
  for (const auto& [t, bias] : params.logit_bias) {
    if (t >= vocab)
      return invalid_argument("logit_bias names token " + std::to_string(t) + ", outside the vocabulary [0, " +
                              std::to_string(vocab) + ")");
  }
  for (size_t i = 0; i < options.forced_output_tokens.size(); ++i) {
    const int32_t t = options.forced_output_tokens[i];
    if (t < 0 || t >= vocab)
      return invalid_argument("forced_output_tokens[" + std::to_string(i) + "] has id " + std::to_string(t) +
                              ", outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  // A request's own head budgets replace the engine's shares of the same (fixed) head groups.
  CompressionSupport request_support;
  if (options.kv_head_budgets != nullptr) {
    request_support = compression_support_;
    ORIGAMI_ASSIGN_OR_RETURN(request_support.group_ratios,
                             request_group_shares(*options.kv_head_budgets, options.kv_head_budgets_source));
    request_support.calibrated_head_budgets = true;
  }
  ORIGAMI_ASSIGN_OR_RETURN(
      RequestCompression compression,
      resolve_request_compression(config_, options.kv_head_budgets == nullptr ? compression_support_ : request_support,
                                  options));
  // Under prefill chunk compression a prompt holds at most its threshold plus one chunk.
  const int blocks_needed = kv_->blocks_needed(max_prefill_entries(
      compression, static_cast<int>(prompt_token_ids.size()) + 1, scheduler_->config().max_num_batched_tokens));
  if (blocks_needed > kv_->num_usable_blocks())
    return out_of_range("prompt needs " + std::to_string(blocks_needed) + " KV blocks but the cache has only " +
                        std::to_string(kv_->num_usable_blocks()));

  if (options.retain_only && !config_.retain_contexts)
    return invalid_argument("kv_retain: retaining a prompt without generating needs retained contexts, which this "
                            "engine has off (--no-retain-contexts)");
  if (options.retain_only && !options.retain_context)
    return invalid_argument("kv_retain: a retain-only request cannot also turn retained contexts off");
  if (options.retain_only && !options.forced_output_tokens.empty())
    return invalid_argument("forced_output_tokens: a retain-only request generates nothing");

  auto tracked = std::make_unique<Tracked>();
  tracked->retain = options.retain_context;
  tracked->retain_only = options.retain_only;
  tracked->forced_tokens = options.forced_output_tokens;
  tracked->forced_logprobs = options.return_forced_logprobs && !options.forced_output_tokens.empty();
  tracked->logprobs = options.logprobs;
  Request& r = tracked->request;
  r.compression = std::move(compression);
  r.id = next_request_id_++;
  r.prompt_token_ids = std::move(prompt_token_ids);
  r.sampling = params;
  // No request generates past the context: capped here, prompt + max_tokens <= max_model_len, so
  // the scheduler's sums of the two (reservations, peak blocks) stay within int.
  r.sampling.max_tokens = std::min(params.max_tokens, max_len - static_cast<int>(r.prompt_token_ids.size()));
  r.use_retained_contexts = options.retain_context;
  // A retain-only request never decodes: no reservation for outputs it will not produce.
  if (options.retain_only) r.sampling.max_tokens = 1;
  r.seed = resolve_seed(params, config_.seed, seed_counter_++);
  r.logit_adjustments = LogitAdjustments(params, r.prompt_token_ids, model_config_.eos_token_ids, vocab);
  r.arrival_time = now();
  tracked->decoder = std::make_unique<StreamingDecoder>(tokenizer_, /*skip_special_tokens=*/true);
  const RequestId id = r.id;
  if (tracked->wants_logprobs()) ++num_tracked_wanting_logprobs_;
  tracked->needs_known_tokens = !r.logit_adjustments.empty() || !tracked->forced_tokens.empty();
  if (tracked->needs_known_tokens) ++num_tracked_needing_tokens_;
  scheduler_->add_request(&tracked->request);
  requests_.emplace(id, std::move(tracked));
  return id;
}

Expected<std::vector<float>> Engine::request_group_shares(const HeadBudgets& budgets, const std::string& source) const {
  const std::string name = "kv_head_budgets" + (source.empty() || source == "kv_head_budgets" ? "" : " " + source);
  const KVLayout& layout = kv_->layout();
  if (!layout.shared_pool)
    return invalid_argument(name +
                            ": the engine has no head groups (pages belong to groups fixed at start); start it with "
                            "--kv-head-budgets FILE or --heads-per-group below the model's " +
                            std::to_string(model_config_.num_kv_heads) + " KV heads");
  const Status fits = check_head_budgets_model(budgets, model_identity(model_config_));
  if (!fits.is_ok()) return invalid_argument(name + ": " + fits.message());
  // The engine's groups stay; each takes its heads' largest ratio from these budgets.
  std::vector<float> shares = layout_group_shares(budgets.ratios, layout);
  if (std::all_of(shares.begin(), shares.end(), [](float r) { return r == 1.0f; })) shares.clear();
  return shares;
}

void Engine::abort_request(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->request.is_finished()) return;
  pending_aborts_.push_back(id);
}

bool Engine::has_unfinished() const {
  if (scheduler_->has_unfinished() || in_flight_.has_value() || !held_tokens_.empty()) return true;
  for (const auto& [id, t] : requests_)
    if (t->request.is_finished() && !t->reported_finish) return true;
  return false;
}

const Request* Engine::request(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second->request;
}

int Engine::num_kv_blocks_used() const { return kv_->total_used_blocks() - kv_->retained_only_pages(); }

void Engine::release_request(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !it->second->request.is_finished()) return;
  if (it->second->wants_logprobs()) --num_tracked_wanting_logprobs_;
  requests_.erase(it);
}

void Engine::finish(Tracked& tracked, FinishReason reason, std::vector<RequestOutput>* outputs, const std::string& error) {
  Request& r = tracked.request;
  if (r.is_finished()) return;
  const bool completed = reason == FinishReason::kLength || reason == FinishReason::kStop || reason == FinishReason::kEos;
  scheduler_->finish_request(&r, reason, config_.retain_contexts && tracked.retain && completed);
  // A token a launched step samples after its end is dropped (asynchronous scheduling).
  r.num_pending_tokens = 0;
  r.pending_sequence = -1;
  if (tracked.needs_known_tokens) --num_tracked_needing_tokens_;
  r.status = RequestStatus::kFinished;
  r.finish_reason = reason;
  r.error = error;
  r.finish_time = now();
  ++metrics_.num_finished;
  RequestOutput out;
  out.request_id = r.id;
  out.finished = true;
  out.finish_reason = reason;
  out.error = error;
  if (reason != FinishReason::kError && reason != FinishReason::kAborted) {
    out.new_text = tracked.text.substr(tracked.text_emitted);  // flush what was held back
    tracked.text_emitted = tracked.text.size();
  }
  tracked.reported_finish = true;
  outputs->push_back(std::move(out));
}

// Appends a sampled token, extends the decoded text, and decides whether the request stops.
void Engine::append_token(Tracked& tracked, int32_t token, bool forced, RequestOutput* output) {
  Request& r = tracked.request;
  const SamplingParams& sp = r.sampling;
  r.output_token_ids.push_back(token);
  r.logit_adjustments.add_output_token(token);
  if (r.first_token_time < 0) r.first_token_time = now();
  ++metrics_.num_generated_tokens;
  output->new_token_ids.push_back(token);

  // Forced tokens are the caller's text, not the model's choice: EOS and stops do not end them.
  const bool is_eos = !forced && std::find(model_config_.eos_token_ids.begin(), model_config_.eos_token_ids.end(), token) !=
                                     model_config_.eos_token_ids.end();
  const bool is_stop_token =
      !forced && std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end();
  if ((is_eos && !sp.ignore_eos) || is_stop_token) {
    output->finish_reason = is_stop_token ? FinishReason::kStop : FinishReason::kEos;
    tracked.text += tracked.decoder->flush();
  } else {
    const size_t before = tracked.text.size();
    tracked.decoder->push(token, tracked.text);
    // As in vLLM, stop strings are not looked for in the first min_tokens tokens.
    if (!sp.stop.empty() && !forced && static_cast<int>(r.output_token_ids.size()) > sp.min_tokens) {
      const StopMatch match = find_stop_string(tracked.text, before, sp.stop, sp.include_stop_str_in_output);
      if (match.found) {
        tracked.text.resize(match.truncate_at);
        output->finish_reason = FinishReason::kStop;
      }
    }
    if (output->finish_reason == FinishReason::kNone) {
      if (static_cast<int>(r.output_token_ids.size()) >= sp.max_tokens || r.num_tokens() >= config_.max_model_len) {
        output->finish_reason = FinishReason::kLength;
        tracked.text += tracked.decoder->flush();
      }
    }
  }
  // Stream everything except a tail that might still become a stop string.
  size_t safe = tracked.text.size();
  if (output->finish_reason == FinishReason::kNone && !sp.stop.empty())
    safe -= std::min(safe, stop_string_holdback(tracked.text, sp.stop));
  safe = std::max(safe, tracked.text_emitted);
  output->new_text.append(tracked.text, tracked.text_emitted, safe - tracked.text_emitted);
  tracked.text_emitted = safe;
}

void Engine::finish_retained_prompts(std::vector<RequestOutput>* outputs) {
  std::vector<RequestId> still;
  for (RequestId id : retain_only_waiting_) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->request.is_finished()) continue;
    Request& r = it->second->request;
    // Preempted meanwhile: it prefills again and comes back here when its prompt is done.
    if (r.status != RequestStatus::kRunning || r.num_computed_tokens < r.num_tokens()) continue;
    if (r.compression.pending || r.compression.in_flight) {
      still.push_back(id);  // its prompt-end compression is still to come
      continue;
    }
    finish(*it->second, FinishReason::kLength, outputs);
  }
  retain_only_waiting_ = std::move(still);
}

void Engine::update_retained_metrics() {
  const RetainedContextStats& st = kv_->retained_stats();
  metrics_.num_retained_contexts = st.num_retained;
  metrics_.num_retained_hits = st.num_hits;
  metrics_.num_retained_hit_tokens = st.num_hit_tokens;
  metrics_.num_retained_releases = st.num_releases;
  metrics_.retained_contexts_alive = st.num_contexts;
  metrics_.retained_kv_blocks = st.num_pages;
}

SchedulerOutput Engine::schedule_step(std::vector<RequestOutput>* outputs) {
  const double t0 = now();
  SchedulerOutput plan = scheduler_->schedule();
  metrics_.schedule_seconds += now() - t0;
  metrics_.num_preemptions += static_cast<int64_t>(plan.preempted.size());
  metrics_.num_query_slot_waits += plan.num_query_slot_waits;
  for (Request* r : plan.rejected) {
    finish(*requests_.at(r->id), FinishReason::kError, outputs,
           r->error.empty() ? "request needs more KV blocks than the whole cache holds" : r->error);
  }
  return plan;
}

void Engine::process_aborts(std::vector<RequestOutput>* outputs) {
  // A request being compressed keeps its pages until the backend is done; abort it afterwards.
  std::vector<RequestId> deferred;
  for (RequestId id : pending_aborts_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    if (it->second->request.compression.in_flight) {
      deferred.push_back(id);
    } else {
      finish(*it->second, FinishReason::kAborted, outputs);
    }
  }
  pending_aborts_ = std::move(deferred);
}

std::vector<RequestOutput> Engine::step() {
  ORIGAMI_HOST_TIMER("engine.step");
  std::vector<RequestOutput> outputs;
  process_aborts(&outputs);
  // A request that needs its last token on the host before its next step: the launched step's
  // tokens are taken first.
  if (!pipelining_allowed()) finish_in_flight_step(&outputs);
  SchedulerOutput plan = schedule_step(&outputs);
  if (plan.empty()) {
    // Nothing new to run (requests may wait for the tokens in flight): the launched step finishes.
    const bool finished_one = in_flight_.has_value();
    finish_in_flight_step(&outputs);
    if (finished_one || !held_tokens_.empty()) {
      take_held_tokens(&outputs);  // of requests that ended meanwhile: dropped
      process_aborts(&outputs);
      finish_retained_prompts(&outputs);
      update_retained_metrics();
    }
    return outputs;
  }
  outputs.reserve(outputs.size() + plan.sequences.size());  // a step reports about one per sequence

  ++metrics_.num_steps;
  metrics_.peak_running = std::max(metrics_.peak_running, static_cast<int>(scheduler_->num_running()));
  metrics_.peak_kv_blocks_used = std::max(metrics_.peak_kv_blocks_used, kv_->total_used_blocks());
  // Prompt tokens served by the prefix cache so far (admissions undone are taken back out).
  metrics_.num_prefix_cached_tokens = kv_->prefix_cache_stats().num_hit_tokens;
  for (const ScheduledSequence& s : plan.sequences) {
    const Request& r = *s.request;
    if (r.num_computed_tokens < r.num_prompt_tokens())
      metrics_.num_prompt_tokens_computed += std::min(s.num_new_tokens, r.num_prompt_tokens() - r.num_computed_tokens);
  }
  LaunchedStep launched;
  ForwardBatch batch;
  const double t1 = now();
  const Status st = launch_step(plan, &launched, &batch, &outputs);
  take_compressions(&pipeline_->launched_output());
  // The step before this one (asynchronous scheduling): its tokens, taken while this one runs.
  finish_in_flight_step(&outputs);
  const bool pipelined = st.is_ok() && pipelining_allowed();
  StepOutput result;
  Status finished = Status::ok();
  if (!pipelined) {
    finished = pipeline_->finish(&result);
    record_step_metrics(result);
    take_compressions(&result);
  }
  metrics_.execute_seconds += now() - t1;
  if (!finished.is_ok()) {
    // A backend failure is not one request's fault; fail the step's requests, keep the engine.
    for (const ScheduledSequence& s : plan.sequences)
      finish(*requests_.at(s.request->id), FinishReason::kError, &outputs, finished.to_string());
  }
  // The one place where the step's results reach the scheduler: computed tokens (requests failed
  // or finished above are skipped) and finished compressions.
  const SchedulerUpdate update = [&] {
    ORIGAMI_HOST_TIMER("engine.scheduler_update");
    return scheduler_->update_from_output(plan, reported_compressions_);
  }();
  metrics_.num_compressions += update.num_compressions;
  metrics_.num_evicted_tokens += update.num_evicted_entries;
  metrics_.num_kept_kv_pages += update.num_kept_pages;
  for (Request* r : update.failed_compressions) {
    const auto failed = std::find_if(reported_compressions_.begin(), reported_compressions_.end(),
                                     [&](const CompressionResult& c) { return c.request_id == r->id; });
    finish(*requests_.at(r->id), FinishReason::kError, &outputs,
           "KV compression failed: " + failed->status.to_string());
  }
  reported_compressions_.clear();
  take_held_tokens(&outputs);
  // Aborts that waited for a compression to finish.
  process_aborts(&outputs);
  if (!finished.is_ok()) {
    update_retained_metrics();
    return outputs;
  }
  if (pipelined) {
    // Its sampled tokens count as the requests' next ones until they are known.
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      Request& r = *plan.sequences[i].request;
      if (!launched.samples[i] || r.is_finished()) continue;
      ORIGAMI_CHECK_MSG(r.num_pending_tokens == 0, "a request sampled in a step while a token of the last one was unknown");
      r.num_pending_tokens = 1;
      r.pending_sequence = static_cast<int>(i);
    }
    in_flight_ = std::move(launched);
    ++metrics_.num_pipelined_steps;
  } else {
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      if (!launched.samples[i]) continue;
      take_sampled(launched.request_ids[i], result, i, &outputs);
    }
  }
  finish_retained_prompts(&outputs);
  update_retained_metrics();
  return outputs;
}

Status Engine::launch_step(const SchedulerOutput& plan, LaunchedStep* launched, ForwardBatch* batch,
                           std::vector<RequestOutput>* outputs) {
  ForwardBatchOptions batch_options;
  batch_options.block_size = config_.block_size;
  batch_options.synchronous_compression = scheduler_->config().compress_before_forward;
  // Each asks for a request's entry in requests_ (a hash lookup per sequence and step): only
  // while a request wants log-probabilities; the rest leave the batch's defaults (-1, none).
  if (num_tracked_wanting_logprobs_ > 0) {
    batch_options.logprob_token = [this](const Request& r) -> int32_t {
      const Tracked& tracked = *requests_.at(r.id);
      const size_t index = r.output_token_ids.size();
      return tracked.wants_logprobs() && index < tracked.forced_tokens.size() ? tracked.forced_tokens[index] : -1;
    };
    batch_options.num_top_logprobs = [this](const Request& r) { return requests_.at(r.id)->logprobs; };
  }
  batch_options.reconstruction_prompt = &reconstruction_prompt_;
  {
    ORIGAMI_HOST_TIMER("engine.build_forward_batch");
    *batch = build_forward_batch(plan, batch_options);
  }
  launched->request_ids.reserve(plan.sequences.size());
  launched->samples.reserve(plan.sequences.size());
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    launched->request_ids.push_back(plan.sequences[i].request->id);
    launched->samples.push_back(batch->sequences[i].logits_mode != LogitsMode::kNone);
  }
  // Continuations of retained contexts write their own copies of shared, partly filled pages.
  for (const BlockCopy& c : plan.block_copies) backend_->copy_block(c.group, c.src, c.dst);
  // A step with prompt tokens runs long, and its launch can hold the host for most of it (on the
  // H100, enqueueing a prefill step of 8,192 tokens returned when the step was nearly done): the
  // step in flight finishes first, so that its tokens (a first token, often) do not wait for this
  // one. Its host time is a sliver of such a step; decode steps stay pipelined.
  if (!batch->is_decode_only()) finish_in_flight_step(outputs);
  return pipeline_->launch(*batch);
}

void Engine::finish_in_flight_step(std::vector<RequestOutput>* outputs) {
  if (!in_flight_) return;
  const LaunchedStep launched = std::move(*in_flight_);
  in_flight_.reset();
  StepOutput result;
  const Status st = pipeline_->finish(&result);
  record_step_metrics(result);
  take_compressions(&result);
  for (size_t i = 0; i < launched.request_ids.size(); ++i) {
    auto it = requests_.find(launched.request_ids[i]);
    if (it == requests_.end() || it->second->request.is_finished()) continue;
    Tracked& tracked = *it->second;
    if (!st.is_ok()) {
      // Its pages may be read by a compression that started after the step: it ends with it.
      if (tracked.request.compression.in_flight) {
        pending_aborts_.push_back(launched.request_ids[i]);
        continue;
      }
      finish(tracked, FinishReason::kError, outputs, st.to_string());
      continue;
    }
    if (!launched.samples[i]) continue;
    take_sampled(launched.request_ids[i], result, i, outputs);
  }
}

void Engine::take_compressions(StepOutput* out) {
  if (out->finished_compressions.empty()) return;
  for (CompressionResult& c : out->finished_compressions) reported_compressions_.push_back(std::move(c));
  out->finished_compressions.clear();
}

void Engine::record_step_metrics(const StepOutput& out) {
  metrics_.compression_seconds += out.compression_seconds;
  metrics_.backend_prepare_seconds += out.prepare_seconds;
  metrics_.device_seconds += out.device_seconds;
  metrics_.compression_device_seconds = std::max(metrics_.compression_device_seconds, out.compression_device_seconds);
}

void Engine::take_held_tokens(std::vector<RequestOutput>* outputs) {
  if (held_tokens_.empty()) return;
  std::vector<HeldToken> still;
  std::vector<HeldToken> ready;
  for (HeldToken& h : held_tokens_) {
    auto it = requests_.find(h.id);
    if (it != requests_.end() && it->second->request.compression.in_flight) still.push_back(std::move(h));
    else ready.push_back(std::move(h));
  }
  held_tokens_ = std::move(still);
  for (HeldToken& h : ready)
    take_token(h.id, h.token, h.token_logprob, h.logprobs ? &*h.logprobs : nullptr, outputs);
}

void Engine::take_sampled(RequestId id, StepOutput& result, size_t i, std::vector<RequestOutput>* outputs) {
  // Backends fill the log-probability vectors only where a step asks for them.
  const float token_logprob =
      i < result.token_logprobs.size() ? result.token_logprobs[i] : std::numeric_limits<float>::quiet_NaN();
  take_token(id, result.sampled_tokens[i], token_logprob, i < result.logprobs.size() ? &result.logprobs[i] : nullptr,
             outputs);
}

void Engine::take_token(RequestId id, int32_t token, float token_logprob, TokenLogprobs* logprobs,
                        std::vector<RequestOutput>* outputs) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second->request.is_finished()) return;  // ended meanwhile: dropped
  Tracked& tracked = *it->second;
  Request& r = tracked.request;
  if (token == kNonFiniteLogits) {
    finish(tracked, FinishReason::kError, outputs,
           "the model's logits are not finite (NaN or infinite weights or activations); no token can be sampled");
    return;
  }
  if (token < 0) return;  // mid-prompt chunk
  if (r.compression.in_flight) {
    // Sampled before a compression that started after its step: it may end the request, whose
    // pages the compression still reads, so it waits for the compression (take_held_tokens).
    std::optional<TokenLogprobs> kept;
    if (logprobs != nullptr) kept = std::move(*logprobs);
    held_tokens_.push_back({id, token, token_logprob, std::move(kept)});
    return;
  }
  r.num_pending_tokens = 0;
  r.pending_sequence = -1;
  if (tracked.retain_only) {
    // Its prompt is computed: the token sampled from its end is not wanted.
    retain_only_waiting_.push_back(r.id);
    return;
  }
  RequestOutput out;
  out.request_id = r.id;
  const size_t index = r.output_token_ids.size();
  const bool forced = index < tracked.forced_tokens.size();
  if (forced) {
    token = tracked.forced_tokens[index];
    if (tracked.forced_logprobs) {
      ORIGAMI_CHECK_MSG(!std::isnan(token_logprob), "the backend returned no log-probability for a forced token");
      out.forced_logprobs.push_back(token_logprob);
    }
  }
  if (tracked.logprobs >= 0) {
    ORIGAMI_CHECK_MSG(logprobs != nullptr, "the backend returned no log-probabilities for the step");
    out.logprobs.push_back(std::move(*logprobs));
  }
  append_token(tracked, token, forced, &out);
  if (out.finish_reason != FinishReason::kNone) {
    const FinishReason reason = out.finish_reason;
    std::vector<RequestOutput> finished;
    finish(tracked, reason, &finished);
    out.finished = true;
    out.new_text += finished.front().new_text;
  }
  outputs->push_back(std::move(out));
}

}  // namespace origami
