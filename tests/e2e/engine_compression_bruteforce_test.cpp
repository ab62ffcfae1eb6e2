// Decode-time compression checked against a brute force at layer 0, at EVERY compression.
//
// Requests are streamed through the engine as forced tokens (as `origami eval retrieval --mode
// stream` does), under `zipage-attn` (window attention only: window w = 16, max pooling with
// kernel 5 at the first compression, no global score, no redundancy), block size 16 and budget
// 64 (N_max = 5: compress at 80 entries, keep 64), so each request goes through a dozen or more
// compressions. Layer 0's keys and queries depend only on a token's id and its logical position,
// not on what was evicted before, so the test recomputes them naively from the weights in double
// (embedding -> input RMSNorm -> q/k_proj -> q/k_norm -> RoPE at the logical position) and tracks
// itself, per KV head, which logical position every cache entry holds. Between engine steps it
// checks:
//   (a) every cache entry's layer-0 key, of every KV head, is the naive key of the logical
//       position the test expects there (after every step, so before every compression);
//   (q) before each compression, the query slot rows of the window hold the naive queries of the
//       window tokens at their logical positions;
//   (b) each compression keeps, per KV head, the brute-force top k of: mean over the last w
//       entries' queries of (max over the GQA group's query heads of softmax over the cached
//       keys, causal inside the window), max-pooled (kernel 5) at the first compression only,
//       window always kept, ties to the newer entry; in original order, as bit-exact copies.
//       Float vs double may swap entries whose scores are within a relative 1e-5 of each other,
//       nothing else; exact ties (max pooling copies a score onto its neighbours) must go to the
//       newer entry.
// The kept set then becomes the expected content the next steps are checked against.
// Two engine setups: zipage-attn as the engine default (query window 16), and the eval's setup
// (full-KV default engine, query window 32, 128 slots, per-request policy), with several
// requests at once whose compressions fall on different steps, one of them compressing right
// after a prompt longer than N_max blocks. A third run checks `zipage`'s default recipe in the
// eval's setup: the same score, then lambda * S - (1 - lambda) * R with R-KV's redundancy R of
// the keys (lightning within 256-entry spans), recomputed from the naive keys.
// A fourth test runs the baselines the same way, each against its own brute force in the eval's
// setup: `h2o` (window attention summed over compressions per logical position, recent half of
// the kept entries protected), `tova` (the newest query's attention), `keydiff` (-cos to the mean
// unit key, from the naive keys) and `rkv` (attention max-pooled with kernel 7 at every
// compression, then 0.1 * S - 0.9 * R with R-KV's all-pairs redundancy, tau 1).
// `kvllm` (Kara) runs through the same tracking with its own brute force: the window of the last
// W = 48 entries, buffer U = 8; A = column sums of the bidirectional softmax attention of the
// window's 48 naive queries over the region's 40 naive keys (a GQA group's heads averaged), then
// Token2Chunk written out plainly (test::naive_token2chunk; ratio 0.5: 20 kept, alpha = 6, gamma = 5); every entry
// before the window must stay where it is, bit-exact. Its compressions must fall on its period
// (every 8 steps), at most 2 requests per period.
// A fifth test turns prefill chunk compression on (`prefill_chunk_compression=1`, chunks of at most
// 24 tokens shared by the requests, so some are shorter than the window) for `zipage-attn`,
// `keydiff` and `snapkv` (budget 64, compressing whenever a chunk leaves more than 64 entries),
// with long prompts: the kept set after each chunk must be the brute-force top k over the entries
// the cache holds then, computed the same way; and `snapkv` with `chunk_score=keydiff`, whose
// compressions before the prompt's end must keep the pooled KeyDiff top k and whose compression at
// the prompt's end the pooled attention top k of the prompt's last window.
// Query slot rows are keyed by logical position: the query of position p is at row p % max_window.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "backend/cpu/cpu_backend.h"
#include "engine_test_util.h"
#include "model/config.h"
#include "model/weights.h"
#include "unit/backend_cpu_compression_naive.h"

namespace origami::testing {
namespace {

constexpr int kBlock = 16;
constexpr int kBudget = 64;  // N_max = 5: compress at 80 entries, keep 64
constexpr int kKeep = 64;
constexpr double kScoreRelTol = 1e-5;
constexpr double kKeyTol = 2e-4;
// kvllm's test options: W = 48 (3 blocks), U = 8, ratio 0.5 of the 40-entry region (20 kept),
// alpha = 6, gamma = 5 (two chunks of at most 3), every 8 steps, at most 2 requests per period.
constexpr int kKaraWindow = 48, kKaraBuffer = 8, kKaraKeep = 20, kKaraAlpha = 6, kKaraGamma = 5, kKaraPeriod = 8,
              kKaraPerStep = 2;
const std::map<std::string, std::string> kKaraOptions = {
    {"window", "48"}, {"buffer", "8"}, {"ratio", "0.5"}, {"chunk_budget", "6"},
    {"chunk_len", "5"}, {"delta", "8"},  {"n", "2"}};

// The score a policy's compressions must reproduce, written out for the brute force.
struct BruteRecipe {
  const char* policy = "zipage-attn";
  bool attention = true;   // window attention; false: KeyDiff (-cos to the mean unit key)
  int window = 16;         // the window's queries score (attention) and its entries are kept
  int pool_kernel = 5;     // max pooling, 0 = none
  bool pool_first_only = true;
  RedundancyMode redundancy = RedundancyMode::kNone;
  int span = 256;          // lightning span
  double lambda = 0.2, tau = 0.4, threshold = 0.5;
  bool accumulate = false;    // H2O: S is added to the entry's score from earlier compressions
  double recent_ratio = 0.0;  // the last floor(ratio * kKeep) entries are kept too
  bool kara = false;          // kvllm: Kara's window score and Token2Chunk, with kKaraOptions (no budget)
  // Prefill-end policies compressed chunk by chunk (chunk_score=keydiff): a compression before the
  // prompt's end is scored by KeyDiff (pooled as the policy pools), the prompt's end by attention.
  bool chunk_keydiff = false;

  int tail() const { return std::max(window, static_cast<int>(recent_ratio * kKeep)); }
};

BruteRecipe zipage_attn_recipe() { return BruteRecipe{}; }
// `zipage`'s default redundancy (R-KV): lightning within 256-entry spans (all 80 entries here),
// combined as lambda * S - (1 - lambda) * R.
BruteRecipe zipage_recipe() {
  BruteRecipe r;
  r.policy = "zipage";
  r.redundancy = RedundancyMode::kLightning;
  return r;
}
BruteRecipe h2o_recipe() {
  BruteRecipe r;
  r.policy = "h2o";
  r.pool_kernel = 0;
  r.accumulate = true;
  r.recent_ratio = 0.5;
  return r;
}
BruteRecipe tova_recipe() {
  BruteRecipe r;
  r.policy = "tova";
  r.window = 1;
  r.pool_kernel = 0;
  return r;
}
BruteRecipe keydiff_recipe() {
  BruteRecipe r;
  r.policy = "keydiff";
  r.attention = false;
  r.pool_kernel = 0;
  return r;
}
BruteRecipe rkv_recipe() {
  BruteRecipe r;
  r.policy = "rkv";
  r.window = 8;
  r.pool_kernel = 7;
  r.pool_first_only = false;
  r.redundancy = RedundancyMode::kFlash;
  r.lambda = 0.1;
  r.tau = 1.0;
  return r;
}
BruteRecipe snapkv_recipe() {
  BruteRecipe r;
  r.policy = "snapkv";
  r.window = 32;
  r.pool_kernel = 7;
  r.pool_first_only = false;  // pooling is part of SnapKV's score at every compression (chunked prompts)
  return r;
}
BruteRecipe snapkv_chunk_keydiff_recipe() {
  BruteRecipe r = snapkv_recipe();
  r.chunk_keydiff = true;
  return r;
}
BruteRecipe kvllm_recipe() {
  BruteRecipe r;
  r.policy = "kvllm";
  r.kara = true;
  r.window = kKaraWindow;
  r.pool_kernel = 0;
  return r;
}

// Layer 0's projections, recomputed naively in double.
class NaiveLayer0 {
 public:
  NaiveLayer0(const ModelConfig& c, const ModelWeights& w) : c_(c) {
    embed_ = w.embed_tokens.to_f32();
    norm_ = w.layers[0].input_norm.to_f32();
    wq_ = w.layers[0].q_proj.to_f32();
    wk_ = w.layers[0].k_proj.to_f32();
    if (!w.layers[0].q_norm.empty()) qn_ = w.layers[0].q_norm.to_f32();
    if (!w.layers[0].k_norm.empty()) kn_ = w.layers[0].k_norm.to_f32();
    if (!w.layers[0].q_bias.empty()) qb_ = w.layers[0].q_bias.to_f32();
    if (!w.layers[0].k_bias.empty()) kb_ = w.layers[0].k_bias.to_f32();
  }
  // [num_heads * head_dim]
  std::vector<double> query(int token, int position) const {
    return project(token, position, wq_, qb_, qn_, c_.num_heads);
  }
  // [num_kv_heads * head_dim]
  std::vector<double> key(int token, int position) const {
    return project(token, position, wk_, kb_, kn_, c_.num_kv_heads);
  }

 private:
  std::vector<double> project(int token, int position, const std::vector<float>& weight, const std::vector<float>& bias,
                              const std::vector<float>& head_norm, int heads) const {
    const int hidden = c_.hidden_size, d = c_.head_dim, half = d / 2;
    const float* e = embed_.data() + static_cast<size_t>(token) * hidden;
    double ss = 0;
    for (int i = 0; i < hidden; ++i) ss += static_cast<double>(e[i]) * e[i];
    const double inv = 1.0 / std::sqrt(ss / hidden + c_.rms_norm_eps);
    std::vector<double> h(hidden);
    for (int i = 0; i < hidden; ++i) h[i] = e[i] * inv * norm_[i];
    std::vector<double> out(static_cast<size_t>(heads) * d);
    for (size_t o = 0; o < out.size(); ++o) {
      double s = bias.empty() ? 0.0 : bias[o];
      for (int i = 0; i < hidden; ++i) s += weight[o * hidden + i] * h[i];
      out[o] = s;
    }
    for (int head = 0; head < heads; ++head) {
      double* x = &out[static_cast<size_t>(head) * d];
      if (!head_norm.empty()) {
        double hs = 0;
        for (int i = 0; i < d; ++i) hs += x[i] * x[i];
        const double hinv = 1.0 / std::sqrt(hs / d + c_.rms_norm_eps);
        for (int i = 0; i < d; ++i) x[i] = x[i] * hinv * head_norm[i];
      }
      for (int i = 0; i < half; ++i) {  // rotate_half RoPE at the logical position
        const double angle = position * std::pow(static_cast<double>(c_.rope.theta), -2.0 * i / d);
        const double a = x[i], b = x[i + half];
        x[i] = a * std::cos(angle) - b * std::sin(angle);
        x[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
    return out;
  }

  ModelConfig c_;
  std::vector<float> embed_, norm_, wq_, wk_, qn_, kn_, qb_, kb_;
};

// One streamed request and what the test expects its layer-0 cache to hold.
struct Tracked {
  RequestId id = 0;
  std::vector<int32_t> tokens;         // prompt + forced tokens: token at every logical position
  int prompt_length = 0;
  std::vector<std::vector<int>> pos;   // [kv head][entry] -> logical position
  int num_computed = 0;
  int num_compressions = 0;
  bool finished = false;
  // Snapshot taken before a step in which the request compresses.
  bool snapshot = false;
  bool snapshot_first = false;
  int snapshot_keep = 0;  // entries the compression keeps
  int snapshot_tail = 0;  // protected entries at the end (the window, or kvllm's buffer)
  std::vector<std::vector<std::vector<float>>> pre_keys;  // [head][entry][d], the engine's floats
  std::vector<std::vector<double>> bf_scores;             // [head][entry] brute-force score
  std::vector<std::vector<int>> bf_keep;                  // [head] brute-force kept entries, ascending
  std::vector<std::vector<double>> bf_global;             // [head][entry] accumulated score (H2O)
  std::vector<std::map<int, double>> accumulated;         // [head] logical position -> accumulated score
  // Lazily computed naive projections per logical position.
  std::map<int, std::vector<double>> naive_k, naive_q;
};

struct Stats {
  int compressions_checked = 0;
  int compressions_unchecked = 0;  // in a request's last step (its blocks are already freed)
  int entries_checked = 0;
  int swaps = 0;
  double max_swap_gap = 0.0;  // relative score gap of the worst accepted swap
  int differing_head_choices = 0;
  int heads = 0;
  int kara_windows = 0;
  int kara_full_periods = 0;  // periods that compressed the cap of n requests
  int prefill_compressions = 0;  // compressions that started before the prompt was prefilled
};

class BruteForce {
 public:
  BruteForce(Engine& engine, const NaiveLayer0& naive, const BruteRecipe& recipe)
      : engine_(engine),
        naive_(naive),
        kv_(dynamic_cast<CpuBackend&>(engine.backend()).kv_cache()),
        recipe_(recipe) {
    const ModelConfig& c = engine.model_config();
    heads_ = c.num_kv_heads;
    group_ = c.num_heads / c.num_kv_heads;
    d_ = c.head_dim;
    scale_ = 1.0 / std::sqrt(static_cast<double>(d_));
    max_window_ = engine.compression_support().max_window;
  }

  const std::vector<double>& key(Tracked& t, int p) {
    auto it = t.naive_k.find(p);
    if (it == t.naive_k.end()) it = t.naive_k.emplace(p, naive_.key(t.tokens[static_cast<size_t>(p)], p)).first;
    return it->second;
  }
  const std::vector<double>& query(Tracked& t, int p) {
    auto it = t.naive_q.find(p);
    if (it == t.naive_q.end()) it = t.naive_q.emplace(p, naive_.query(t.tokens[static_cast<size_t>(p)], p)).first;
    return it->second;
  }

  // (a), and before a compression (q) plus the brute-force selection. Called between steps.
  void before_step(Tracked& t, Stats* stats) {
    const Request* r = engine_.request(t.id);
    ASSERT_NE(r, nullptr);
    if (r->is_finished()) {
      t.finished = true;
      return;
    }
    const int n = r->kv.groups.empty() ? 0 : r->kv.num_entries(0);
    ASSERT_EQ(r->num_computed_tokens, t.num_computed) << "request " << t.id;
    ASSERT_EQ(r->compression.num_compressions, t.num_compressions) << "request " << t.id;
    for (int h = 0; h < heads_; ++h) ASSERT_EQ(static_cast<int>(t.pos[h].size()), n) << "request " << t.id;
    const std::vector<BlockId>* table = n > 0 ? &r->kv.groups[0].blocks : nullptr;
    // (a) every entry's key is the naive key of its expected logical position.
    for (int h = 0; h < heads_; ++h) {
      for (int e = 0; e < n; ++e) {
        const float* got = kv_.key_at(0, (*table)[static_cast<size_t>(e / kBlock)], h, e % kBlock);
        const int p = t.pos[h][static_cast<size_t>(e)];
        const double* want = key(t, p).data() + static_cast<size_t>(h) * d_;
        for (int i = 0; i < d_; ++i)
          ASSERT_NEAR(got[i], want[i], kKeyTol * std::max(1.0, std::abs(want[i])))
              << "request " << t.id << " after " << t.num_compressions << " compressions: layer 0 head " << h
              << " entry " << e << " should hold logical position " << p << " (element " << i << ")";
      }
    }
    stats->entries_checked += n * heads_;
    t.snapshot = false;
    if (!r->compression.pending) return;

    // A compression starts at the beginning of the next step.
    if (recipe_.kara) {
      ASSERT_GE(r->compression.query_slot, 0) << "request " << t.id << " compresses without a query slot";
      kara_before(t, *r, *table, n, stats);
      return;
    }
    const int w = recipe_.window;
    ASSERT_EQ(r->compression.num_keep, kKeep);
    // Cache-full triggers compress at N_max full blocks, a prefill-end one above the budget.
    ASSERT_GE(n, r->compression.trigger == CompressionTrigger::kPrefillEnd ? kKeep + 1 : kKeep + kBlock);
    stats->prefill_compressions += t.num_computed < t.prompt_length ? 1 : 0;
    // The window's entries are the newest tokens, the same in every head.
    for (int h = 0; h < heads_; ++h)
      for (int i = 0; i < w; ++i)
        ASSERT_EQ(t.pos[h][static_cast<size_t>(n - w + i)], t.num_computed - w + i);
    // (q) the captured window queries.
    if (recipe_.attention) {
      ASSERT_GE(r->compression.query_slot, 0) << "request " << t.id << " compresses without a query slot";
      ASSERT_EQ(r->compression.window, w);
    }
    const int slot = r->compression.query_slot;
    for (int i = 0; recipe_.attention && i < w; ++i) {
      check_query(t, slot, n - w + i, t.num_computed - w + i);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    // The brute force.
    t.snapshot = true;
    t.snapshot_first = t.num_compressions == 0;
    t.snapshot_keep = kKeep;
    t.snapshot_tail = recipe_.tail();
    t.pre_keys.assign(static_cast<size_t>(heads_), {});
    t.bf_scores.assign(static_cast<size_t>(heads_), {});
    t.bf_keep.assign(static_cast<size_t>(heads_), {});
    t.bf_global.assign(static_cast<size_t>(heads_), {});
    t.accumulated.resize(static_cast<size_t>(heads_));
    for (int h = 0; h < heads_; ++h) {
      for (int e = 0; e < n; ++e) {
        const float* k = kv_.key_at(0, (*table)[static_cast<size_t>(e / kBlock)], h, e % kBlock);
        t.pre_keys[h].emplace_back(k, k + d_);
      }
      std::vector<double> s(static_cast<size_t>(n), 0.0);
      // chunk_keydiff: a chunk before the prompt's end (its question) is scored without queries.
      const bool attention = recipe_.attention && !(recipe_.chunk_keydiff && t.num_computed < t.prompt_length);
      if (!attention) s = keydiff(t, h, n);
      for (int i = 0; attention && i < w; ++i) {
        const int visible = n - w + i + 1;
        const std::vector<double>& q = query(t, t.num_computed - w + i);
        std::vector<double> best(static_cast<size_t>(visible), 0.0);
        for (int j = 0; j < group_; ++j) {
          const double* qh = q.data() + static_cast<size_t>(h * group_ + j) * d_;
          std::vector<double> logit(static_cast<size_t>(visible));
          double m = -std::numeric_limits<double>::infinity();
          for (int e = 0; e < visible; ++e) {
            const double* k = key(t, t.pos[h][static_cast<size_t>(e)]).data() + static_cast<size_t>(h) * d_;
            double dot = 0;
            for (int x = 0; x < d_; ++x) dot += qh[x] * k[x];
            logit[e] = dot * scale_;
            m = std::max(m, logit[e]);
          }
          double z = 0;
          for (int e = 0; e < visible; ++e) z += std::exp(logit[e] - m);
          for (int e = 0; e < visible; ++e) best[e] = std::max(best[e], std::exp(logit[e] - m) / z);
        }
        for (int e = 0; e < visible; ++e) s[e] += best[e];
      }
      if (attention)
        for (double& v : s) v /= w;
      if (recipe_.accumulate) {  // H2O: + the score the entry's logical position accumulated so far
        const std::map<int, double>& acc = t.accumulated[h];
        for (int e = 0; e < n; ++e) {
          auto it = acc.find(t.pos[h][static_cast<size_t>(e)]);
          if (it != acc.end()) s[e] += it->second;
        }
        t.bf_global[h] = s;
      }
      const int kernel = recipe_.pool_kernel;
      if (kernel > 1 && (t.snapshot_first || !recipe_.pool_first_only)) {  // max pooling
        std::vector<double> pooled(s.size());
        for (int e = 0; e < n; ++e) {
          double m = s[e];
          for (int x = std::max(0, e - kernel / 2); x <= std::min(n - 1, e + kernel / 2); ++x) m = std::max(m, s[x]);
          pooled[e] = m;
        }
        s = pooled;
      }
      if (recipe_.redundancy != RedundancyMode::kNone) {
        const std::vector<double> r = redundancy(t, h, n);
        for (int e = 0; e < n; ++e) s[e] = recipe_.lambda * s[e] - (1.0 - recipe_.lambda) * r[e];
      }
      for (int e = n - recipe_.tail(); e < n; ++e) s[e] = std::numeric_limits<double>::infinity();
      std::vector<int> order(static_cast<size_t>(n));
      for (int e = 0; e < n; ++e) order[e] = e;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return s[a] != s[b] ? s[a] > s[b] : a > b; });
      std::vector<int> keep(order.begin(), order.begin() + kKeep);
      std::sort(keep.begin(), keep.end());
      t.bf_scores[h] = std::move(s);
      t.bf_keep[h] = std::move(keep);
    }
  }

  // (q) slot rows are keyed by logical position: window entry e (position p) is at row p % max_window.
  void check_query(Tracked& t, int slot, int e, int p) {
    const int q_size = group_ * heads_ * d_;
    const float* got = kv_.query_row(0, slot, p % max_window_);
    const std::vector<double>& want = query(t, p);
    for (int x = 0; x < q_size; ++x)
      ASSERT_NEAR(got[x], want[static_cast<size_t>(x)], kKeyTol * std::max(1.0, std::abs(want[static_cast<size_t>(x)])))
          << "request " << t.id << " compression " << t.num_compressions + 1 << ": query slot " << slot << " row "
          << p % max_window_ << " (window entry " << e << ") should hold the query of logical position " << p
          << " (element " << x << ")";
  }

  // kvllm's brute force before a compression: Kara's score and Token2Chunk over the trailing window.
  void kara_before(Tracked& t, const Request& r, const std::vector<BlockId>& table, int n, Stats* stats) {
    const int region = kKaraWindow - kKaraBuffer, start = n - kKaraWindow;
    ASSERT_EQ(r.compression.num_keep, n - region + kKaraKeep) << "request " << t.id;
    ASSERT_GE(n - r.compression.tail_from, kKaraWindow) << "request " << t.id << ": the trailing window is not uncompressed";
    ASSERT_EQ(steps_ % kKaraPeriod, 0) << "request " << t.id << " compresses off its period";
    ++due_per_step_[steps_];
    ASSERT_LE(due_per_step_[steps_], kKaraPerStep) << "more than n requests in one period";
    stats->kara_full_periods += due_per_step_[steps_] == kKaraPerStep ? 1 : 0;
    // The window: the newest entries, consecutive positions, the same in every head.
    for (int h = 0; h < heads_; ++h)
      for (int i = 0; i < kKaraWindow; ++i)
        ASSERT_EQ(t.pos[h][static_cast<size_t>(start + i)], t.num_computed - kKaraWindow + i);
    for (int i = 0; i < kKaraWindow; ++i) {
      check_query(t, r.compression.query_slot, start + i, t.num_computed - kKaraWindow + i);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    t.snapshot = true;
    t.snapshot_first = t.num_compressions == 0;
    t.snapshot_keep = n - region + kKaraKeep;
    t.snapshot_tail = kKaraBuffer;
    t.pre_keys.assign(static_cast<size_t>(heads_), {});
    t.bf_scores.assign(static_cast<size_t>(heads_), {});
    t.bf_keep.assign(static_cast<size_t>(heads_), {});
    for (int h = 0; h < heads_; ++h) {
      for (int e = 0; e < n; ++e) {
        const float* k = kv_.key_at(0, table[static_cast<size_t>(e / kBlock)], h, e % kBlock);
        t.pre_keys[h].emplace_back(k, k + d_);
      }
      // A[e] = sum over the window's queries (mean over the group's heads) of the softmax over the
      // region's keys: bidirectional, every query sees every region key.
      std::vector<double> a(static_cast<size_t>(region), 0.0);
      for (int i = 0; i < kKaraWindow; ++i) {
        const std::vector<double>& q = query(t, t.num_computed - kKaraWindow + i);
        for (int j = 0; j < group_; ++j) {
          const double* qh = q.data() + static_cast<size_t>(h * group_ + j) * d_;
          std::vector<double> logit(static_cast<size_t>(region));
          double m = -std::numeric_limits<double>::infinity();
          for (int e = 0; e < region; ++e) {
            const double* k = key(t, t.pos[h][static_cast<size_t>(start + e)]).data() + static_cast<size_t>(h) * d_;
            double dot = 0;
            for (int x = 0; x < d_; ++x) dot += qh[x] * k[x];
            logit[e] = dot * scale_;
            m = std::max(m, logit[e]);
          }
          double z = 0;
          for (int e = 0; e < region; ++e) z += std::exp(logit[e] - m);
          for (int e = 0; e < region; ++e) a[e] += std::exp(logit[e] - m) / z / group_;
        }
      }
      std::vector<double> s(static_cast<size_t>(n), std::numeric_limits<double>::infinity());
      for (int e = 0; e < region; ++e) s[static_cast<size_t>(start + e)] = a[e];
      std::vector<int> keep;
      for (int e = 0; e < start; ++e) keep.push_back(e);
      for (int e : test::naive_token2chunk(a, kKaraKeep, kKaraAlpha, kKaraGamma)) keep.push_back(start + e);
      for (int e = start + region; e < n; ++e) keep.push_back(e);
      t.bf_scores[h] = std::move(s);
      t.bf_keep[h] = std::move(keep);
    }
    ++stats->kara_windows;
  }

  // R-KV redundancy of head h's n entries, from the naive keys (the compression unit tests'
  // double-precision reference of the definition).
  std::vector<double> redundancy(Tracked& t, int h, int n) {
    std::vector<float> keys;
    keys.reserve(static_cast<size_t>(n) * d_);
    for (int e = 0; e < n; ++e) {
      const double* k = key(t, t.pos[h][static_cast<size_t>(e)]).data() + static_cast<size_t>(h) * d_;
      keys.insert(keys.end(), k, k + d_);
    }
    return test::naive_redundancy(keys, n, d_, recipe_.span, recipe_.redundancy, recipe_.tau, recipe_.threshold);
  }

  // KeyDiff of head h's n entries from the naive keys, in double: -cos(k_e, mean of the unit keys).
  std::vector<double> keydiff(Tracked& t, int h, int n) {
    std::vector<double> anchor(static_cast<size_t>(d_), 0.0), out(static_cast<size_t>(n));
    auto norm = [&](const double* v) {
      double ss = 0;
      for (int x = 0; x < d_; ++x) ss += v[x] * v[x];
      return std::sqrt(ss);
    };
    auto key_of = [&](int e) { return key(t, t.pos[h][static_cast<size_t>(e)]).data() + static_cast<size_t>(h) * d_; };
    for (int e = 0; e < n; ++e) {
      const double* k = key_of(e);
      const double kn = norm(k);
      for (int x = 0; x < d_; ++x) anchor[x] += k[x] / kn / n;
    }
    const double an = norm(anchor.data());
    for (int e = 0; e < n; ++e) {
      const double* k = key_of(e);
      double dot = 0;
      for (int x = 0; x < d_; ++x) dot += k[x] * anchor[x];
      out[e] = -dot / (norm(k) * an);
    }
    return out;
  }

  // (b) after a step: the kept set of a compression that ran in it, then the new entries.
  void after_step(Tracked& t, Stats* stats) {
    if (t.finished) return;
    const Request* r = engine_.request(t.id);
    ASSERT_NE(r, nullptr);
    if (r->compression.num_compressions != t.num_compressions) {
      ASSERT_EQ(r->compression.num_compressions, t.num_compressions + 1) << "request " << t.id;
      ASSERT_TRUE(t.snapshot) << "request " << t.id << " compressed without having been pending before the step";
      if (r->is_finished()) {  // its blocks are gone: nothing left to read (its last step)
        ++stats->compressions_unchecked;
        t.finished = true;
        return;
      }
      const std::vector<BlockId>& table = r->kv.groups[0].blocks;
      std::vector<int> first_choice;
      for (int h = 0; h < heads_; ++h) {
        const std::vector<std::vector<float>>& pre = t.pre_keys[h];
        // The engine's choice: kept entries are bit-exact copies of original ones, in order.
        std::vector<int> chosen;
        size_t next = 0;
        const int kept_count = t.snapshot_keep, tail = t.snapshot_tail;
        for (int i = 0; i < kept_count; ++i) {
          const float* k = kv_.key_at(0, table[static_cast<size_t>(i / kBlock)], h, i % kBlock);
          while (next < pre.size() && std::memcmp(pre[next].data(), k, d_ * sizeof(float)) != 0) ++next;
          ASSERT_LT(next, pre.size()) << "request " << t.id << " compression " << t.num_compressions + 1 << " head " << h
                                      << ": kept entry " << i << " is not an original key in order";
          chosen.push_back(static_cast<int>(next++));
        }
        if (first_choice.empty()) first_choice = chosen;
        stats->differing_head_choices += chosen != first_choice;
        // Compare with the brute force, allowing swaps only between near-equal scores.
        const std::vector<double>& s = t.bf_scores[h];
        const std::vector<int>& want = t.bf_keep[h];
        std::vector<int> extra, missing;  // chosen but not brute-force, and the reverse
        std::set_difference(chosen.begin(), chosen.end(), want.begin(), want.end(), std::back_inserter(extra));
        std::set_difference(want.begin(), want.end(), chosen.begin(), chosen.end(), std::back_inserter(missing));
        ASSERT_EQ(extra.size(), missing.size());
        auto describe = [&](const std::vector<int>& v) {
          std::ostringstream out;
          for (int e : v) out << " " << e << "(pos " << t.pos[h][static_cast<size_t>(e)] << ", score " << s[e] << ")";
          return out.str();
        };
        for (int x : extra) {
          for (int y : missing) {
            // Exactly equal brute-force scores are true ties (max pooling copies one score onto
            // its neighbours, identically in float): the newer entry must win, no slack.
            const bool finite = std::isfinite(s[x]) && std::isfinite(s[y]) && s[x] != s[y];
            const double gap = finite ? (s[y] - s[x]) / std::max(std::abs(s[y]), 1e-30) : 1e30;
            EXPECT_LE(gap, kScoreRelTol)
                << "request " << t.id << " compression " << t.num_compressions + 1 << " (first: " << t.snapshot_first
                << ") layer 0 head " << h << ": the engine kept" << describe(extra) << " instead of" << describe(missing);
            if (gap > kScoreRelTol) return;
            stats->max_swap_gap = std::max(stats->max_swap_gap, gap);
          }
        }
        stats->swaps += static_cast<int>(extra.size());
        for (int i = 0; i < tail; ++i)
          ASSERT_EQ(chosen[static_cast<size_t>(kept_count - tail + i)], static_cast<int>(pre.size()) - tail + i);
        // kvllm: entries before the window never move.
        if (recipe_.kara) {
          for (int e = 0; e < static_cast<int>(pre.size()) - kKaraWindow; ++e) {
            ASSERT_EQ(chosen[static_cast<size_t>(e)], e);
          }
        }
        // The engine's (validated) choice is what the cache holds from now on, with its
        // accumulated scores (H2O).
        std::vector<int> kept_pos;
        for (int e : chosen) kept_pos.push_back(t.pos[h][static_cast<size_t>(e)]);
        if (recipe_.accumulate) {
          t.accumulated[h].clear();
          for (int e : chosen) t.accumulated[h][t.pos[h][static_cast<size_t>(e)]] = t.bf_global[h][static_cast<size_t>(e)];
        }
        t.pos[h] = std::move(kept_pos);
      }
      ++t.num_compressions;
      ++stats->compressions_checked;
    }
    t.snapshot = false;
    if (r->is_finished()) {
      t.finished = true;
      return;
    }
    for (int p = t.num_computed; p < r->num_computed_tokens; ++p)
      for (int h = 0; h < heads_; ++h) t.pos[h].push_back(p);
    t.num_computed = r->num_computed_tokens;
  }

  int heads() const { return heads_; }
  void step_done() { ++steps_; }

 private:
  Engine& engine_;
  const NaiveLayer0& naive_;
  cpu::CpuKVCache& kv_;
  const BruteRecipe recipe_;
  std::map<long long, int> due_per_step_;  // kvllm compressions by scheduler step
  long long steps_ = 0;                     // engine steps so far (each computes tokens here)
  int heads_ = 0, group_ = 0, d_ = 0, max_window_ = 0;
  double scale_ = 0.0;
};

// The retrieval fixture's text (what stream mode feeds), tokenized.
std::vector<int32_t> document_tokens(const Tokenizer& tokenizer, int line, size_t count) {
  std::ifstream in(shared_dir() + "/data/retrieval_dev.jsonl");
  EXPECT_TRUE(in.good()) << "cannot open the retrieval fixture";
  std::string text;
  for (int i = 0; i <= line && std::getline(in, text); ++i) {
  }
  std::vector<int32_t> ids = tokenizer.encode(nlohmann::json::parse(text)["prompt"].get<std::string>(), false);
  EXPECT_GE(ids.size(), count);
  ids.resize(std::min(ids.size(), count));
  return ids;
}

struct EngineSetup {
  const char* name;
  bool policy_per_request;  // the eval's setup: full-KV default engine, policy per request
  BruteRecipe recipe = zipage_attn_recipe();  // the policy and the score it must reproduce
  int chunk = 0;  // > 0: prefill chunk compression, at most `chunk` tokens a step
};

void run_setup(const EngineSetup& setup, const std::vector<int>& prompt_lengths, int num_tokens, Stats* stats) {
  EngineConfig c = cpu_config(tiny_qwen3_dir());
  if (setup.policy_per_request) {
    c.kv_policy = "full";
    c.max_num_seqs = 128;
    c.num_query_slots = 128;
    c.query_window = setup.recipe.kara ? kKaraWindow : 32;
  } else {
    c.kv_policy = setup.recipe.policy;
    if (setup.recipe.kara) {
      c.kv_policy_options = kKaraOptions;
    } else {
      c.kv_budget = kBudget;
    }
  }
  PolicyOptionMap chunk_options;
  if (setup.chunk > 0) {
    c.max_num_batched_tokens = setup.chunk;
    chunk_options = {{"prefill_chunk_compression", "1"}};
    if (setup.recipe.chunk_keydiff) chunk_options["chunk_score"] = "keydiff";
    if (!setup.policy_per_request) c.kv_policy_options = chunk_options;
  }
  auto engine = make_engine(c);
  ASSERT_NE(engine, nullptr);
  auto config = load_model_config(tiny_qwen3_dir());
  ASSERT_TRUE(config.has_value());
  auto weights = load_model_weights(tiny_qwen3_dir(), *config);
  ASSERT_TRUE(weights.has_value());
  ASSERT_EQ(config->rope.type, "default");
  const NaiveLayer0 naive(*config, *weights);
  BruteForce bf(*engine, naive, setup.recipe);
  stats->heads = bf.heads();

  std::vector<Tracked> tracked(prompt_lengths.size());
  for (size_t i = 0; i < prompt_lengths.size(); ++i) {
    Tracked& t = tracked[i];
    t.prompt_length = prompt_lengths[i];
    t.tokens = document_tokens(*engine->tokenizer(), static_cast<int>(i), static_cast<size_t>(num_tokens));
    ASSERT_FALSE(::testing::Test::HasFailure());
    const std::vector<int32_t> prompt(t.tokens.begin(), t.tokens.begin() + prompt_lengths[i]);
    RequestOptions opts;
    if (setup.policy_per_request) {
      opts.kv_policy = setup.recipe.policy;
      if (setup.recipe.kara) {
        opts.kv_policy_options = kKaraOptions;
      } else {
        opts.kv_budget = kBudget;
        opts.kv_policy_options = chunk_options;
      }
    }
    opts.forced_output_tokens.assign(t.tokens.begin() + prompt_lengths[i], t.tokens.end());
    auto id = engine->add_request(prompt, greedy(static_cast<int>(opts.forced_output_tokens.size())), opts);
    ASSERT_TRUE(id.has_value()) << id.status().to_string();
    t.id = *id;
    t.pos.assign(static_cast<size_t>(bf.heads()), {});
  }
  const int before = stats->compressions_checked + stats->compressions_unchecked;
  while (engine->has_unfinished()) {
    for (Tracked& t : tracked) {
      bf.before_step(t, stats);
      ASSERT_FALSE(::testing::Test::HasFatalFailure());
    }
    for (const RequestOutput& out : engine->step()) ASSERT_NE(out.finish_reason, FinishReason::kError) << out.error;
    bf.step_done();
    for (Tracked& t : tracked) {
      bf.after_step(t, stats);
      ASSERT_FALSE(::testing::Test::HasFailure()) << setup.name;
    }
  }
  for (const Tracked& t : tracked) {
    EXPECT_TRUE(t.finished);
    EXPECT_EQ(engine->request(t.id)->output_token_ids.size(), t.tokens.size() - static_cast<size_t>(t.prompt_length));
    // Every compression of the request was checked (one per 16 tokens after the first; kvllm:
    // one per window of fresh W - U tokens at most, fewer when periods are missed or capped).
    // Prefill-end (snapkv) compresses prompts only; with chunk compression, one per chunk after
    // the first 64 entries at least every other step.
    const bool prefill_end = std::string(setup.recipe.policy) == "snapkv";
    const int want_compressions = setup.recipe.kara ? 2
                                  : prefill_end    ? (t.prompt_length > kKeep ? 1 : 0)
                                                   : (num_tokens - 80) / kBlock;
    if (setup.chunk == 0) {
      EXPECT_GE(t.num_compressions, want_compressions) << setup.name << " request " << t.id;
    }
  }
  EXPECT_EQ(engine->metrics().num_preemptions, 0);
  EXPECT_EQ(engine->metrics().num_compressions, stats->compressions_checked + stats->compressions_unchecked - before)
      << setup.name;
}

// Runs every setup and checks that enough compressions were checked and that heads differ.
void run_setups(const std::vector<EngineSetup>& setups) {
  // Prompt lengths: 1 (stream mode: the whole text is forced), 7 and 12 (compressions on other
  // steps), 100 (compressed right after its prefill, then while decoding).
  const std::vector<int> prompt_lengths = {1, 7, 12, 100};
  const int num_tokens = 300;
  for (const EngineSetup& setup : setups) {
    Stats stats;
    run_setup(setup, prompt_lengths, num_tokens, &stats);
    ASSERT_FALSE(::testing::Test::HasFailure()) << setup.name;
    std::printf("[%s] %d compressions checked at layer 0 (x %d KV heads; %d more in a request's last step, "
                "unreadable), %d cache entries checked, %d fp swaps (worst relative score gap %.2e), %d head choices "
                "differing from head 0's\n",
                setup.name, stats.compressions_checked, stats.heads, stats.compressions_unchecked, stats.entries_checked,
                stats.swaps, stats.max_swap_gap, stats.differing_head_choices);
    EXPECT_GE(stats.compressions_checked, 4 * 12) << setup.name;
    EXPECT_GT(stats.differing_head_choices, 0)
        << setup.name << ": token-wise eviction per head: heads should keep different entries";
  }
}

TEST(EngineCompressionBruteForce, ZipageKeepsTheBruteForceTopKAtEveryDecodeCompression) {
  run_setups({EngineSetup{"zipage-attn engine default", false}, EngineSetup{"eval setup (per-request policy)", true},
              EngineSetup{"zipage (default recipe: redundancy), eval setup", true, zipage_recipe()}});
}

// The baselines with their default options, each against its own brute force.
TEST(EngineCompressionBruteForce, BaselinesKeepTheBruteForceTopKAtEveryDecodeCompression) {
  run_setups({EngineSetup{"h2o (accumulated attention + recent half), eval setup", true, h2o_recipe()},
              EngineSetup{"tova (newest query's attention), eval setup", true, tova_recipe()},
              EngineSetup{"keydiff (-cos to the mean key), eval setup", true, keydiff_recipe()},
              EngineSetup{"rkv (pooled attention - flash redundancy), eval setup", true, rkv_recipe()}});
}

TEST(EngineCompressionBruteForce, KvllmKeepsKarasWindowSelectionAtEveryCompression) {
  // Four requests (prompts 1, 7, 12, 100), so that periods find several due and the cap of 2
  // per period applies; one engine with kvllm as its default, one with it per request.
  const std::vector<int> prompt_lengths = {1, 7, 12, 100};
  const int num_tokens = 300;
  for (const EngineSetup& setup : {EngineSetup{"kvllm engine default", false, kvllm_recipe()},
                                   EngineSetup{"kvllm per request", true, kvllm_recipe()}}) {
    Stats stats;
    run_setup(setup, prompt_lengths, num_tokens, &stats);
    ASSERT_FALSE(HasFailure()) << setup.name;
    std::printf("[%s] %d windows compressed and checked at layer 0 (x %d KV heads; %d unreadable), %d fp swaps "
                "(worst relative score gap %.2e), %d head choices differing from head 0's\n",
                setup.name, stats.compressions_checked, stats.heads, stats.compressions_unchecked, stats.swaps,
                stats.max_swap_gap, stats.differing_head_choices);
    EXPECT_GE(stats.compressions_checked, 4 * 3);
    EXPECT_GT(stats.kara_full_periods, 0) << "no period reached the cap of n requests";
    EXPECT_GT(stats.differing_head_choices, 0) << "token-wise eviction per head: heads should keep different entries";
  }
}

TEST(EngineCompressionBruteForce, PrefillChunkCompressionKeepsTheBruteForceTopKAfterEveryChunk) {
  // Three long prompts whose chunks share a step budget of 24 tokens (so chunks differ in length,
  // some shorter than the window), and a short one; a few decode steps after.
  const std::vector<int> prompt_lengths = {7, 150, 190, 230};
  const int num_tokens = 250;
  for (const EngineSetup& setup :
       {EngineSetup{"zipage-attn, prefill chunk compression, engine default", false, zipage_attn_recipe(), 24},
        EngineSetup{"keydiff, prefill chunk compression, eval setup", true, keydiff_recipe(), 24},
        EngineSetup{"snapkv, prefill chunk compression, eval setup", true, snapkv_recipe(), 24},
        EngineSetup{"snapkv, prefill chunk compression, chunks scored by keydiff, eval setup", true,
                    snapkv_chunk_keydiff_recipe(), 24}}) {
    Stats stats;
    run_setup(setup, prompt_lengths, num_tokens, &stats);
    ASSERT_FALSE(HasFailure()) << setup.name;
    std::printf("[%s] %d compressions checked at layer 0 (%d before the prompt's end; x %d KV heads; %d unreadable), "
                "%d fp swaps (worst relative score gap %.2e), %d head choices differing from head 0's\n",
                setup.name, stats.compressions_checked, stats.prefill_compressions, stats.heads,
                stats.compressions_unchecked, stats.swaps, stats.max_swap_gap, stats.differing_head_choices);
    // Chunks ending above the threshold compress the three long prompts several times each.
    EXPECT_GE(stats.prefill_compressions, 3 * 3) << setup.name;
    EXPECT_GT(stats.differing_head_choices, 0) << setup.name;
  }
}

}  // namespace
}  // namespace origami::testing
