// Policy registry and options: every built-in is listed and builds with its documented
// defaults; aliases only change defaults; unknown names and options, and bad values, are errors
// that name the policy, the option and what it accepts.
#include "policy/policy_registry.h"

#include <gtest/gtest.h>

namespace origami {
namespace {

const PolicyRegistry& reg() { return PolicyRegistry::builtin(); }

std::shared_ptr<const KVPolicy> make(const std::string& name, const PolicyOptionMap& opts = {}) {
  auto p = reg().create(name, opts);
  EXPECT_TRUE(p.has_value()) << p.status().to_string();
  return p ? *p : nullptr;
}

std::string error_of(const std::string& name, const PolicyOptionMap& opts) {
  auto p = reg().create(name, opts);
  EXPECT_FALSE(p.has_value()) << name;
  return p ? "" : p.status().message();
}

TEST(PolicyRegistry, ListsBuiltinsInOrder) {
  EXPECT_EQ(reg().names(),
            "full, streaming, snapkv, zipage, zipage-attn, zipage-global, zipage-flash, zipage-lightning, knorm, "
            "h2o, tova, keydiff, rkv, pagedeviction, kvllm, fastkvzip, kvzip, tangram, adakv");
  for (const PolicyInfo& info : reg().policies()) {
    EXPECT_FALSE(info.summary.empty()) << info.name;
    for (const PolicyOptionSpec& s : info.options) EXPECT_FALSE(s.help.empty()) << info.name << "." << s.name;
    EXPECT_NE(make(info.name), nullptr) << info.name;
  }
}

TEST(PolicyRegistry, UnknownPolicyListsRegisteredOnes) {
  const std::string e = error_of("no-such-policy", {});
  EXPECT_NE(e.find("'no-such-policy'"), std::string::npos) << e;
  EXPECT_NE(e.find("full, streaming, snapkv, zipage"), std::string::npos) << e;
}

TEST(PolicyRegistry, FullNeverCompresses) {
  auto p = make("full");
  EXPECT_FALSE(p->compresses());
  EXPECT_FALSE(p->needs().window_queries);
  EXPECT_TRUE(p->check_budget(0, 16).is_ok());
  EXPECT_NE(error_of("full", {{"window", "4"}}).find("takes no options"), std::string::npos);
}

// The paper's recommended setting, as the recipe fields it maps to.
void expect_paper_recipe(const ScoreRecipe& r) {
  EXPECT_EQ(r.scorer, Scorer::kAttention);
  EXPECT_EQ(r.window, 16);
  EXPECT_EQ(r.recent, 0);
  EXPECT_FLOAT_EQ(r.global_decay, 0.8f);
  EXPECT_EQ(r.redundancy, RedundancyMode::kLightning);
  EXPECT_EQ(r.redundancy_span, 0);  // one block
  EXPECT_EQ(r.lightning_span(16), 16);
  EXPECT_FLOAT_EQ(r.redundancy_lambda, 0.2f);
  EXPECT_FLOAT_EQ(r.redundancy_tau, 0.4f);
  EXPECT_FLOAT_EQ(r.redundancy_threshold, 0.5f);
  EXPECT_EQ(r.pool_kernel, 5);
  EXPECT_TRUE(r.pool_first_only);
  EXPECT_EQ(r.pool_type, PoolType::kMax);
  EXPECT_EQ(r.num_sinks, 0);
}

TEST(PolicyRegistry, ZipageLightningIsThePaperSetting) {
  auto p = make("zipage-lightning");
  EXPECT_EQ(p->trigger(), CompressionTrigger::kCacheFull);
  expect_paper_recipe(p->score_recipe());
  const PolicyNeeds n = p->needs();
  EXPECT_TRUE(n.window_queries);
  EXPECT_EQ(n.window, 16);
  EXPECT_TRUE(n.global_scores);
  EXPECT_EQ(p->default_budget(), 2048);
}

TEST(PolicyRegistry, ZipageDefaultsDifferFromThePaperInSpanAndGlobalOnly) {
  auto p = make("zipage");
  EXPECT_EQ(p->trigger(), CompressionTrigger::kCacheFull);
  ScoreRecipe r = p->score_recipe();
  EXPECT_FLOAT_EQ(r.global_decay, 0.0f);
  EXPECT_EQ(r.redundancy_span, 256);
  EXPECT_EQ(r.lightning_span(16), 256);
  EXPECT_FALSE(p->needs().global_scores);
  // Put the two back and the rest is the paper's.
  r.global_decay = 0.8f;
  r.redundancy_span = 0;
  expect_paper_recipe(r);
  // And the options say so.
  auto paper = make("zipage", {{"global", "1"}, {"span", "0"}});
  expect_paper_recipe(paper->score_recipe());
  EXPECT_TRUE(paper->needs().global_scores);
}

TEST(PolicyRegistry, ZipageAliasesChangeOnlyDefaults) {
  auto attn = make("zipage-attn");
  EXPECT_EQ(attn->name(), "zipage-attn");
  EXPECT_FLOAT_EQ(attn->score_recipe().global_decay, 0.0f);
  EXPECT_EQ(attn->score_recipe().redundancy, RedundancyMode::kNone);
  EXPECT_FALSE(attn->needs().global_scores);
  auto global = make("zipage-global");
  EXPECT_FLOAT_EQ(global->score_recipe().global_decay, 0.8f);
  EXPECT_EQ(global->score_recipe().redundancy, RedundancyMode::kNone);
  EXPECT_EQ(make("zipage-flash")->score_recipe().redundancy, RedundancyMode::kFlash);
  EXPECT_EQ(make("zipage-lightning")->score_recipe().redundancy, RedundancyMode::kLightning);
  // Options still override an alias's defaults.
  auto custom = make("zipage-attn", {{"redundancy", "flash"}, {"window", "8"}, {"pool", "off"}});
  EXPECT_EQ(custom->score_recipe().redundancy, RedundancyMode::kFlash);
  EXPECT_EQ(custom->score_recipe().window, 8);
  EXPECT_EQ(custom->score_recipe().pool_kernel, 0);
  EXPECT_EQ(custom->options().get("window"), "8");
}

TEST(PolicyRegistry, StreamingAndSnapKVDefaults) {
  auto s = make("streaming");
  EXPECT_EQ(s->trigger(), CompressionTrigger::kCacheFull);
  EXPECT_EQ(s->score_recipe().scorer, Scorer::kRecency);
  EXPECT_EQ(s->score_recipe().num_sinks, 4);
  EXPECT_FALSE(s->needs().window_queries);
  auto k = make("snapkv");
  EXPECT_EQ(k->trigger(), CompressionTrigger::kPrefillEnd);
  EXPECT_EQ(k->score_recipe().window, 32);
  EXPECT_EQ(k->score_recipe().pool_kernel, 7);
  EXPECT_TRUE(k->needs().window_queries);
  EXPECT_FALSE(k->needs().global_scores);
}

// TANGRAM runs SnapKV's score (window 32, max pooling 7) unchanged; only the budget split
// (calibrated per-head budgets) and the prefill chunk compression default differ.
TEST(PolicyRegistry, TangramIsSnapKVUnderCalibratedBudgets) {
  auto t = make("tangram");
  auto s = make("snapkv");
  EXPECT_EQ(t->trigger(), CompressionTrigger::kPrefillEnd);
  EXPECT_EQ(t->budget_split(), BudgetSplit::kCalibrated);
  EXPECT_EQ(s->budget_split(), BudgetSplit::kUniform);
  const ScoreRecipe& a = t->score_recipe();
  const ScoreRecipe& b = s->score_recipe();
  EXPECT_EQ(a.scorer, b.scorer);
  EXPECT_EQ(a.window, 32);
  EXPECT_EQ(a.window, b.window);
  EXPECT_EQ(a.pool_kernel, 7);
  EXPECT_EQ(a.pool_kernel, b.pool_kernel);
  EXPECT_EQ(a.pool_type, b.pool_type);
  EXPECT_EQ(a.pool_first_only, b.pool_first_only);
  EXPECT_EQ(a.num_sinks, b.num_sinks);
  EXPECT_TRUE(t->options().get_bool(kPrefillChunkCompressionOption));
  EXPECT_NE(error_of("tangram", {{"kernel", "4"}}).find("policy tangram"), std::string::npos);
}

// AdaKV runs SnapKV's score with the budget allocated per layer at run time; Fast KVzip and KVzip
// take the allocation as an option (uniform by default).
TEST(PolicyRegistry, AdaKVIsSnapKVWithALayerAllocation) {
  auto a = make("adakv");
  auto s = make("snapkv");
  EXPECT_EQ(a->trigger(), CompressionTrigger::kPrefillEnd);
  EXPECT_EQ(a->budget_split(), BudgetSplit::kUniform);
  EXPECT_EQ(a->score_recipe().allocation, KeepAllocation::kLayer);
  EXPECT_FLOAT_EQ(a->score_recipe().alpha_safe, 0.2f);
  EXPECT_EQ(a->score_recipe().window, s->score_recipe().window);
  EXPECT_EQ(a->score_recipe().pool_kernel, s->score_recipe().pool_kernel);
  EXPECT_TRUE(a->needs().joint_selection);
  EXPECT_FALSE(s->needs().joint_selection);
  EXPECT_FALSE(a->options().get_bool(kPrefillChunkCompressionOption));
  EXPECT_FLOAT_EQ(make("adakv", {{"alpha_safe", "0.5"}})->score_recipe().alpha_safe, 0.5f);
  EXPECT_NE(error_of("adakv", {{"alpha_safe", "1.5"}}).find("alpha_safe"), std::string::npos);
  // Fast KVzip's default is the paper's one global threshold, in whole pages (per-head pages by
  // default in the engine); kvzip keeps uniform budgets unless asked.
  EXPECT_EQ(make("fastkvzip")->score_recipe().allocation, KeepAllocation::kGlobal);
  EXPECT_TRUE(make("fastkvzip")->score_recipe().page_aligned);
  EXPECT_TRUE(make("fastkvzip")->prefers_per_head_pages());
  EXPECT_EQ(make("fastkvzip", {{"allocation", "uniform"}})->score_recipe().allocation, KeepAllocation::kUniform);
  EXPECT_FALSE(make("fastkvzip", {{"allocation", "uniform"}})->prefers_per_head_pages());
  EXPECT_FALSE(make("fastkvzip", {{"page_aligned", "0"}})->prefers_per_head_pages());
  EXPECT_FALSE(make("kvzip")->prefers_per_head_pages());
  EXPECT_FALSE(make("adakv")->prefers_per_head_pages());
  EXPECT_TRUE(make("adakv", {{"page_aligned", "1"}})->prefers_per_head_pages());
  EXPECT_EQ(make("kvzip")->score_recipe().allocation, KeepAllocation::kUniform);
  for (const char* name : {"fastkvzip", "kvzip"}) {
    EXPECT_EQ(make(name, {{"allocation", "global"}})->score_recipe().allocation, KeepAllocation::kGlobal) << name;
    EXPECT_EQ(make(name, {{"allocation", "layer"}})->score_recipe().allocation, KeepAllocation::kLayer) << name;
    EXPECT_NE(error_of(name, {{"allocation", "heads"}}).find("allocation"), std::string::npos) << name;
  }
  // Page-aligned counts: off by default, an option of every policy with a runtime allocation.
  for (const char* name : {"adakv", "kvzip"}) {
    EXPECT_FALSE(make(name)->score_recipe().page_aligned) << name;
    EXPECT_TRUE(make(name, {{"page_aligned", "1"}})->score_recipe().page_aligned) << name;
  }
}

TEST(PolicyRegistry, OptionErrorsNameOptionAndAcceptedValues) {
  std::string e = error_of("zipage", {{"windw", "16"}});
  EXPECT_NE(e.find("policy zipage"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown option 'windw'"), std::string::npos) << e;
  EXPECT_NE(e.find("window"), std::string::npos) << e;
  e = error_of("zipage", {{"window", "abc"}});
  EXPECT_NE(e.find("window=abc is not an integer"), std::string::npos) << e;
  e = error_of("zipage", {{"window", "0"}});
  EXPECT_NE(e.find("out of range"), std::string::npos) << e;
  e = error_of("zipage", {{"redundancy", "fast"}});
  EXPECT_NE(e.find("none|flash|lightning"), std::string::npos) << e;
  e = error_of("zipage", {{"global", "maybe"}});
  EXPECT_NE(e.find("0|1"), std::string::npos) << e;
  e = error_of("zipage", {{"lambda", "1.5"}});
  EXPECT_NE(e.find("lambda=1.5"), std::string::npos) << e;
  e = error_of("snapkv", {{"kernel", "4"}});
  EXPECT_NE(e.find("kernel=4 must be odd"), std::string::npos) << e;
  e = error_of("zipage", {{"global", "1"}, {"alpha", "0"}});
  EXPECT_NE(e.find("alpha"), std::string::npos) << e;
  // Booleans accept the usual spellings.
  EXPECT_FALSE(make("zipage", {{"global", "off"}})->needs().global_scores);
  EXPECT_TRUE(make("zipage-attn", {{"global", "true"}})->needs().global_scores);
}

TEST(PolicyRegistry, BudgetChecks) {
  auto z = make("zipage");
  EXPECT_TRUE(z->check_budget(32, 16).is_ok());  // N_max = 3, k = 32 > w = 16
  Status st = z->check_budget(8, 16);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("at least one block"), std::string::npos) << st.message();
  st = z->check_budget(16, 16);  // k = 16 = w: nothing left to choose
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("always protects"), std::string::npos) << st.message();
  // A recent window counts as protected too: 64 kept entries, 64 recent ones.
  EXPECT_TRUE(make("zipage", {{"recent", "48"}})->check_budget(64, 16).is_ok());
  st = make("zipage", {{"recent", "64"}})->check_budget(64, 16);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("not more than the 64"), std::string::npos) << st.message();
  st = make("zipage", {{"window", "32"}})->check_budget(256, 16);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("larger than the block size"), std::string::npos) << st.message();
  EXPECT_TRUE(make("snapkv")->check_budget(33, 16).is_ok());
  EXPECT_FALSE(make("snapkv")->check_budget(32, 16).is_ok());
  EXPECT_TRUE(make("streaming")->check_budget(16, 16).is_ok());
  EXPECT_FALSE(make("streaming", {{"sinks", "16"}})->check_budget(16, 16).is_ok());
}

TEST(PolicyOptions, ParseKeyValue) {
  PolicyOptionMap m;
  EXPECT_TRUE(parse_policy_option("window=16", &m).is_ok());
  EXPECT_EQ(m["window"], "16");
  EXPECT_TRUE(parse_policy_option("a=b=c", &m).is_ok());
  EXPECT_EQ(m["a"], "b=c");
  for (const char* bad : {"window", "=3", "window=", ""}) {
    Status st = parse_policy_option(bad, &m);
    EXPECT_FALSE(st.is_ok()) << bad;
    EXPECT_NE(st.message().find("key=value"), std::string::npos);
  }
}

TEST(PolicyRegistry, KnormScoresKeyNormsWithoutQueries) {
  auto p = make("knorm");
  EXPECT_EQ(p->trigger(), CompressionTrigger::kCacheFull);
  const ScoreRecipe& r = p->score_recipe();
  EXPECT_EQ(r.scorer, Scorer::kKeyNorm);
  EXPECT_EQ(r.window, 16);
  EXPECT_EQ(r.num_sinks, 0);
  EXPECT_EQ(r.redundancy, RedundancyMode::kNone);
  EXPECT_EQ(r.pool_kernel, 0);
  EXPECT_FLOAT_EQ(r.global_decay, 0.0f);
  EXPECT_FALSE(r.needs_queries());
  EXPECT_FALSE(p->needs().window_queries);
  EXPECT_FALSE(p->needs().global_scores);
  // No queries, so the protected window is not bounded by the block size; it must leave
  // something to select: 16 + 2 sinks protected, budget 16 at b = 16 keeps k = 16.
  EXPECT_TRUE(make("knorm", {{"window", "32"}})->check_budget(64, 16).is_ok());
  EXPECT_FALSE(make("knorm", {{"sinks", "2"}})->check_budget(16, 16).is_ok());
  EXPECT_TRUE(make("knorm", {{"window", "0"}})->check_budget(16, 16).is_ok());
  EXPECT_NE(error_of("knorm", {{"window", "-1"}}).find("window"), std::string::npos);
}

// The built-in triggers, as every policy runs them by default (KVPolicy::compression_due and
// capture_from): zipage's cache-full rule and snapkv's one-off prefill rule.
TEST(PolicyRegistry, BuiltinTriggersDecideFromTheTriggerState) {
  TriggerState s;
  s.block_size = 4;
  s.max_blocks = 3;  // compress at 12 entries
  s.budget = 8;
  s.window = 2;
  auto zipage = make("zipage", {{"window", "2"}});
  s.entries = 11;
  s.entries_after_known = 12;
  s.tokens_pending = true;
  EXPECT_FALSE(zipage->compression_due(s).compress);
  EXPECT_EQ(zipage->capture_from(s), 10);
  s.entries = 12;
  s.tokens_pending = false;
  EXPECT_TRUE(zipage->compression_due(s).compress);
  EXPECT_FALSE(zipage->compression_due(s).prefill_checked);
  s.entries_after_known = 30;  // a prompt overshooting N_max blocks: its last w entries
  EXPECT_EQ(zipage->capture_from(s), 28);
  s.window = 0;  // knorm and streaming need no queries
  EXPECT_EQ(make("knorm")->capture_from(s), -1);
  EXPECT_TRUE(make("knorm")->compression_due(s).compress);

  auto snap = make("snapkv", {{"window", "2"}});
  s.window = 2;
  s.entries = s.entries_after_known = 30;
  s.tokens_pending = true;  // still prefilling: no decision yet
  EXPECT_FALSE(snap->compression_due(s).prefill_checked);
  EXPECT_EQ(snap->capture_from(s), 28);
  s.tokens_pending = false;
  TriggerDecision d = snap->compression_due(s);
  EXPECT_TRUE(d.compress);
  EXPECT_TRUE(d.prefill_checked);
  s.prefill_checked = true;  // decided once
  EXPECT_FALSE(snap->compression_due(s).compress);
  EXPECT_EQ(snap->capture_from(s), -1);
  s.prefill_checked = false;
  s.entries = s.entries_after_known = 8;  // within the budget: checked, not compressed
  d = snap->compression_due(s);
  EXPECT_FALSE(d.compress);
  EXPECT_TRUE(d.prefill_checked);
  EXPECT_EQ(snap->capture_from(s), -1);
  EXPECT_FALSE(make("full")->compression_due(s).compress);
  EXPECT_EQ(make("full")->capture_from(s), -1);
}

// Prefill chunk compression: which policies take the option and their defaults, the threshold
// each trigger compresses a chunk at, and the chunk rules (policy/triggers.h).
TEST(PolicyRegistry, PrefillChunkCompressionRules) {
  // On where the paper evicts while the prompt is processed (KeyDiff, Fast KVzip; TANGRAM compresses
  // each prefill chunk as produced), off elsewhere. KVzip takes no chunks: its reconstruction
  // scores an uncompressed context.
  for (const PolicyInfo& info : reg().policies()) {
    auto p = make(info.name);
    const bool budgeted = p->compresses() && p->takes_budget() && info.name != "kvzip";
    EXPECT_EQ(p->supports_prefill_chunk_compression(), budgeted) << info.name;
    if (!budgeted) continue;
    const bool on = info.name == "keydiff" || info.name == "fastkvzip" || info.name == "tangram";
    EXPECT_EQ(p->options().get_bool(kPrefillChunkCompressionOption), on) << info.name;
    // Cache-full triggers compress a chunk at N_max * b - 1 = 79, prefill-end ones at the budget
    // (times 1 + chunk_slack, default 0).
    const int prefill_end = 64;
    EXPECT_EQ(p->prefill_chunk_threshold(64, 5, 16),
              on ? (p->trigger() == CompressionTrigger::kCacheFull ? 79 : prefill_end) : -1)
        << info.name;
  }
  EXPECT_EQ(make("snapkv", {{"prefill_chunk_compression", "1"}})->prefill_chunk_threshold(64, 0, 16), 64);
  EXPECT_EQ(make("snapkv", {{"prefill_chunk_compression", "1"}, {"chunk_slack", "0.5"}})->prefill_chunk_threshold(64, 0, 16), 96);
  EXPECT_EQ(make("tangram", {{"chunk_slack", "1"}})->prefill_chunk_threshold(64, 0, 16), 128);
  EXPECT_EQ(make("tangram", {{"chunk_slack", "0.25"}})->prefill_chunk_threshold(100, 0, 16), 125);
  EXPECT_NE(error_of("tangram", {{"chunk_slack", "-1"}}).find("chunk_slack"), std::string::npos);
  // SnapKV pools at every compression: a prompt compressed chunk by chunk pools at its last one too.
  EXPECT_FALSE(make("tangram")->score_recipe().pool_first_only);
  EXPECT_FALSE(make("snapkv")->score_recipe().pool_first_only);
  EXPECT_EQ(make("zipage", {{"prefill_chunk_compression", "1"}})->prefill_chunk_threshold(64, 5, 16), 79);
  EXPECT_NE(error_of("kvllm", {{"prefill_chunk_compression", "1"}}).find("prefill_chunk_compression"),
            std::string::npos);

  TriggerState s;
  s.block_size = 16;
  s.window = 8;
  s.chunk_threshold = 64;
  s.tokens_pending = true;
  s.entries_after_known = 300;  // the prompt's end
  // The chunk rule applies only while tokens are pending and the option is on.
  EXPECT_TRUE(prefill_chunk_applies(s));
  s.entries = 64;
  EXPECT_FALSE(prefill_chunk_due(s).compress);  // not above the threshold
  s.entries = 90;
  EXPECT_TRUE(prefill_chunk_due(s).compress);
  s.computed_from = 85;  // its window would reach into prefix-cache hits: not yet
  EXPECT_FALSE(prefill_chunk_due(s).compress);
  s.computed_from = 0;
  // Capture: the chunk's last w queries, when the chunk ends above T - w and is not the last.
  s.entries = 40;
  s.chunk_end = 56;  // ends at T - w: captures nothing of its own
  EXPECT_EQ(prefill_chunk_capture_from(s, 292), 292);
  s.chunk_end = 80;
  EXPECT_EQ(prefill_chunk_capture_from(s, 292), 72);
  s.chunk_end = 300;  // the prompt's last chunk: the policy's own rule
  EXPECT_EQ(prefill_chunk_capture_from(s, 292), 292);
  s.chunk_end = -1;   // unknown: the one-token chunk
  s.entries = 64;
  EXPECT_EQ(prefill_chunk_capture_from(s, 292), 57);
  s.entries_after_known = 60;  // no compression ahead in the prompt: the policy's own rule
  s.entries = 40;
  s.chunk_end = 50;
  EXPECT_EQ(prefill_chunk_capture_from(s, -1), -1);
  s.tokens_pending = false;  // decoding: the policy's own trigger
  s.entries_after_known = 300;
  EXPECT_FALSE(prefill_chunk_applies(s));
  EXPECT_EQ(prefill_chunk_capture_from(s, 292), 292);
  s.tokens_pending = true;
  s.chunk_threshold = -1;  // off
  EXPECT_FALSE(prefill_chunk_applies(s));
  EXPECT_FALSE(prefill_chunk_due(s).compress);
}

// chunk_score: a prompt's intermediate chunks are scored without the question (tangram: KeyDiff by
// default), its end by the policy's own window attention; `window` keeps one recipe throughout.
TEST(PolicyRegistry, ChunkScoreRecipes) {
  auto tangram = make("tangram");
  EXPECT_EQ(tangram->options().get(kChunkScoreOption), "keydiff");
  EXPECT_EQ(tangram->score_recipe().scorer, Scorer::kAttention);
  EXPECT_EQ(tangram->chunk_score_recipe().scorer, Scorer::kKeyDiff);
  // Everything but the base score is the window's recipe: protection and pooling alike.
  EXPECT_EQ(tangram->chunk_score_recipe().window, tangram->score_recipe().window);
  EXPECT_EQ(tangram->chunk_score_recipe().pool_kernel, 7);
  EXPECT_FALSE(tangram->chunk_score_recipe().pool_first_only);
  EXPECT_TRUE(tangram->needs().window_queries);  // the prompt's end still reads its window
  EXPECT_EQ(make("tangram", {{"chunk_score", "knorm"}})->chunk_score_recipe().scorer, Scorer::kKeyNorm);
  EXPECT_EQ(make("tangram", {{"chunk_score", "window"}})->chunk_score_recipe().scorer, Scorer::kAttention);
  for (const std::string name : {"snapkv", "adakv"}) {
    auto p = make(name);
    EXPECT_EQ(p->options().get(kChunkScoreOption), "window") << name;
    EXPECT_EQ(p->chunk_score_recipe().scorer, Scorer::kAttention) << name;
    EXPECT_EQ(make(name, {{"chunk_score", "keydiff"}})->chunk_score_recipe().scorer, Scorer::kKeyDiff) << name;
  }
  // adakv's chunks keep its runtime allocation.
  EXPECT_EQ(make("adakv", {{"chunk_score", "keydiff"}})->chunk_score_recipe().allocation, KeepAllocation::kLayer);
  // Policies without the option score every compression with one recipe.
  auto keydiff = make("keydiff");
  EXPECT_EQ(&keydiff->chunk_score_recipe(), &keydiff->score_recipe());
  const std::string bad = error_of("tangram", {{"chunk_score", "question"}});
  EXPECT_NE(bad.find("chunk_score"), std::string::npos) << bad;
}

}  // namespace
}  // namespace origami
