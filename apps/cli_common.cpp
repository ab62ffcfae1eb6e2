#include "cli_common.h"

#include <cmath>
#include <cstdio>
#include <filesystem>

#include <limits>
#include <new>

#include "engine/engine_setup_check.h"
#include "policy/kv_budget.h"
#include "policy/policy_options.h"
#include "policy/policy_registry.h"

namespace origami::cli {

std::optional<ModelFiles> load_model_files(const std::string& model_dir, const std::string& tokenizer_dir) {
  Expected<ModelConfig> config = load_model_config(model_dir);
  if (!config) {
    print_error(config.status().to_string());
    return std::nullopt;
  }
  Expected<std::shared_ptr<Tokenizer>> tokenizer = Tokenizer::load(tokenizer_dir.empty() ? model_dir : tokenizer_dir);
  if (!tokenizer) {
    print_error(tokenizer.status().to_string());
    return std::nullopt;
  }
  return ModelFiles{*config, *tokenizer};
}

std::string default_model_dir() {
  // Looked up relative to the working directory first (the README runs from the checkout), then
  // to the executable's checkout (build/ sits inside it).
  for (const char* candidate : {"../shared/models/origami-tiny-qwen3", "../../shared/models/origami-tiny-qwen3"}) {
    if (std::filesystem::exists(std::filesystem::path(candidate) / "config.json")) return candidate;
  }
  return "../shared/models/origami-tiny-qwen3";
}

void print_error(const std::string& message) { std::fprintf(stderr, "origami: error: %s\n", message.c_str()); }
void print_warning(const std::string& message) { std::fprintf(stderr, "origami: warning: %s\n", message.c_str()); }

std::unique_ptr<Engine> create_engine(const EngineConfig& config) {
  try {
    Expected<std::unique_ptr<Engine>> engine = Engine::create(config);
    if (!engine) {
      print_error(engine.status().to_string());
      return nullptr;
    }
    const Engine& e = **engine;
    if (std::string w = tokenizer_mismatch_warning(config, e.model_config(), *e.tokenizer()); !w.empty()) print_warning(w);
    // Only a backend that returns before its step is done has anything to overlap.
    if (config.async_scheduling && !(*engine)->backend().launches_asynchronously())
      print_warning("--async-scheduling overlaps nothing on the " + (*engine)->backend().name() +
                    " backend, which runs each step when it is launched: the same tokens, each reported a step later");
    return std::move(*engine);
  } catch (const std::bad_alloc&) {
    // The size checks before loading should prevent this; any allocation that still fails is an
    // error of this run, not a crash.
    print_error("out of memory while loading the model from " + config.model_dir +
                " and setting up its KV cache: use a smaller model, --kv-cache-memory or --num-kv-blocks, or a machine "
                "with more memory");
    return nullptr;
  }
}

bool parse_memory_size(const std::string& text, int64_t* bytes) {
  if (text.empty()) return false;
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    return false;
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "kib" || unit == "k") scale = 1024.0;
  else if (unit == "mib" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else return false;
  if (!(value >= 0) || !std::isfinite(value)) return false;
  *bytes = static_cast<int64_t>(value * scale);
  return true;
}

void add_engine_flags(CLI::App* cmd, EngineFlags* flags) {
  EngineConfig& c = flags->config;
  c.model_dir = default_model_dir();
  cmd->add_option("--model", c.model_dir, "HuggingFace model folder (config.json, *.safetensors, tokenizer.json)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", c.tokenizer_dir, "Tokenizer folder (default: the model folder)");
  cmd->add_flag("--dummy-weights", c.dummy_weights, "Use random weights for the model's config (benchmarks)");
  cmd->add_option("--device", c.device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--threads", c.num_threads, "CPU threads (0 = all cores)")->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--gpu-memory-utilization", c.gpu_memory_utilization, "Share of GPU memory the engine may use")
      ->check(CLI::Range(0.05f, 1.0f))->capture_default_str();
  cmd->add_flag("!--no-cuda-graphs", c.enable_cuda_graphs, "Run decode steps eagerly (no CUDA graphs)");
  cmd->add_option("--tensor-parallel-size,--tp", c.tensor_parallel_size,
                  "GPUs to split the model over (CUDA, NCCL; KV heads are split across them)")
      ->check(CLI::Range(1, 64));
  cmd->add_flag("!--disable-custom-all-reduce", c.custom_all_reduce,
                "Tensor parallelism: sum the layers' partial outputs with NCCL instead of the fused peer-memory "
                "all-reduce");
  cmd->add_option("--quantization", c.quantization,
                  "fp8: FP8 E4M3 projections (bf16 checkpoints quantized per channel at load; FP8 checkpoints "
                  "always run in FP8)")
      ->check(CLI::IsMember({"none", "fp8"}))->capture_default_str();
  cmd->add_flag("--fp8-fast-accumulation", c.fp8_fast_accumulation,
                "FP8 GEMMs (CUDA): keep each dot product's whole sum in the tensor cores' accumulator (about 14 "
                "bits) instead of promoting partial sums to fp32, as FP8 inference stacks' forward GEMMs do: "
                "1.11-1.14x faster GEMMs at batch >= 512, +1% perplexity on the tiny model (docs/fidelity.md); "
                "the CPU's emulation is unchanged");
  cmd->add_option("--fp8-gemv-rows", c.fp8_gemv_rows,
                  "CUDA, FP8 projections: decode steps of 1 to N sequences multiply by a GEMV that streams the "
                  "weights instead of cuBLASLt's tensor-core GEMM (fp32 sums; 0 turns it off; faster on the H100 "
                  "at 1-2 rows, docs/kernels.md)")
      ->check(CLI::Range(0, 4))->capture_default_str();
  cmd->add_flag("--fp8-split-k,!--no-fp8-split-k", c.fp8_split_k,
                "CUDA, FP8 projections: at decode's batch sizes, narrow products with a long K (o, down) split K "
                "in two where that measured faster on the H100 (docs/kernels.md; on by default)");
  cmd->add_flag("--fused-attention-merge,!--no-fused-attention-merge", c.fused_attention_merge,
                "CUDA: decode attention with 16 or more KV splits (batch 1-4, long contexts, graph steps) merges "
                "them in the last CTA of each sequence and head instead of a second kernel (the same results bit "
                "for bit; on by default)");
  cmd->add_flag("--balanced-attention,!--no-balanced-attention", c.balanced_attention,
                "CUDA, FP8 KV cache: decode attention shares the batch's KV tiles evenly over one wave of CTAs "
                "instead of fixed splits per sequence and head (on by default; off only to compare)");
  cmd->add_flag("--mixed-decode-attention,!--no-mixed-decode-attention", c.mixed_decode_attention,
                "CUDA, FP8 KV cache: steps with prompt tokens run the decode rows' attention in the decode kernels "
                "and the prompts' in a second launch (on by default; off only to compare)");
  cmd->add_flag("--fp8-fused-quantize,!--no-fp8-fused-quantize", c.fp8_fused_quantize,
                "CUDA, FP8 projections: the norms and the MLP activation quantize their output themselves (no "
                "separate quantize kernel; the same results bit for bit; on by default)");
  flags->block_size_flag =
      cmd->add_option("--block-size", c.block_size,
                      "Tokens per KV page (default: 32 on CUDA for full KV on one page table per layer; 16 on "
                      "the CPU, under compression, with head groups and in eval, whose policies share the engine)")
          ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-num-seqs", c.max_num_seqs, "Most requests running at once")->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", c.max_num_batched_tokens, "Most new tokens per step (chunked prefill budget)")
      ->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_flag("!--no-chunked-prefill", c.enable_chunked_prefill, "Prefill each prompt in one step");
  cmd->add_option("--max-model-len", c.max_model_len, "Longest prompt + output (default and maximum: the model's context)")
      ->check(CLI::Range(1, std::numeric_limits<int>::max()));
  cmd->add_option("--kv-cache-memory", flags->kv_cache_memory, "KV cache size, e.g. 2GiB (default: CPU 1GiB, CUDA from free memory)");
  cmd->add_option("--kv-cache-dtype", flags->kv_cache_dtype,
                  "KV cache element type: auto (the model's: bf16 on CUDA, fp32 on the CPU), bf16, or fp8 (E4M3 with a "
                  "scale per token and KV head; about half the bytes of bf16; the CPU emulates its rounding)")
      ->check(CLI::IsMember({"auto", "bf16", "fp8"}))->capture_default_str();
  cmd->add_option("--num-kv-blocks", c.num_kv_blocks, "KV cache size in blocks (overrides --kv-cache-memory)")
      ->check(CLI::Range(1, 1 << 30));
  cmd->add_flag("--enable-prefix-caching", c.enable_prefix_caching, "Reuse KV blocks of shared prompt prefixes");
  cmd->add_flag("--retain-contexts", flags->retain_contexts,
                "Keep finished requests' KV (compressed or not) as contexts that later requests beginning with "
                "the same tokens continue (serve: on by default)");
  cmd->add_flag("--no-retain-contexts", flags->no_retain_contexts, "Do not retain contexts (serve retains by default)");
  cmd->add_option("--retained-kv-memory", flags->retained_kv_memory,
                  "Most KV memory retained contexts hold: a share of the KV pool (50%, 0.5) or a size (2GiB); "
                  "default: the whole pool (contexts are released, least recently used first, whenever a request "
                  "needs their pages)");
  cmd->add_option("--heads-per-group", c.heads_per_group,
                  "KV heads per head group: each (layer, group of heads) gets its own page table from one shared "
                  "pool (CPU and CUDA; default: all heads, one group, or one head per group when the "
                  "--kv-policy keeps page-aligned per-head counts, as fastkvzip does). With --tensor-parallel-size R "
                  "a group takes N / R heads from each rank (N a multiple of R; the per-head default becomes R "
                  "heads, one per rank)")
      ->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--group-budget-ratios", c.group_budget_ratios,
                  "Each head group's share of the KV budget, in (0, 1]: one per group, or one per group of a layer "
                  "(default: 1.0 each)")
      ->delimiter(',');
  cmd->add_option("--kv-head-budgets", c.kv_head_budgets,
                  "Calibrated per-head budgets (`origami calibrate`): heads grouped by budget, each group keeping its "
                  "share of --kv-budget (the largest group's, or the average per head for --kv-policy tangram; CPU "
                  "and CUDA; --heads-per-group default 4)");
  cmd->add_option("--kv-gates", c.kv_gates,
                  "Fast KVzip gate weights (`origami train-gates`) for the fastkvzip policy (CPU and CUDA); "
                  "`random` with --dummy-weights: random gates of the model's shape (benchmarks)");
  // KV compression (`origami policies` lists the policies and their options).
  cmd->add_option("--kv-policy", c.kv_policy, "KV compression policy of requests that name none (see `origami policies`)")
      ->capture_default_str();
  cmd->add_option("--kv-budget", c.kv_budget, "Tokens of KV per request after compression (0 = the policy's default)")
      ->check(CLI::Range(0, kMaxKvBudget));
  cmd->add_option("--kv-policy-opt", flags->kv_policy_opts, "Policy option key=value, e.g. window=16 (repeatable)");
  cmd->add_flag("!--no-async-compression", c.async_compression, "Wait for each compression instead of overlapping it with decoding");
  flags->async_scheduling_flag = cmd->add_flag(
      "--async-scheduling,!--no-async-scheduling", flags->async_scheduling,
      "Schedule and launch each step before the last one's tokens reach the host, so that detokenizing and "
      "scheduling overlap the device (default: on with --device cuda, off on the CPU, where it overlaps "
      "nothing; a request's end is seen one step late and the extra token dropped; steps run one at a time "
      "while a request uses penalties, logit_bias, min_tokens or forced tokens)");
  cmd->add_flag("!--no-kv-reservation", c.reserve_bounded_kv,
                "Admit compressed requests without reserving the blocks they will grow into (they may be preempted)");
  cmd->add_flag("--reserve-full-kv", c.reserve_full_kv,
                "Admit a full-KV request only when the cache holds its prompt + max_tokens: never preempted "
                "(GUARANTEED_NO_EVICT); default: admitted on its prompt, preempted and recomputed when the cache runs out");
  cmd->add_option("--compression-layer-stride", c.compression_layer_stride, "Layers scored and compacted together")
      ->check(CLI::Range(1, 1 << 16))->capture_default_str();
  cmd->add_option("--query-slots", c.num_query_slots,
                  "Query slots M (0 = from the budget, Zipage eq. 1; -1 = no compression support)")
      ->check(CLI::Range(-1, 1 << 20));
  cmd->add_option("--query-window", c.query_window, "Rows per query slot (0 = the default policy's window)")
      ->check(CLI::Range(0, 4096));
}

bool finalize_engine_flags(EngineFlags* flags, bool build_default_policy) {
  // The CUDA backend (one GPU or tensor-parallel) returns from a launch before its step is done;
  // the CPU backend runs the step in the launch, so pipelining would only report tokens later.
  const bool async_given = flags->async_scheduling_flag != nullptr && flags->async_scheduling_flag->count() > 0;
  flags->config.async_scheduling = async_given ? flags->async_scheduling : flags->config.device == "cuda";
  for (const std::string& opt : flags->kv_policy_opts) {
    PolicyOptionMap one;
    Status st = parse_policy_option(opt, &one);
    if (!st.is_ok()) {
      print_error("--kv-policy-opt: " + st.message());
      return false;
    }
    for (const auto& [key, value] : one) {
      auto [it, inserted] = flags->config.kv_policy_options.emplace(key, value);
      if (!inserted) {
        print_error("--kv-policy-opt: '" + key + "' is given twice (" + key + "=" + it->second + " and " + opt +
                    "); give each option once");
        return false;
      }
    }
  }
  // The policy and its options are built here, before the model loads, so that a bad name or
  // value (window=1e3 is not an integer) is a usage error (exit 2), not a setup failure.
  if (build_default_policy) {
    Expected<std::shared_ptr<const KVPolicy>> policy =
        PolicyRegistry::builtin().create(flags->config.kv_policy, flags->config.kv_policy_options);
    if (!policy) {
      print_error("--kv-policy / --kv-policy-opt: " + policy.status().message());
      return false;
    }
    const bool block_size_given = flags->block_size_flag != nullptr && flags->block_size_flag->count() > 0;
    if (!block_size_given)
      flags->config.block_size = default_block_size(flags->config.device, (*policy)->compresses(),
                                                     flags->config.heads_per_group);
    if (flags->config.kv_budget > 0 && !(*policy)->compresses()) {
      print_error("--kv-budget " + std::to_string(flags->config.kv_budget) + " is given, but KV policy '" +
                  flags->config.kv_policy + "' does not compress (it keeps every token); name a compressing --kv-policy");
      return false;
    }
    // A budget the policy cannot run (below one block, within what it always protects) is the
    // flag's error, as a request's kv_budget is the request's.
    if (flags->config.kv_budget > 0) {
      if (Status st = (*policy)->check_budget(flags->config.kv_budget, flags->config.block_size); !st.is_ok()) {
        print_error("--kv-budget: " + st.message());
        return false;
      }
    }
  }
  for (double ratio : flags->config.group_budget_ratios) {
    if (!(ratio > 0.0 && ratio <= 1.0)) {  // also NaN
      print_error("--group-budget-ratios: " + std::to_string(ratio) + " is not in (0, 1]: each head group's share of the KV budget must be positive and at most 1");
      return false;
    }
  }
  if (!parse_kv_cache_dtype(flags->kv_cache_dtype, &flags->config.kv_cache_dtype)) {
    print_error("--kv-cache-dtype: expected auto, bf16 or fp8");
    return false;
  }
  if (flags->retain_contexts && flags->no_retain_contexts) {
    print_error("--retain-contexts and --no-retain-contexts contradict each other: give one");
    return false;
  }
  if (flags->retain_contexts) flags->config.retain_contexts = true;
  if (flags->no_retain_contexts) flags->config.retain_contexts = false;
  if (!flags->retained_kv_memory.empty()) {
    const std::string& text = flags->retained_kv_memory;
    const bool percent = text.back() == '%';
    char* end = nullptr;
    const double value = std::strtod(text.c_str(), &end);
    const bool number = end != text.c_str() && (percent ? end == text.c_str() + text.size() - 1 : *end == '\0');
    int64_t bytes = 0;
    if (number && (percent || text.find('.') != std::string::npos || value <= 1.0)) {
      const double share = percent ? value / 100.0 : value;
      if (!(share > 0.0 && share <= 1.0)) {
        print_error("--retained-kv-memory: a share of the KV pool must be in (0, 100%], got '" + text.substr(0, 100) + "'");
        return false;
      }
      flags->config.retained_kv_share = share;
    } else if (parse_memory_size(text, &bytes) && bytes > 0) {
      flags->config.retained_kv_bytes = bytes;
    } else {
      print_error("--retained-kv-memory: cannot read '" + text.substr(0, 100) + "' as a share (50%, 0.5) or a size (2GiB)");
      return false;
    }
  }
  if (!flags->kv_cache_memory.empty()) {
    int64_t bytes = 0;
    if (!parse_memory_size(flags->kv_cache_memory, &bytes) || bytes <= 0) {
      print_error("--kv-cache-memory: cannot read '" + flags->kv_cache_memory.substr(0, 100) +
                  "' as a size (e.g. 2GiB, 512MiB)");
      return false;
    }
    flags->config.kv_cache_bytes = bytes;
  }
  return true;
}

void add_sampling_flags(CLI::App* cmd, SamplingParams* p, std::string* seed_text) {
  cmd->add_option("--max-tokens", p->max_tokens, "Most tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", p->temperature, "Sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-p", p->top_p, "Nucleus sampling threshold");
  cmd->add_option("--top-k", p->top_k, "Keep the k most likely tokens (0 = off)");
  cmd->add_option("--min-p", p->min_p, "Drop tokens below min_p * p(max)");
  cmd->add_option("--seed", *seed_text, "Sampling seed");
  cmd->add_flag("--ignore-eos", p->ignore_eos, "Keep generating after EOS");
  cmd->add_option("--stop", p->stop, "Stop string (repeatable)");
  cmd->add_option("--stop-token-ids", p->stop_token_ids, "Stop token ids");
  cmd->add_option("--presence-penalty", p->presence_penalty, "Subtract from tokens already generated, in [-2, 2]");
  cmd->add_option("--frequency-penalty", p->frequency_penalty,
                  "Subtract this times each token's count in the output, in [-2, 2]");
  cmd->add_option("--repetition-penalty", p->repetition_penalty,
                  "Divide positive / multiply negative logits of prompt and output tokens (> 0; 1 = off)");
  cmd->add_option("--min-tokens", p->min_tokens, "Generate at least this many tokens before EOS or a stop");
}

bool finalize_sampling_flags(SamplingParams* p, const std::string& seed_text) {
  if (!seed_text.empty()) {
    // Digits only: std::stoull reads "-1" as 2^64 - 1. llama.cpp's -1 ("random") is refused, as
    // for a request's "seed": leave --seed out for an unseeded run.
    if (seed_text.find_first_not_of("0123456789") != std::string::npos) {
      print_error("--seed: '" + seed_text.substr(0, 100) + "' is not a non-negative integer (leave --seed out for a random seed)");
      return false;
    }
    try {
      size_t pos = 0;
      p->seed = std::stoull(seed_text, &pos);
      if (pos != seed_text.size()) throw std::invalid_argument("trailing");
    } catch (...) {
      print_error("--seed: '" + seed_text + "' is not a non-negative integer");
      return false;
    }
  }
  Status st = p->validate();
  if (!st.is_ok()) {
    print_error(st.message());
    return false;
  }
  return true;
}

}  // namespace origami::cli
