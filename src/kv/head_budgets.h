#pragma once
// TANGRAM's calibrated per-head KV budgets (budget reservation, paper §4.1): for every
// (layer, KV head) a ratio B[l][h] in (0, 1], the share of a document's N tokens that head keeps
// (ceil(B * N) entries). `origami calibrate` measures them offline with a non-uniform method
// (AdaKV-style top-k over all heads of a layer) on sample documents:
// B = min(1, mean + alpha * std) of each head's kept fraction. The ratios then fix, before a
// request runs, how many pages each head (group) needs (kv/head_grouping.h) and how decode
// attention's CTAs are split (kv/split_map.h).
//
// The file is JSON (docs/policies.md, "Calibration and head budgets"):
//   {"format": "origami-head-budgets", "version": 1,
//    "model": {"model_type", "num_layers", "num_kv_heads", "num_attention_heads", "head_dim",
//              "hidden_size", "vocab_size"},
//    "calibration": {"scorer", "alpha", "rho", "samples", "sample_tokens": [N per sample]},
//    "ratios": [[B per head] per layer], "mean": [[...]], "std": [[...]]}
// Loading checks the format, the version, every field's presence and type, the shapes, every
// ratio in (0, 1] (NaN included, which JSON writes as null) and, given the model, that the file
// was calibrated for it; every error names the file and the field.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace origami {

inline constexpr const char* kHeadBudgetsFormat = "origami-head-budgets";
inline constexpr int kHeadBudgetsVersion = 1;
// Files larger than this are refused unread: a budget file of 128 layers x 64 heads is ~0.5 MB.
inline constexpr size_t kMaxHeadBudgetsFileBytes = size_t{16} << 20;

// What identifies the model a budget file belongs to: its KV shape and a fingerprint of its
// config (the kv module does not see ModelConfig; engine/head_budget_loader.h builds this).
struct ModelIdentity {
  std::string model_type;  // config.json's model_type ("qwen3", "llama", ...)
  int num_layers = 0;
  int num_kv_heads = 0;
  int num_attention_heads = 0;
  int head_dim = 0;
  int hidden_size = 0;
  int vocab_size = 0;
};

// Entries a head of budget ratio `ratio` keeps of `num_tokens`: ceil(ratio * N), computed as
// ceil(ratio * N - 1e-9) so that a product such as 0.3 * 10 that rounds above an integer does
// not add a token, clamped to [1, N] (0 when N <= 0).
int ratio_token_budget(double ratio, int num_tokens);

struct HeadBudgets {
  int version = kHeadBudgetsVersion;
  ModelIdentity model;
  // How they were calibrated.
  std::string scorer;  // the policy whose scores ranked the tokens: "snapkv", "keydiff", "knorm"
  double alpha = 2.0;  // safety margin: B = min(1, mean + alpha * std)
  double rho = 0.25;   // target global retention of the calibration's per-layer top-k
  int samples = 0;     // documents measured
  std::vector<int> sample_tokens;  // each sample's length N, in order (samples entries)
  // [layer][KV head]
  std::vector<std::vector<double>> ratios;  // B, in (0, 1]
  std::vector<std::vector<double>> mean;    // mean kept fraction over the samples, in (0, 1]
  std::vector<std::vector<double>> stddev;  // its standard deviation over the samples, >= 0

  int num_layers() const { return static_cast<int>(ratios.size()); }
  int num_kv_heads() const { return ratios.empty() ? 0 : static_cast<int>(ratios[0].size()); }
  double ratio(int layer, int head) const { return ratios[layer][head]; }
  // The mean of B over every (layer, head): the share of full KV the budgets keep.
  double mean_ratio() const;

  // Entries (layer, head) keeps of a document of `num_tokens` tokens: ceil(B * N)
  // (ratio_token_budget).
  int head_token_budget(int layer, int head, int num_tokens) const {
    return ratio_token_budget(ratios[layer][head], num_tokens);
  }
  // head_token_budget() of every (layer, head): [layer][head].
  std::vector<std::vector<int>> token_budgets(int num_tokens) const;

  // Budgets for a request that asks for an average of `avg_tokens` entries per head over a
  // document of `num_tokens` tokens: in every layer the ratios are scaled by one factor s_l so
  // that the heads' budgets min(N, max(1, s_l * B * N)) sum to H * min(avg_tokens, N) (capped
  // heads keep everything and the rest is spread over the others in proportion to B), then
  // rounded to integers by largest remainder (ties to the lower head index), so each layer's
  // budgets sum to exactly H * min(avg_tokens, N), each in [1, N], ordered as the ratios are.
  // avg_tokens must be >= 1 and num_tokens >= 1.
  std::vector<std::vector<int>> scaled_token_budgets(int avg_tokens, int num_tokens) const;
};

// Internal consistency: a supported version, a model identity with positive sizes, ratios / mean
// / std of model.num_layers x model.num_kv_heads, every ratio in (0, 1], mean in [0, 1], std >= 0
// and finite, alpha >= 0, rho in (0, 1], samples >= 1 and sample_tokens of that length with each
// N >= 1. Errors name the field ("ratios[2][1] = nan is not in (0, 1]").
Status validate_head_budgets(const HeadBudgets& budgets);

// The file must belong to `model`: every field of ModelIdentity must match; the error names the
// field and both values.
Status check_head_budgets_model(const HeadBudgets& budgets, const ModelIdentity& model);

// JSON text (2-space indent, trailing newline). `budgets` must be valid (validate_head_budgets).
std::string head_budgets_to_json(const HeadBudgets& budgets);
// Parses and validates JSON text; `source` names the file in errors, which never quote the text.
Expected<HeadBudgets> parse_head_budgets(const std::string& json_text, const std::string& source);
// Validates an already parsed object (a request's inline "kv_head_budgets", checked as a file).
// Errors name `source` and the field, and never quote the object's strings.
Expected<HeadBudgets> parse_head_budgets_json(const nlohmann::json& j, const std::string& source);
// Reads (a regular file of at most kMaxHeadBudgetsFileBytes, opened without blocking: never a
// FIFO or device), parses and validates `path`; with `model`, also checks that it belongs to
// that model.
Expected<HeadBudgets> load_head_budgets(const std::string& path, const ModelIdentity* model = nullptr);
// Validates, then writes `path` (through a temporary file renamed over it, so a failed write
// never leaves half a file).
Status save_head_budgets(const HeadBudgets& budgets, const std::string& path);

}  // namespace origami
